#include "io/safetensors.h"
#include "util/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <set>

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

std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& path) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        fail("'{}' is not valid JSON: {}", path, e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        fail("'{}' has no weight_map", path);
    std::map<std::string, std::string> out;
    for (auto& [name, file] : j["weight_map"].items()) {
        // Shards are files of this directory: a path elsewhere (../.., /etc) is refused, not opened.
        const std::string f = file.is_string() ? file.get<std::string>() : "";
        if (f.empty() || f.find_first_of(std::string("/\\\0", 3)) != std::string::npos || f == "." || f == "..")
            fail("'{}': weight_map entry '{}' must name a shard file in the model directory, not {}", path, name,
                 file.dump());
        out.emplace(name, f);
    }
    return out;
}

SafeTensors SafeTensors::open_dir(const std::string& dir) {
    SafeTensors st;
    st.dir_ = dir;
    std::string index = dir + "/model.safetensors.index.json";
    if (file_exists(index)) {
        const std::map<std::string, std::string> weight_map = parse_safetensors_index(read_file(index), index);
        std::set<std::string> shards;
        for (auto& [name, shard] : weight_map) shards.insert(shard);
        for (auto& shard : shards) st.add_file(dir + "/" + shard);
        for (auto& [name, shard] : weight_map) {
            const TensorView* t = st.find(name);
            if (!t) fail("tensor '{}' is listed in '{}' but missing from '{}'", name, index, shard);
            // A tensor found in another shard than the index says means a mixed-up checkpoint.
            if (*t->file != dir + "/" + shard)
                fail("tensor '{}' is listed in '{}' under '{}' but lives in '{}'", name, index, shard, *t->file);
        }
    } else if (file_exists(dir + "/model.safetensors")) {
        st.add_file(dir + "/model.safetensors");
    } else {
        fail("no model.safetensors or model.safetensors.index.json in '{}'", dir);
    }
    return st;
}

void SafeTensors::add_file(const std::string& path) {
    auto mf = MappedFile::shared(path);
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
    std::vector<std::pair<size_t, size_t>> ranges;  // every tensor's bytes, to refuse overlaps
    for (auto& [name, info] : header.items()) {
        if (name == "__metadata__") continue;
        TensorView t;
        t.name = name;
        t.file = file_name;
        if (!info.is_object()) fail("tensor '{}' in '{}': its header entry is not an object", name, path);
        std::string dt = info.contains("dtype") && info["dtype"].is_string() ? info["dtype"].get<std::string>() : "";
        if (!dtype_from_name(dt, &t.dtype)) fail("tensor '{}' in '{}' has unsupported dtype '{}'", name, path, dt);
        const json shape = info.value("shape", json());
        const json offs = info.value("data_offsets", json());
        if (!shape.is_array() || !offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
            !offs[1].is_number_unsigned())
            fail("tensor '{}' in '{}' needs a shape list and two data_offsets", name, path);
        size_t numel = 1;
        for (auto& d : shape) {
            const uint64_t n = d.is_number_unsigned() ? d.get<uint64_t>() : UINT64_MAX;
            if (n == UINT64_MAX || (n != 0 && numel > (uint64_t{1} << 48) / n))  // not a size, or beyond any file
                fail("tensor '{}' in '{}' has an invalid shape {}", name, path, shape.dump());
            t.shape.push_back(static_cast<int64_t>(n));
            numel *= n;
        }
        size_t begin = offs[0].get<size_t>(), end = offs[1].get<size_t>();
        if (begin > end || end > payload_size)
            fail("tensor '{}' in '{}' has data offsets [{}, {}) outside the payload of {} bytes", name, path, begin,
                 end, payload_size);
        t.data = payload + begin;
        t.nbytes = end - begin;
        if (numel * dtype_size(t.dtype) != t.nbytes)
            fail("tensor '{}' in '{}': {} bytes do not match shape {} of {}", name, path, t.nbytes, t.shape_str(), dt);
        if (begin < end) ranges.emplace_back(begin, end);
        if (tensors_.count(name)) fail("tensor '{}' appears twice ('{}' and '{}')", name, *tensors_[name].file, path);
        tensors_.emplace(name, std::move(t));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
        if (ranges[i].first < ranges[i - 1].second)
            fail("'{}': tensors overlap (data offsets [{}, {}) and [{}, {}))", path, ranges[i - 1].first,
                 ranges[i - 1].second, ranges[i].first, ranges[i].second);
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
