#pragma once
// Read-only access to safetensors checkpoints (one file or shards listed in model.safetensors.index.json).
// Files are memory-mapped; tensors point into the maps and are never copied.
#include "tensor/dtype.h"
#include "util/file.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace peregrine {

struct TensorView {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;
    size_t nbytes = 0;
    const std::string* file = nullptr;  // the shard it lives in, for error messages

    int64_t numel() const;
    int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? i + static_cast<int>(shape.size()) : i)); }
    std::string shape_str() const;
    template <typename T>
    const T* as() const { return reinterpret_cast<const T*>(data); }
};

class SafeTensors {
public:
    // dir holds model.safetensors, or model.safetensors.index.json and its shards.
    static SafeTensors open_dir(const std::string& dir);
    // One file.
    void add_file(const std::string& path);

    bool has(const std::string& name) const { return tensors_.count(name) != 0; }
    const TensorView* find(const std::string& name) const;
    // The tensor, checked against the expected dtype and shape; the error names tensor and file.
    const TensorView& require(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
    const TensorView& require(const std::string& name) const;
    const std::map<std::string, TensorView>& tensors() const { return tensors_; }
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    std::vector<std::shared_ptr<const MappedFile>> files_;  // shared with other loads of the same files
    std::map<std::string, TensorView> tensors_;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

// model.safetensors.index.json's weight_map: tensor name -> shard file. A shard must be a plain file name of the
// model directory (no separators, not "." or "..", no NUL); anything else fails naming the index at path.
std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& path);

}  // namespace peregrine
