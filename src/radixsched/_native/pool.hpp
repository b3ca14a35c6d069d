// The page-granular KV slot allocator of radixsched.cache.allocator (TokenAllocator), in C++:
// the same LIFO free stack of pages, the same slots in the same order, the same reservation,
// the same errors. The accelerated core allocates from it without a call into Python per
// allocation (kv.hpp: an allocation that evicts, a request's checkpoint).
//
// Invariant (check_free_list): free pages are stack_[first_free_:], top first;
// stack_pos_[stack_[i]] == i + 1 for i >= first_free_, 0 for an allocated page, and
// stack_pos_[0] == stack_pos_[num_pages + 1] == -1 (the padding page and the out-of-range
// sentinel: never freeable). reserved_ pages stay on the stack until claimed.
//
// The stack and the positions are int32 (half the memory of int64 tables: they take 8 bytes a
// page where int64 took 16), so a pool holds at most kMaxPages pages; slots cross as int64.
#pragma once

#include <cstdint>
#include <vector>

namespace radixsched {

class Pool {
public:
    static constexpr int64_t kMaxPages = INT32_MAX - 2;  // positions up to num_pages + 1

    Pool(int64_t size, int64_t page_size);

    int64_t page_size() const { return page_; }
    int64_t num_pages() const { return num_pages_; }
    int64_t total_size() const { return num_pages_ * page_; }
    int64_t pool_size() const { return (num_pages_ + 1) * page_; }
    int64_t available_size() const { return (num_pages_ - first_free_ - reserved_) * page_; }
    int64_t reserved_size() const { return reserved_ * page_; }

    void reset();
    // `n` slots (whole pages) written to `out`; false, nothing taken, when too few are free.
    bool alloc_into(int64_t* out, int64_t n);
    // Whole pages back on the stack, in their order (checked: range and double frees first;
    // unchecked still refuses pages out of range, never writing outside the stack).
    void free(const int64_t* slots, int64_t n, bool checked);
    // free(concatenation of segs) then alloc_into(out, n), without building the concatenation.
    bool recycle_into(const std::vector<std::vector<int64_t>>& segs, int64_t* out, int64_t n);
    // recycle_into(segs, out, n) where the concatenation of segs is already in place: its
    // first `got` slots in out[0, got) and the rest in `excess` (got == n when excess is not
    // empty; Tree::evict_to lays them out so). The same free list and result.
    bool recycle_placed(int64_t* out, int64_t n, int64_t got, const std::vector<int64_t>& excess);
    bool reserve(int64_t n);
    std::vector<int64_t> claim(int64_t n);
    std::vector<int64_t> free_slots() const;  // every free slot, bottom of the stack first
    void check_free_list() const;             // IntegrityFailure when the invariant is off

private:
    int64_t pages_for(int64_t n, const char* what) const;
    [[noreturn]] void reject(const std::vector<int64_t>& pages) const;
    void write_pages(const int32_t* pages, int64_t k, int64_t* out) const;

    int64_t page_;
    int64_t num_pages_;
    std::vector<int32_t> stack_;
    std::vector<int32_t> stack_pos_;
    std::vector<int64_t> pages_;  // free()'s scratch: the pages of its slots (reused, no state)
    int64_t first_free_ = 0;
    int64_t reserved_ = 0;
};

}  // namespace radixsched
