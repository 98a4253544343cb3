#include "io/safetensors.h"
#include "util/error.h"

#include <nlohmann/json.hpp>

namespace peregrine {

using json = nlohmann::json;

std::string shape_to_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    return s + "]";
}

int64_t TensorView::numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
}

std::string TensorView::shape_str() const { return shape_to_string(shape); }

SafeTensors SafeTensors::open_dir(const std::string& dir) {
    SafeTensors st;
    st.dir_ = dir;
    std::string index = dir + "/model.safetensors.index.json";
    if (file_exists(index)) {
        json j;
        try {
            j = json::parse(read_file(index));
        } catch (const json::exception& e) {
            fail("'{}' is not valid JSON: {}", index, e.what());
        }
        if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail("'{}' has no weight_map", index);
        std::map<std::string, bool> shards;
        for (auto& [name, file] : j["weight_map"].items()) shards[file.get<std::string>()] = true;
        for (auto& [file, _] : shards) st.add_file(dir + "/" + file);
        for (auto& [name, file] : j["weight_map"].items())
            if (!st.has(name))
                fail("tensor '{}' is listed in '{}' but missing from '{}'", name, index, file.get<std::string>());
    } else if (file_exists(dir + "/model.safetensors")) {
        st.add_file(dir + "/model.safetensors");
    } else {
        fail("no model.safetensors or model.safetensors.index.json in '{}'", dir);
    }
    return st;
}

void SafeTensors::add_file(const std::string& path) {
    auto mf = std::make_unique<MappedFile>(path);
    const uint8_t* base = mf->data();
    size_t size = mf->size();
    if (size < 8) fail("'{}' is too small to be a safetensors file", path);
    uint64_t header_len = 0;
    for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(base[i]) << (8 * i);
    if (header_len > size - 8) fail("'{}': header length {} exceeds the file size {}", path, header_len, size);
    json header;
    try {
        header = json::parse(base + 8, base + 8 + header_len);
    } catch (const json::exception& e) {
        fail("'{}': header is not valid JSON: {}", path, e.what());
    }
    const uint8_t* payload = base + 8 + header_len;
    size_t payload_size = size - 8 - header_len;
    const std::string* file_name = &mf->path();
    for (auto& [name, info] : header.items()) {
        if (name == "__metadata__") continue;
        TensorView t;
        t.name = name;
        t.file = file_name;
        std::string dt = info.value("dtype", "");
        if (!dtype_from_name(dt, &t.dtype)) fail("tensor '{}' in '{}' has unsupported dtype '{}'", name, path, dt);
        for (auto& d : info.at("shape")) t.shape.push_back(d.get<int64_t>());
        auto offs = info.at("data_offsets");
        size_t begin = offs.at(0).get<size_t>(), end = offs.at(1).get<size_t>();
        if (begin > end || end > payload_size)
            fail("tensor '{}' in '{}' has data offsets [{}, {}) outside the payload of {} bytes", name, path, begin,
                 end, payload_size);
        t.data = payload + begin;
        t.nbytes = end - begin;
        if (static_cast<size_t>(t.numel()) * dtype_size(t.dtype) != t.nbytes)
            fail("tensor '{}' in '{}': {} bytes do not match shape {} of {}", name, path, t.nbytes, t.shape_str(), dt);
        if (tensors_.count(name)) fail("tensor '{}' appears twice ('{}' and '{}')", name, *tensors_[name].file, path);
        tensors_.emplace(name, std::move(t));
    }
    files_.push_back(std::move(mf));
}

const TensorView* SafeTensors::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& SafeTensors::require(const std::string& name) const {
    auto* t = find(name);
    if (!t) fail("checkpoint '{}' is missing tensor '{}'", dir_, name);
    return *t;
}

const TensorView& SafeTensors::require(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const {
    const TensorView& t = require(name);
    if (t.dtype != dtype)
        fail("tensor '{}' in '{}' has dtype {}, expected {}", name, *t.file, dtype_name(t.dtype), dtype_name(dtype));
    if (t.shape != shape)
        fail("tensor '{}' in '{}' has shape {}, expected {}", name, *t.file, t.shape_str(), shape_to_string(shape));
    return t;
}

}  // namespace peregrine
