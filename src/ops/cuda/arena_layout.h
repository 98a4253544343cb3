#pragma once
// Where a graph capture's allocations lie in its arena (CaptureArena, device_memory.h), as offsets: plain C++, so
// that the layout is tested without a GPU. A block freed during the capture is handed out again only to a later
// allocation on the same stream (the capture orders that allocation after every earlier use on the stream, as the
// stream-ordered pool orders its own reuse), and only to one of at least half its size; otherwise blocks are laid
// out one after another, however far that goes, so that top() is the size an arena needs to hold them all.
#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>

namespace peregrine::cuda {

class ArenaLayout {
public:
    static constexpr size_t kAlign = 256;

    // A block of at least `bytes` for `stream`: its offset.
    size_t take(size_t bytes, const void* stream) {
        bytes = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
        auto& freed = free_[stream];
        auto it = freed.lower_bound(bytes);
        if (it != freed.end() && it->first <= 2 * bytes) {
            const size_t offset = it->second;
            freed.erase(it);
            return offset;
        }
        const size_t offset = top_;
        top_ += bytes;
        sizes_[offset] = bytes;
        return offset;
    }
    // The block at `offset`, freed on `stream`.
    void give(size_t offset, const void* stream) { free_[stream].emplace(sizes_.at(offset), offset); }
    size_t size_of(size_t offset) const { return sizes_.at(offset); }
    // The end of the last block laid out: the arena size that holds every block.
    size_t top() const { return top_; }

private:
    size_t top_ = 0;
    std::map<const void*, std::multimap<size_t, size_t>> free_;  // per stream: freed blocks' offsets by size
    std::map<size_t, size_t> sizes_;                              // every block laid out: its size, by offset
};

}  // namespace peregrine::cuda
