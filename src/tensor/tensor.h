#pragma once
// A typed, shaped view of memory on one device. Tensors either own their buffer or alias memory owned
// elsewhere (a memory-mapped checkpoint); copies are explicit.
#include "tensor/dtype.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace peregrine {

enum class Device : uint8_t { CPU, CUDA };

class Tensor {
public:
    Tensor() = default;
    // Owning, zero-initialised host tensor.
    static Tensor zeros(DType dtype, std::vector<int64_t> shape);
    // Non-owning view of existing memory (kept alive by `keep`, which may be null).
    static Tensor view(DType dtype, std::vector<int64_t> shape, const void* data, Device device = Device::CPU,
                       std::shared_ptr<void> keep = nullptr);

    DType dtype() const { return dtype_; }
    Device device() const { return device_; }
    const std::vector<int64_t>& shape() const { return shape_; }
    int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i < 0 ? i + static_cast<int>(shape_.size()) : i)); }
    int ndim() const { return static_cast<int>(shape_.size()); }
    int64_t numel() const;
    size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
    bool defined() const { return data_ != nullptr || numel() == 0; }
    bool empty() const { return data_ == nullptr; }

    void* raw() const { return data_; }
    template <typename T>
    T* data() const { return static_cast<T*>(data_); }
    float* f32() const { return static_cast<float*>(data_); }

    // Same memory, new shape (element count must match).
    Tensor reshaped(std::vector<int64_t> shape) const;

private:
    DType dtype_ = DType::F32;
    Device device_ = Device::CPU;
    std::vector<int64_t> shape_;
    void* data_ = nullptr;
    std::shared_ptr<void> storage_;
};

}  // namespace peregrine
