// Checkpoint loading: both released config layouts, and clear errors naming tensor and file.
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "util/error.h"
#include "util/file.h"

#include <filesystem>
#include <functional>
#include <unistd.h>
#include <cstring>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace peregrine;
namespace fs = std::filesystem;

namespace {

std::string fixture(const char* name) { return std::string(PEREGRINE_TEST_DATA) + "/" + name; }

// A scratch copy of a fixture whose files the test may rewrite.
struct ScratchModel {
    fs::path dir;
    explicit ScratchModel(const char* name) {
        dir = fs::temp_directory_path() / ("peregrine-test-" + std::to_string(::getpid()) + "-" + name);
        fs::remove_all(dir);
        fs::copy(fixture(name), dir, fs::copy_options::recursive);
        for (auto& e : fs::recursive_directory_iterator(dir))
            fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    }
    ~ScratchModel() { fs::remove_all(dir); }
};

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Rewrites one tensor's header entry of a safetensors file (same payload).
void patch_header(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
    std::string b = read_file(file.string());
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
    auto h = nlohmann::json::parse(b.substr(8, n));
    edit(h);
    std::string hs = h.dump();
    hs.resize(std::max(hs.size(), static_cast<size_t>(n)), ' ');
    ASSERT_EQ(hs.size(), n) << "patched header must keep its length";
    std::string out = b.substr(0, 8) + hs + b.substr(8 + n);
    write_file(file.string(), out.data(), out.size());
}

}  // namespace

TEST(Config, ReadsBothReleasedLayouts) {
    ModelConfig a = load_model_config(fixture("dsv41-tiny-a"));
    EXPECT_EQ(a.arch, ModelArch::DeepseekV41);
    EXPECT_STREQ(model_variant(a).name(), "DeepSeek-V4.1");
    EXPECT_EQ(a.dim, 128);
    EXPECT_EQ(a.weight_block, 32);
    EXPECT_EQ(a.kv_source_layers, (std::vector<int>{1, 3}));
    EXPECT_EQ(a.candidate_topk_blocks, 3);
    EXPECT_EQ(a.n_mtp_layers, 2);
    ModelConfig b = load_model_config(fixture("dsv4-tiny-a"));
    EXPECT_EQ(b.arch, ModelArch::DeepseekV4);
    EXPECT_EQ(model_format(b).single_pass_mhc, false);
    EXPECT_EQ(b.weight_block, 128);
    EXPECT_EQ(b.act_block, 128);
    EXPECT_EQ(b.n_hash_layers, 1);
    EXPECT_EQ(b.compress_ratios, (std::vector<int>{0, 4, 128}));
}

// The config.json written for a configuration reads back as exactly it, in the release's layout (V4.1 nested under
// text_config, V4 flat): the fixtures carry engram, DSpark and hash-routing keys.
TEST(Config, WrittenConfigReadsBack) {
    for (const char* name : {"dsv41-tiny-a", "dsv4-tiny-a", "dsv4-tiny-b"}) {
        const ModelConfig c = load_model_config(fixture(name));
        const std::string text = model_config_json(c);
        EXPECT_TRUE(parse_model_config(text) == c) << name;
        const auto j = nlohmann::json::parse(text);
        const auto orig = nlohmann::json::parse(read_file(fixture(name) + "/config.json"));
        EXPECT_EQ(j["model_type"], orig["model_type"]) << name;
        EXPECT_EQ(j.contains("text_config"), orig.contains("text_config")) << name;
        EXPECT_EQ(j["quantization_config"]["weight_block_size"], orig["quantization_config"]["weight_block_size"]);
    }
    ModelConfig c = load_model_config(fixture("dsv41-tiny-a"));
    ModelConfig d = c;
    d.engram_num_embeddings[1] += 1;
    EXPECT_FALSE(d == c) << "configurations differing in one field compare unequal";
    d = c;
    d.n_hash_layers = 1;  // V4.1 has no key for it: refused rather than written wrong
    EXPECT_NE(error_of([&] { model_config_json(d); }).find("cannot express"), std::string::npos);
}

TEST(Config, RefusesUnknownArchitectures) {
    std::string msg =
        error_of([] { parse_model_config(R"({"model_type":"llama","architectures":["LlamaForCausalLM"]})"); });
    EXPECT_NE(msg.find("unsupported architecture"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
    EXPECT_NE(error_of([] { parse_model_config("{not json"); }).find("not valid JSON"), std::string::npos);
}

TEST(Checkpoint, MissingTensorIsNamed) {
    ScratchModel m("dsv41-tiny-a");
    patch_header(m.dir / "model.safetensors", [](nlohmann::json& h) {
        h["layers.2.attn.wq_b.weighX"] = h["layers.2.attn.wq_b.weight"];
        h.erase("layers.2.attn.wq_b.weight");
    });
    std::string msg = error_of([&] { Model::load(m.dir.string()); });
    EXPECT_NE(msg.find("missing tensor 'layers.2.attn.wq_b.weight'"), std::string::npos) << msg;
}

TEST(Checkpoint, WrongDtypeAndShapeNameTensorAndFile) {
    ScratchModel m("dsv4-tiny-a");
    patch_header(m.dir / "model.safetensors",
                 [](nlohmann::json& h) { h["layers.1.attn_norm.weight"]["dtype"] = "F16"; });
    std::string msg = error_of([&] { Model::load(m.dir.string()); });
    EXPECT_NE(msg.find("layers.1.attn_norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;

    ScratchModel m2("dsv4-tiny-a");
    patch_header(m2.dir / "model.safetensors", [](nlohmann::json& h) {
        auto& t = h["layers.0.attn.wkv.weight"];
        t["shape"] = {256, 128};  // same byte count, wrong shape
    });
    msg = error_of([&] { Model::load(m2.dir.string()); });
    EXPECT_NE(msg.find("layers.0.attn.wkv.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
}

TEST(Checkpoint, TruncatedFileIsRefused) {
    ScratchModel m("dsv41-tiny-a");
    fs::resize_file(m.dir / "model.safetensors", fs::file_size(m.dir / "model.safetensors") - 1000);
    std::string msg = error_of([&] { SafeTensors::open_dir(m.dir.string()); });
    EXPECT_NE(msg.find("outside the payload"), std::string::npos) << msg;
}

TEST(Checkpoint, ShardedIndexIsFollowed) {
    ScratchModel m("dsv41-tiny-a");
    // Split: move the file under a shard name and list every tensor in an index.
    fs::rename(m.dir / "model.safetensors", m.dir / "model-00001-of-00001.safetensors");
    SafeTensors one;
    one.add_file((m.dir / "model-00001-of-00001.safetensors").string());
    nlohmann::json idx;
    for (auto& [name, t] : one.tensors()) idx["weight_map"][name] = "model-00001-of-00001.safetensors";
    std::string s = idx.dump();
    write_file((m.dir / "model.safetensors.index.json").string(), s.data(), s.size());
    auto model = Model::load(m.dir.string());
    EXPECT_EQ(model->config().n_layers, 6);
}

// Every rank of a server loads the same checkpoint: they share one map of each file (what is pinned for the GPUs is
// pinned once); another copy of the files, or a file rewritten since, is mapped on its own.
TEST(Checkpoint, LoadsOfTheSameFilesShareOneMap) {
    const std::string name = "layers.0.attn.wkv.weight";
    SafeTensors a = SafeTensors::open_dir(fixture("dsv41-tiny-a"));
    SafeTensors b = SafeTensors::open_dir(fixture("dsv41-tiny-a"));
    EXPECT_EQ(a.require(name).data, b.require(name).data);
    ScratchModel m("dsv41-tiny-a");
    SafeTensors c = SafeTensors::open_dir(m.dir.string());
    EXPECT_NE(c.require(name).data, a.require(name).data);
    EXPECT_EQ(std::memcmp(c.require(name).data, a.require(name).data, a.require(name).nbytes), 0);
    fs::resize_file(m.dir / "model.safetensors", fs::file_size(m.dir / "model.safetensors") + 4096);
    SafeTensors d = SafeTensors::open_dir(m.dir.string());
    EXPECT_NE(d.require(name).data, c.require(name).data);
}

// Values that once crashed or hung the server at its first request are refused at load, naming the key.
TEST(Config, OutOfRangeValuesAreNamed) {
    const std::string base = read_file(fixture("dsv4-tiny-a") + "/config.json");
    struct Case {
        const char* key;
        nlohmann::json value;
        const char* says;
    };
    for (const Case& c : std::vector<Case>{{"sliding_window", 0, "sliding_window"},
                                           {"index_topk", -1, "index_topk"},
                                           {"rms_norm_eps", -1.0, "rms_norm_eps"},
                                           {"rope_theta", 0, "rope_theta"},
                                           {"hc_sinkhorn_iters", 1000000000, "hc_sinkhorn_iters"},
                                           {"eos_token_id", 100000, "eos_token_id"},
                                           {"hidden_size", 1 << 20, "hidden_size"},
                                           {"moe_intermediate_size", 1 << 20, "moe_intermediate_size"},
                                           {"n_routed_experts", 1 << 20, "n_routed_experts"},
                                           {"vocab_size", 1 << 30, "vocab_size"}}) {
        auto j = nlohmann::json::parse(base);
        j[c.key] = c.value;
        std::string msg = error_of([&] { parse_model_config(j.dump()); });
        EXPECT_NE(msg.find(c.says), std::string::npos) << c.key << ": " << msg;
    }
    EXPECT_EQ(error_of([&] { parse_model_config(base); }), "");
}

// Integers out of their type's range or with a fraction are refused naming the key, never converted (3e24 to int
// is undefined behaviour); found by tests/fuzz/fuzz_config.
TEST(Config, NonIntegerValuesAreNamed) {
    const std::string base = read_file(fixture("dsv4-tiny-a") + "/config.json");
    const std::vector<std::pair<const char*, nlohmann::json>> cases = {
        {"hidden_size", 3e24},
        {"hidden_size", 4096.5},
        {"num_hidden_layers", int64_t{1} << 40},
        {"vocab_size", uint64_t{1} << 63},
        {"compress_ratios", nlohmann::json::array({4, 1e30})}};
    for (auto& [key, value] : cases) {
        auto j = nlohmann::json::parse(base);
        j[key] = value;
        std::string msg = error_of([&] { parse_model_config(j.dump()); });
        EXPECT_NE(msg.find(std::string("'") + key + "' has the wrong type: an integer in range is needed"),
                  std::string::npos)
            << key << " " << value.dump() << ": " << msg;
    }
    auto j = nlohmann::json::parse(base);
    j["hidden_size"] = j["hidden_size"].get<double>();  // 256.0 is an integer
    EXPECT_EQ(error_of([&] { parse_model_config(j.dump()); }), "");
}

TEST(Checkpoint, ShardPathsStayInTheModelDirectory) {
    ScratchModel m("dsv41-tiny-a");
    nlohmann::json idx;
    idx["weight_map"]["embed.weight"] = "../../../../etc/passwd";
    std::string s = idx.dump();
    write_file((m.dir / "model.safetensors.index.json").string(), s.data(), s.size());
    std::string msg = error_of([&] { SafeTensors::open_dir(m.dir.string()); });
    EXPECT_NE(msg.find("must name a shard file in the model directory"), std::string::npos) << msg;
}

// The index alone: every way out of the directory is refused naming the index and the entry.
TEST(Checkpoint, IndexShardNamesArePlainFileNames) {
    for (const char* shard : {"../../etc/passwd", "/etc/passwd", "..\\x.safetensors", ".", "..", ""}) {
        nlohmann::json idx;
        idx["weight_map"]["embed.weight"] = shard;
        std::string msg = error_of([&] { parse_safetensors_index(idx.dump(), "index.json"); });
        EXPECT_NE(msg.find("'index.json': weight_map entry 'embed.weight' must name a shard file"), std::string::npos)
            << shard << ": " << msg;
    }
    // A NUL would cut the path where open() reads it: "a\0x" opened "a".
    std::string msg = error_of([] {
        parse_safetensors_index(R"({"weight_map": {"w": "model.safetensors\u0000x"}})", "index.json");
    });
    EXPECT_NE(msg.find("must name a shard file"), std::string::npos) << msg;
    EXPECT_NE(error_of([] { parse_safetensors_index(R"([{"weight_map": {}}])", "index.json"); }).find("no weight_map"),
              std::string::npos);
    auto m = parse_safetensors_index(R"({"metadata": {}, "weight_map": {"a": "s1", "b": "s2"}})", "index.json");
    EXPECT_EQ(m, (std::map<std::string, std::string>{{"a", "s1"}, {"b", "s2"}}));
}

TEST(Checkpoint, IndexNamingTheWrongShardIsRefused) {
    ScratchModel m("dsv41-tiny-a");
    fs::rename(m.dir / "model.safetensors", m.dir / "model-00001-of-00002.safetensors");
    write_file((m.dir / "model-00002-of-00002.safetensors").string(), "\2\0\0\0\0\0\0\0{}", 10);  // no tensors
    nlohmann::json idx;
    idx["weight_map"]["embed.weight"] = "model-00002-of-00002.safetensors";  // it is in the first
    idx["weight_map"]["norm.weight"] = "model-00001-of-00002.safetensors";
    std::string s = idx.dump();
    write_file((m.dir / "model.safetensors.index.json").string(), s.data(), s.size());
    std::string msg = error_of([&] { SafeTensors::open_dir(m.dir.string()); });
    EXPECT_NE(msg.find("'embed.weight' is listed in"), std::string::npos) << msg;
    EXPECT_NE(msg.find("under 'model-00002-of-00002.safetensors' but lives in"), std::string::npos) << msg;
}

// A shard the index lists but the directory lacks is named before anything loads.
TEST(Checkpoint, MissingShardIsNamed) {
    ScratchModel m("dsv41-tiny-a");
    fs::rename(m.dir / "model.safetensors", m.dir / "model-00001-of-00002.safetensors");
    nlohmann::json idx;
    idx["weight_map"]["embed.weight"] = "model-00001-of-00002.safetensors";
    idx["weight_map"]["norm.weight"] = "model-00002-of-00002.safetensors";  // never written
    std::string s = idx.dump();
    write_file((m.dir / "model.safetensors.index.json").string(), s.data(), s.size());
    std::string msg = error_of([&] { SafeTensors::open_dir(m.dir.string()); });
    EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
}

// Ids of a V4.1 configuration that the runtime indexes with are refused at load, naming the key (a candidate
// block of 0 divided by zero, a compressed engram vocabulary of 0 too, a DSpark target beyond the layers read
// outside the hidden states); keys of the wrong JSON type are named, never a library exception. Each case is also
// in tests/fuzz/corpus/model_config.
TEST(Config, IdsOutOfRangeAreNamed) {
    const std::string base = read_file(fixture("dsv41-tiny-a") + "/config.json");
    struct Case {
        const char* key;
        nlohmann::json value;
        const char* says;
    };
    for (const Case& c : std::vector<Case>{{"engram_compressed_vocab_size", 0, "engram_compressed_vocab_size"},
                                           {"engram_pad_token_id", 1000, "engram_pad_token_id"},
                                           {"engram_layer_ids", {1, 99}, "engram_layer_ids"},
                                           {"engram_layer_ids", {4, 4}, "engram_layer_ids"},
                                           {"engram_vocab_size", int64_t{1} << 62, "engram_vocab_size"},
                                           {"engram_num_embeddings", {1000, 8.3e26},
                                            "'engram_num_embeddings' has the wrong type: an integer in range"},
                                           {"engram_head_dim", 33, "engram_head_dim"},
                                           {"dspark_target_layer_ids", {3, 4, 50}, "dspark_target_layer_ids"},
                                           {"dspark_target_layer_ids", {3, 3, 5}, "dspark_target_layer_ids"},
                                           {"dspark_noise_token_id", -1, "dspark_noise_token_id"},
                                           {"dspark_block_size", -3, "dspark_block_size"},
                                           {"candidate_block_size", 0, "candidate_block_size"},
                                           {"candidate_source_layer_id", 6, "candidate_source_layer_id"},
                                           {"kv_source_layer_ids", {1, 1, 3}, "kv_source_layer_ids"}}) {
        auto j = nlohmann::json::parse(base);
        j["text_config"][c.key] = c.value;
        std::string msg = error_of([&] { parse_model_config(j.dump()); });
        EXPECT_NE(msg.find(c.says), std::string::npos) << c.key << " " << c.value.dump() << ": " << msg;
    }
    for (const Case& c : std::vector<Case>{{"image_token_id", 3e24, "'image_token_id' has the wrong type"},
                                           {"image_token_id", "255", "'image_token_id' has the wrong type"},
                                           {"text_config", 5, "without a text_config object"}}) {
        auto j = nlohmann::json::parse(base);
        j[c.key] = c.value;
        std::string msg = error_of([&] { parse_model_config(j.dump()); });
        EXPECT_NE(msg.find(c.says), std::string::npos) << c.key << " " << c.value.dump() << ": " << msg;
    }
    auto j = nlohmann::json::parse(base);
    j["text_config"].erase("bos_token_id");
    j["bos_token_id"] = 3;  // beside text_config, as some releases put it
    EXPECT_EQ(parse_model_config(j.dump()).bos_token_id, 3);
    EXPECT_NE(error_of([] { parse_model_config(R"({"model_type": 41, "architectures": [1, null]})"); })
                  .find("model_type '41', architectures '1,null'"),
              std::string::npos);
    auto v4 = nlohmann::json::parse(read_file(fixture("dsv4-tiny-a") + "/config.json"));
    v4["num_hash_layers"] = -1;
    EXPECT_NE(error_of([&] { parse_model_config(v4.dump()); }).find("num_hash_layers"), std::string::npos);
}

TEST(Checkpoint, OverlappingTensorsAreRefused) {
    ScratchModel m("dsv4-tiny-a");
    patch_header(m.dir / "model.safetensors", [](nlohmann::json& h) {
        // Two same-sized tensors: the second now points at the first's bytes.
        h["layers.1.attn_norm.weight"]["data_offsets"] = h["layers.0.attn_norm.weight"]["data_offsets"];
    });
    std::string msg = error_of([&] { SafeTensors::open_dir(m.dir.string()); });
    EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}
