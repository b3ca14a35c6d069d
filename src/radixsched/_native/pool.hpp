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
// page where int64 took 16), so a pool holds at most kMaxPages pages. Slots cross as S:
// int32_t (the native core's request rows: a plain copy) or int64_t (the Python API's arrays).
// Int32 slots need every slot of the pool to fit int32 (slots_fit_int32: at most 2^31 slots,
// the padding page included); the int32 paths of a pool past that refuse before anything
// changes (std::invalid_argument), and the native core's rows are then int64 (kv.cpp).
//
// A counting pool (counting(), chosen when it is made, for a simulator whose runner never reads
// a slot id) names no slots: it keeps no stack (first_free_ counts the allocated pages), its
// allocations write nothing to `out` (a row's contents are then unspecified: only its length
// counts) and its frees read nothing from `slots`, so that each is O(1). Every count is what
// the slotted pool's would be (the same sequence of calls frees and allocates the same number
// of pages), so nothing that reads only sizes can tell them apart. What it cannot check: which
// pages a free names (a double free, the padding page, a page out of range or not
// page-aligned slots are not seen), only that a free never returns more pages than are
// allocated and that a count never leaves [0, num_pages]. free_slots() refuses.
#pragma once

#include <cstdint>
#include <vector>

namespace radixsched {

class Pool {
public:
    static constexpr int64_t kMaxPages = INT32_MAX - 2;  // positions up to num_pages + 1

    Pool(int64_t size, int64_t page_size, bool counting = false);

    int64_t page_size() const { return page_; }
    int64_t num_pages() const { return num_pages_; }
    int64_t total_size() const { return num_pages_ * page_; }
    int64_t pool_size() const { return (num_pages_ + 1) * page_; }
    int64_t available_size() const { return (num_pages_ - first_free_ - reserved_) * page_; }
    int64_t reserved_size() const { return reserved_ * page_; }
    bool counting() const { return counting_; }
    bool slots_fit_int32() const { return pool_size() - 1 <= INT32_MAX; }
    // std::invalid_argument unless slots_fit_int32() (an int32 row's allocation, before it).
    void require_int32() const;

    void reset();
    // `n` slots (whole pages) written to `out`; false, nothing taken, when too few are free.
    template <class S>
    bool alloc_into(S* out, int64_t n);
    // Whole pages back on the stack, in their order (checked: range and double frees first;
    // unchecked still refuses pages out of range, never writing outside the stack).
    template <class S>
    void free(const S* slots, int64_t n, bool checked);
    // free(concatenation of segs) then alloc_into(out, n), without building the concatenation.
    template <class S>
    bool recycle_into(const std::vector<std::vector<int64_t>>& segs, S* out, int64_t n);
    // recycle_into(segs, out, n) where the concatenation of segs is already in place: its
    // first `got` slots in out[0, got) and the rest in `excess` (got == n when excess is not
    // empty; Tree::evict_to lays them out so). The same free list and result.
    template <class S>
    bool recycle_placed(S* out, int64_t n, int64_t got, const std::vector<int64_t>& excess);
    bool reserve(int64_t n);
    std::vector<int64_t> claim(int64_t n);
    // claim(n) written to out[0, n) (a request's row: decode.cpp's settle).
    template <class S>
    void claim_into(S* out, int64_t n);
    std::vector<int64_t> free_slots() const;  // every free slot, bottom of the stack first
    void check_free_list() const;             // IntegrityFailure when the invariant is off
    // `n` slots (whole pages) back, by their number only: free() of a counting pool.
    void free_count(int64_t n);

private:
    int64_t pages_for(int64_t n, const char* what) const;
    [[noreturn]] void reject(const std::vector<int64_t>& pages) const;
    template <class P>
    void free_pages(const P* pages, int64_t k, bool checked);
    // A checked free_pages of pages that are all allocated and distinct, in one pass; false,
    // nothing changed, otherwise (then free_pages sorts out which error it is).
    template <class P>
    bool free_pages_fast(const P* pages, int64_t k);
    template <class S>
    void write_pages(const int32_t* pages, int64_t k, S* out) const;

    int64_t page_;
    int64_t num_pages_;
    std::vector<int32_t> stack_;
    std::vector<int32_t> stack_pos_;
    std::vector<int64_t> pages_;  // free()'s scratch: the pages of its slots (reused, no state)
    int64_t first_free_ = 0;  // counting: the pages allocated
    int64_t reserved_ = 0;
    bool counting_ = false;
};

}  // namespace radixsched
