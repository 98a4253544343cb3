#include "tensor/tensor.h"
#include "util/error.h"

#include <cstdlib>
#include <cstring>

namespace peregrine {

int64_t Tensor::numel() const {
    int64_t n = 1;
    for (auto d : shape_) n *= d;
    return n;
}

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    size_t bytes = t.nbytes();
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) fail("out of host memory allocating {} bytes", bytes);
    std::memset(p, 0, bytes);
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    t.data_ = p;
    return t;
}

Tensor Tensor::view(DType dtype, std::vector<int64_t> shape, const void* data, Device device,
                    std::shared_ptr<void> keep) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.device_ = device;
    t.data_ = const_cast<void*>(data);
    t.storage_ = std::move(keep);
    return t;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
    Tensor t = *this;
    t.shape_ = std::move(shape);
    if (t.numel() != numel()) fail("cannot reshape {} elements into {}", numel(), t.numel());
    return t;
}

}  // namespace peregrine
