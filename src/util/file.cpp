#include "util/file.h"
#include "util/error.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <tuple>
#include <unistd.h>

namespace peregrine {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open '{}': {}", path, std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_file(const std::string& path, const void* data, size_t size) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write '{}': {}", path, std::strerror(errno));
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) fail("write to '{}' failed", path);
}

bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) fail("cannot open '{}': {}", path, std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        ::close(fd);
        fail("cannot stat '{}': {}", path, std::strerror(errno));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ::close(fd);
            fail("cannot mmap '{}': {}", path, std::strerror(errno));
        }
        data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
}

std::shared_ptr<const MappedFile> MappedFile::shared(const std::string& path) {
    static std::mutex mu;
    // A file rewritten since it was mapped (size or modification time) is mapped anew.
    using Key = std::tuple<std::string, dev_t, ino_t, off_t, int64_t>;
    static std::map<Key, std::weak_ptr<const MappedFile>> maps;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) fail("cannot open '{}': {}", path, std::strerror(errno));
    const Key key{path, st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
    std::lock_guard<std::mutex> lock(mu);
    std::erase_if(maps, [](const auto& e) { return e.second.expired(); });
    auto& slot = maps[key];
    if (auto m = slot.lock()) return m;
    auto m = std::make_shared<const MappedFile>(path);
    slot = m;
    return m;
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
    o.data_ = nullptr;
    o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
    if (this != &o) {
        if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
        data_ = o.data_;
        size_ = o.size_;
        path_ = std::move(o.path_);
        o.data_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

}  // namespace peregrine
