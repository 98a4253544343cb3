#include "io/safetensors_writer.h"
#include "util/error.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace peregrine {

size_t TensorEntry::nbytes() const {
    size_t n = dtype_size(dtype);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
}

SafeTensorsWriter::SafeTensorsWriter(const std::string& path, std::vector<TensorEntry> tensors)
    : path_(path), tensors_(std::move(tensors)) {
    nlohmann::json header;
    header["__metadata__"] = {{"format", "pt"}};
    size_t offset = 0;
    for (const TensorEntry& t : tensors_) {
        if (header.contains(t.name)) fail("'{}': tensor '{}' listed twice", path, t.name);
        header[t.name] = {
            {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes()}}};
        offset += t.nbytes();
    }
    std::string h = header.dump();
    h.resize((h.size() + 7) / 8 * 8, ' ');  // the payload starts 8-aligned, as the safetensors library pads it
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create '{}': {}", path, std::strerror(errno));
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
    write_all(len, 8);
    write_all(h.data(), h.size());
    file_bytes_ = 8 + h.size() + offset;
}

SafeTensorsWriter::~SafeTensorsWriter() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(path_.c_str());
}

void SafeTensorsWriter::write_all(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail("writing '{}' failed: {}", path_, std::strerror(w < 0 ? errno : ENOSPC));
        p += w;
        n -= static_cast<size_t>(w);
    }
}

void SafeTensorsWriter::write(const void* data, size_t nbytes) {
    if (next_ >= tensors_.size()) fail("'{}': more tensors written than its header lists", path_);
    const TensorEntry& t = tensors_[next_];
    if (nbytes != t.nbytes()) fail("'{}': tensor '{}' is {} bytes, not {}", path_, t.name, t.nbytes(), nbytes);
    write_all(data, nbytes);
    ++next_;
}

void SafeTensorsWriter::finish() {
    if (next_ != tensors_.size())
        fail("'{}': {} of its {} tensors were written", path_, next_, tensors_.size());
    if (::fdatasync(fd_) != 0) fail("syncing '{}' failed: {}", path_, std::strerror(errno));
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing '{}' failed: {}", path_, std::strerror(errno));
}

}  // namespace peregrine
