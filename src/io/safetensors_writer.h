#pragma once
// Writing a safetensors file one tensor at a time: the header (every tensor's name, dtype, shape and offsets) goes
// first, then each tensor's bytes in the header's order, so a writer holds no more than the tensor at hand.
#include "tensor/dtype.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace peregrine {

struct TensorEntry {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    size_t nbytes() const;
};

class SafeTensorsWriter {
public:
    // Creates (or truncates) `path` and writes the header of `tensors`, laid out in the order given.
    SafeTensorsWriter(const std::string& path, std::vector<TensorEntry> tensors);
    // An unfinished file is removed: a shard cut short must not pass for a checkpoint's.
    ~SafeTensorsWriter();
    SafeTensorsWriter(const SafeTensorsWriter&) = delete;
    SafeTensorsWriter& operator=(const SafeTensorsWriter&) = delete;

    // The next tensor's bytes (exactly its nbytes).
    void write(const void* data, size_t nbytes);
    // Checks every tensor came, syncs the file to the disk and drops it from the page cache (what reads it next
    // reads the disk, as a cold start does), then closes it.
    void finish();
    // Header and payload: the file's size once finished.
    size_t file_bytes() const { return file_bytes_; }

private:
    void write_all(const void* data, size_t n);

    std::string path_;
    std::vector<TensorEntry> tensors_;
    size_t next_ = 0;
    size_t file_bytes_ = 0;
    int fd_ = -1;
};

}  // namespace peregrine
