#pragma once
// Whole-file reads and a read-only memory map (weights are used in place, never copied).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace peregrine {

std::string read_file(const std::string& path);
void write_file(const std::string& path, const void* data, size_t size);
bool file_exists(const std::string& path);

class MappedFile {
public:
    MappedFile() = default;
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(MappedFile&& o) noexcept;
    MappedFile& operator=(MappedFile&& o) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

    // The process's one map of the file at `path` (mapped anew once the file changes): every rank of a server reads
    // the checkpoint through the same addresses, so what is pinned for the GPUs is pinned once.
    static std::shared_ptr<const MappedFile> shared(const std::string& path);

private:
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

}  // namespace peregrine
