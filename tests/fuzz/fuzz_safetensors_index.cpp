// Feeds a model.safetensors.index.json text to the index reader, then opens a scratch model directory with it: two
// shards inside, one more safetensors file beside the directory. Refusals naming the index or a shard are expected;
// a shard that is not a plain file name, a tensor read from outside the directory, any other escape or a crash is a
// finding.
#include "io/safetensors.h"
#include "util/error.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace {

namespace fs = std::filesystem;
using peregrine::write_file;

// A safetensors file of F32 tensors of 2 values each.
void write_shard(const fs::path& file, const std::vector<std::string>& names) {
    nlohmann::json h;
    for (size_t i = 0; i < names.size(); ++i)
        h[names[i]] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8 * i, 8 * i + 8}}};
    const std::string header = h.dump();
    std::string b(8, '\0');
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
    b += header + std::string(8 * names.size(), '\0');
    write_file(file.string(), b.data(), b.size());
}

struct Scratch {
    fs::path root, model;
    Scratch() {
        std::string t = (fs::temp_directory_path() / "peregrine-fuzz-index-XXXXXX").string();
        if (!mkdtemp(t.data())) std::abort();
        root = t;
        model = root / "model";
        fs::create_directory(model);
        write_shard(model / "model-00001-of-00002.safetensors", {"embed.weight", "norm.weight"});
        write_shard(model / "model-00002-of-00002.safetensors", {"head.weight"});
        write_shard(root / "outside.safetensors", {"outside.weight"});
    }
    ~Scratch() {
        std::error_code ec;
        fs::remove_all(root, ec);
    }
    static const Scratch& scratch();
};
const Scratch& Scratch::scratch() {
    static const Scratch s;
    return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    const Scratch& s = Scratch::scratch();
    const std::string text(reinterpret_cast<const char*>(data), size);
    static const std::string separators("/\\\0", 3);
    try {
        for (auto& [name, shard] : parse_safetensors_index(text, "model.safetensors.index.json"))
            if (shard.empty() || shard == "." || shard == ".." || shard.find_first_of(separators) != shard.npos)
                std::abort();  // a path out of the model directory got through
    } catch (const Error&) {
        return 0;
    }
    write_file((s.model / "model.safetensors.index.json").string(), data, size);
    try {
        SafeTensors st = SafeTensors::open_dir(s.model.string());
        const std::string inside = s.model.string() + "/";
        for (auto& [name, t] : st.tensors())
            if (t.file->compare(0, inside.size(), inside) != 0 || t.file->find('/', inside.size()) != std::string::npos)
                std::abort();  // read from outside the model directory
    } catch (const Error&) {
    }
    return 0;
}
