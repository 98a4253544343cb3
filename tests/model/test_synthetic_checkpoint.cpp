// Synthetic checkpoints: written shard by shard, loaded by the normal loader, the same model as Model::synthetic
// bit for bit; the presets they are made from; synth-checkpoint's refusals.
#include "engine/sequence_runner.h"
#include "io/safetensors.h"
#include "model/fixture.h"
#include "model/model.h"
#include "model/synthetic_checkpoint.h"
#include "util/error.h"
#include "util/file.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <unistd.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace peregrine;
namespace fs = std::filesystem;

namespace {

struct ScratchDir {
    fs::path dir;
    explicit ScratchDir(const std::string& name) {
        dir = fs::temp_directory_path() / ("peregrine-synth-" + std::to_string(::getpid()) + "-" + name);
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    ~ScratchDir() { fs::remove_all(dir); }
};

// A fixture's configuration without engram tables (synthetic models have none); V4.1 keeps its DSpark head.
ModelConfig tiny_config(const std::string& fixture) {
    ModelConfig c = load_model_config(test::fixture_dir(fixture));
    const ModelConfig d;
    c.engram_layer_ids.clear();
    c.engram_num_embeddings.clear();
    c.engram_max_ngram_size = d.engram_max_ngram_size;
    c.engram_n_heads = d.engram_n_heads;
    c.engram_head_dim = d.engram_head_dim;
    c.engram_vocab_size = d.engram_vocab_size;
    c.engram_pad_id = d.engram_pad_id;
    c.engram_compressed_vocab_size = d.engram_compressed_vocab_size;
    return c;
}

// Logits of a prefill of 40 ids (every position) and 4 decode steps after it.
std::vector<float> run(Model& m) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 44; ++i) ids.push_back((i * 37 + 11) % m.config().vocab_size);
    SequenceRunner r(m, static_cast<int64_t>(ids.size()));
    std::vector<float> out = r.feed({ids.begin(), ids.begin() + 40}, 0, true);
    for (size_t i = 40; i < ids.size(); ++i) {
        auto step = r.feed({ids[i]}, 0, true);
        out.insert(out.end(), step.begin(), step.end());
    }
    return out;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Routed experts a short prompt may never reach, compared weight by weight between the two models.
int differing_experts(const Model& a, const Model& b) {
    int n = 0;
    for (size_t l = 0; l < a.weights().layers.size(); ++l) {
        const auto& ea = a.weights().layers[l].ffn.experts;
        const auto& eb = b.weights().layers[l].ffn.experts;
        for (size_t e = 0; e < ea.size(); ++e)
            for (auto m : {&ExpertWeight::w1, &ExpertWeight::w2, &ExpertWeight::w3})
                n += !same_tensor((ea[e].*m).w, (eb[e].*m).w) || !same_tensor((ea[e].*m).scale, (eb[e].*m).scale);
    }
    return n;
}

// Flips a bit of one tensor's first byte in its shard, as a writer that got one tensor wrong would leave it.
void corrupt_tensor(const fs::path& dir, const std::string& name) {
    auto index = nlohmann::json::parse(read_file((dir / "model.safetensors.index.json").string()));
    const fs::path shard = dir / index["weight_map"][name].get<std::string>();
    std::string b = read_file(shard.string());
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    auto header = nlohmann::json::parse(b.substr(8, n));
    const size_t at = 8 + n + header[name]["data_offsets"][0].get<size_t>();
    b[at] = static_cast<char>(b[at] ^ 0x08);  // an exponent bit of an e4m3 byte: another finite value
    write_file(shard.string(), b.data(), b.size());
}

class SyntheticCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(SyntheticCheckpoint, LoadsAsTheSyntheticModelBitForBit) {
    const ModelConfig cfg = tiny_config(GetParam());
    ScratchDir out(test::fixture_test_name(GetParam()));
    const size_t shard_bytes = 256 << 10;
    const SyntheticCheckpointPlan plan = plan_synthetic_checkpoint(cfg, 1, shard_bytes);
    ASSERT_GT(plan.shards.size(), 2u) << "a small shard size must split the model";
    write_synthetic_checkpoint(cfg, plan, out.dir.string());

    // The released layout: numbered shards of bounded size, an index naming every tensor, its total size.
    auto index = nlohmann::json::parse(read_file((out.dir / "model.safetensors.index.json").string()));
    EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), plan.total_bytes);
    EXPECT_EQ(index["weight_map"].size(), plan.n_tensors);
    const std::string last = plan.shards.back().file;
    EXPECT_EQ(last, fmt::format("model-{:05d}-of-{:05d}.safetensors", plan.shards.size(), plan.shards.size()));
    size_t tensor_bytes = 0;
    for (const auto& s : plan.shards) {
        SafeTensors st;
        st.add_file((out.dir / s.file).string());
        size_t bytes = 0;
        for (const auto& [name, t] : st.tensors()) {
            bytes += t.nbytes;
            EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << name << " is misaligned";
        }
        EXPECT_TRUE(bytes <= shard_bytes || st.tensors().size() == 1) << s.file << " holds " << bytes << " bytes";
        tensor_bytes += bytes;
    }
    EXPECT_EQ(tensor_bytes, plan.total_bytes);
    EXPECT_TRUE(load_model_config(out.dir.string()) == cfg) << "config.json must read back as the configuration";
    // Every stored tensor holds its generator's bytes, used by the prompt below or not.
    const SafeTensors st = SafeTensors::open_dir(out.dir.string());
    for (const SyntheticTensor& t : synthetic_inventory(cfg, 1)) {
        const TensorView* v = st.find(t.name);
        ASSERT_NE(v, nullptr) << t.name;
        EXPECT_TRUE(same_tensor(Tensor::view(v->dtype, v->shape, v->data), synthetic_tensor(cfg, t))) << t.name;
    }

    auto synthetic = Model::synthetic(cfg);
    const std::vector<float> want = run(*synthetic);
    auto loaded = Model::load(out.dir.string());
    EXPECT_TRUE(bit_identical(run(*loaded), want)) << "the written checkpoint is not the synthetic model";
    EXPECT_EQ(differing_experts(*loaded, *synthetic), 0);
    loaded.reset();

    // The comparison sees a single wrong tensor.
    corrupt_tensor(out.dir, "layers.0.attn.wq_a.weight");
    auto corrupted = Model::load(out.dir.string());
    EXPECT_FALSE(bit_identical(run(*corrupted), want)) << "a corrupted tensor went unnoticed";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SyntheticCheckpoint, ::testing::Values("dsv41-tiny-a", "dsv4-tiny-a"),
                         [](const auto& info) { return test::fixture_test_name(info.param); });

// The presets' config.json reads back as the preset at every size, so a written preset loads as serve --synthetic.
TEST(SyntheticPresets, ConfigJsonReadsBack) {
    for (int layers : {1, 2, 3, 4, 5, 6, 40})
        EXPECT_TRUE(parse_model_config(model_config_json(synthetic_preset_config("v41-flash", layers, 96))) ==
                    synthetic_preset_config("v41-flash", layers, 96))
            << layers;
    for (int layers : {1, 2, 3, 4, 43})
        EXPECT_TRUE(parse_model_config(model_config_json(synthetic_preset_config("v4-flash", layers))) ==
                    synthetic_preset_config("v4-flash", layers))
            << layers;
    EXPECT_EQ(synthetic_preset_config("v41-flash", 2).n_routed_experts, 384);
    EXPECT_EQ(synthetic_preset_config("v4-flash", 2).n_routed_experts, 256);
    EXPECT_EQ(synthetic_preset_config("v4-flash", 43).n_hash_layers, 3);
    EXPECT_THROW(synthetic_preset_config("v5-flash", 2), Error);
    EXPECT_THROW(synthetic_preset_config("v4-flash", 44), Error);
    // One field a release has no key for (V4.1's activation block is fixed) is refused, not written wrong.
    ModelConfig c = synthetic_preset_config("v41-flash", 2);
    c.act_block = 128;
    EXPECT_THROW(model_config_json(c), Error);
}

// The plan covers the model: 40 layers x 96 experts of V4.1-Flash, tens of GB, in shards of at most 4 GiB.
TEST(SyntheticCheckpointPlan, RealSizeSliceWithoutMakingIt) {
    const ModelConfig cfg = synthetic_preset_config("v41-flash", 40, 96);
    const SyntheticCheckpointPlan plan = plan_synthetic_checkpoint(cfg, 1, size_t{4} << 30);
    EXPECT_GT(plan.total_bytes, size_t{40} << 30);
    for (const auto& s : plan.shards) {
        EXPECT_LE(s.bytes, size_t{4} << 30) << s.file;
        if (&s != &plan.shards.back()) {
            EXPECT_GT(s.bytes, size_t{31} << 27) << s.file << " is far from full";
        }
    }
}

// synth-checkpoint refuses before writing anything.
std::string run_cli(const std::string& args, int* rc) {
    const std::string cmd = std::string(PEREGRINE_BINARY) + " synth-checkpoint " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    *rc = ::pclose(p);
    return out;
}

// V4.1-Flash's engram for synthetic models: layers 1 and 14 with the release's hashing and row counts; the layers
// read one table (made at the largest row count), and the model runs.
TEST(SyntheticEngram, TheReleasesLayersAndRowCounts) {
    ModelConfig c = synthetic_v41_flash_config(15, 8);
    add_synthetic_engram(c);
    EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1, 14}));
    EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
    ModelConfig one = synthetic_v41_flash_config(1, 8);
    EXPECT_THROW(add_synthetic_engram(one), Error);
}

TEST(SyntheticEngram, LayersShareOneTableAndRun) {
    ModelConfig c = load_model_config(test::fixture_dir("dsv41-tiny-a"));  // engram layers of their own sizes
    ASSERT_EQ(c.engram_layer_ids.size(), 2u);
    ASSERT_NE(c.engram_num_embeddings[0], c.engram_num_embeddings[1]);
    auto m = Model::synthetic(c);
    const EngramWeight& a = *m->weights().layers[static_cast<size_t>(c.engram_layer_ids[0])].engram;
    const EngramWeight& b = *m->weights().layers[static_cast<size_t>(c.engram_layer_ids[1])].engram;
    EXPECT_EQ(a.table.raw(), b.table.raw());
    EXPECT_EQ(a.table_scale.raw(), b.table_scale.raw());
    // One shape too (a backend copies a table once, keyed by its address): every row of the larger table.
    EXPECT_EQ(a.table.shape(), b.table.shape());
    EXPECT_EQ(a.table.dim(0), std::max(c.engram_num_embeddings[0], c.engram_num_embeddings[1]));
    const std::vector<float> logits = run(*m);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    // A checkpoint of it would write every table: synth-checkpoint refuses.
    EXPECT_THROW(synthetic_inventory(c, 1), Error);
}

TEST(SynthCheckpointCli, Refusals) {
    ScratchDir dir("cli");
    const std::string out = (dir.dir / "ckpt").string();
    int rc = 0;
    std::string msg = run_cli("--preset v5-flash --layers 2 --out " + out, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("unknown synthetic preset 'v5-flash' (known: v41-flash, v4-flash)"), std::string::npos) << msg;
    msg = run_cli("--preset v41-flash --layers 41 --out " + out, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("1..40 layers, not 41"), std::string::npos) << msg;
    msg = run_cli("--preset v4-flash --layers 0 --out " + out, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("1..43 layers, not 0"), std::string::npos) << msg;
    msg = run_cli("--preset v4-flash --layers 2 --experts 3 --out " + out, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("at least 6 routed experts"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(out)) << "refused before making --out";

    fs::create_directories(out);
    write_file(out + "/notes.txt", "x", 1);
    msg = run_cli("--preset v41-flash --layers 1 --experts 6 --out " + out, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("is not empty; give --force"), std::string::npos) << msg;
    write_file(dir.dir.string() + "/file", "x", 1);
    msg = run_cli("--preset v41-flash --layers 1 --out " + dir.dir.string() + "/file", &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("exists and is not a directory"), std::string::npos) << msg;
    if (::geteuid() != 0) {  // root writes anywhere
        fs::create_directories(dir.dir / "ro");
        fs::permissions(dir.dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
        msg = run_cli("--preset v41-flash --layers 1 --out " + (dir.dir / "ro").string(), &rc);
        EXPECT_NE(rc, 0);
        EXPECT_NE(msg.find("cannot write to --out"), std::string::npos) << msg;
        fs::permissions(dir.dir / "ro", fs::perms::owner_all);
    }
    msg = run_cli("--preset v41-flash --layers 1 --shard-size 4X --out " + out, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("--shard-size '4X'"), std::string::npos) << msg;
}

TEST(SynthCheckpointCli, RefusesWhatTheDiskCannotHold) {
    ScratchDir dir("space");
    const size_t need = plan_synthetic_checkpoint(synthetic_preset_config("v4-flash", 43, 2048), 1, size_t{4} << 30)
                            .total_bytes;
    if (fs::space(dir.dir).available > need) GTEST_SKIP() << "the disk holds " << need << " bytes";
    int rc = 0;
    const std::string out = (dir.dir / "big").string();
    const std::string msg = run_cli("--preset v4-flash --layers 43 --experts 2048 --out " + out, &rc);
    EXPECT_NE(rc, 0);
    EXPECT_NE(msg.find("the checkpoint needs " + fmt::format("{:.2f}", need / 1e9) + " GB and"), std::string::npos)
        << msg;
    EXPECT_FALSE(fs::exists(out)) << "refused before making --out";
}

}  // namespace
