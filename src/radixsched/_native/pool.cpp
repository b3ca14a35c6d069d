// See pool.hpp. Each method mirrors TokenAllocator's method of the same name
// (radixsched/cache/allocator.py), messages included.
#include "pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "radix.hpp"  // IntegrityFailure

namespace radixsched {

namespace {
int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
}  // namespace

Pool::Pool(int64_t size, int64_t page_size, bool counting) : page_(page_size), counting_(counting) {
    if (page_size < 1)
        throw std::invalid_argument("page_size must be >= 1, got " + std::to_string(page_size));
    if (size < 0) throw std::invalid_argument("size must be >= 0, got " + std::to_string(size));
    num_pages_ = size / page_size;
    if (num_pages_ > kMaxPages)
        throw std::invalid_argument("size " + std::to_string(size) + " is more than " +
                                    std::to_string(kMaxPages) + " pages of " +
                                    std::to_string(page_size));
    reset();
}

void Pool::reset() {
    first_free_ = 0;
    reserved_ = 0;
    if (counting_) return;  // no stack: every page is free
    const auto n = static_cast<int32_t>(num_pages_);  // at most kMaxPages
    stack_.resize(static_cast<size_t>(n));
    stack_pos_.resize(static_cast<size_t>(n) + 2);  // every entry written below
    for (int32_t i = 0; i < n; ++i) {
        stack_[i] = i + 1;
        stack_pos_[i + 1] = i + 1;
    }
    stack_pos_[0] = stack_pos_[n + 1] = -1;
}

int64_t Pool::pages_for(int64_t n, const char* what) const {
    if (n < 0 || n % page_ != 0)
        throw std::invalid_argument(std::string(what) + "(" + std::to_string(n) +
                                    "): must be a non-negative multiple of page_size (" +
                                    std::to_string(page_) + ")");
    return n / page_;
}

void Pool::require_int32() const {
    if (!slots_fit_int32())
        throw std::invalid_argument("int32 slots from a pool of " + std::to_string(pool_size()) +
                                    " slots: some are outside the int32 range");
}

template <class S>
void Pool::write_pages(const int32_t* pages, int64_t k, S* out) const {
    if (page_ == 1) {  // a page is its slot
        std::copy(pages, pages + k, out);
        return;
    }
    for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < page_; ++j)
            out[i * page_ + j] = static_cast<S>(int64_t(pages[i]) * page_ + j);
}

template <class S>
bool Pool::alloc_into(S* out, int64_t n) {
    const int64_t k = pages_for(n, "alloc");
    const int64_t lo = first_free_;
    if (k > num_pages_ - lo - reserved_) return false;
    if (k == 0) return true;
    if constexpr (sizeof(S) == sizeof(int32_t)) require_int32();  // nothing moved yet
    if (counting_) {  // counted, `out` not written
        first_free_ = lo + k;
        return true;
    }
    const int32_t* pages = stack_.data() + lo;
    first_free_ = lo + k;
    // The stack holds pages 1..num_pages only (check_free_list): in range of stack_pos_.
    for (int64_t i = 0; i < k; ++i) stack_pos_[pages[i]] = 0;
    write_pages(pages, k, out);
    return true;
}

void Pool::reject(const std::vector<int64_t>& pages) const {
    const auto [lo, hi] = std::minmax_element(pages.begin(), pages.end());
    if (*lo < 1) throw std::invalid_argument("free: refusing to free the padding page (slot 0)");
    if (*hi > num_pages_)
        throw std::invalid_argument("free: refusing to free page " + std::to_string(*hi) +
                                    " (out of range)");
    int64_t count = 0, first = -1;
    for (int64_t p : pages) {
        if (stack_pos_[p] > 0) {
            if (count++ == 0) first = p;
        }
    }
    throw std::invalid_argument("free: double free of " + std::to_string(count) +
                                " page(s), first page " + std::to_string(first));
}

template <class S>
void Pool::free(const S* slots, int64_t n, bool checked) {
    if (counting_) {  // `slots` not read
        free_count(n);
        return;
    }
    if (n == 0) return;
    const int64_t p = page_;
    if (n % p != 0)
        throw std::invalid_argument("free: " + std::to_string(n) +
                                    " slots is not a whole number of pages (p=" +
                                    std::to_string(p) + ")");
    const int64_t k = n / p;
    // The pages of the slots: the slots themselves when a page is one slot (no scratch copy).
    if (p == 1) {
        free_pages(slots, k, checked);
        return;
    }
    pages_.resize(static_cast<size_t>(k));  // every entry written below before it is read
    for (int64_t i = 0; i < k; ++i) {
        pages_[i] = floor_div(slots[i * p], p);
        if (checked)
            for (int64_t j = 0; j < p; ++j)
                if (slots[i * p + j] != pages_[i] * p + j)
                    throw std::invalid_argument("free: slots are not page-aligned groups of " +
                                                std::to_string(p));
    }
    free_pages(pages_.data(), k, checked);
}

template <class P>
bool Pool::free_pages_fast(const P* pages, int64_t k) {
    // One pass instead of free_pages' four: each page checked (in range, allocated: its
    // position 0, which also catches a page given twice, as its first place is written by
    // then), its position and its stack entry written; at the first bad page the positions
    // written are put back to 0 (each was 0: allocated) and free_pages (which throws its own
    // error) takes over. (The stack entries written lie below first_free_, which nothing reads.)
    const int64_t lo = first_free_ - k;
    if (lo < 0) return false;
    const auto top = static_cast<uint64_t>(num_pages_);
    for (int64_t i = 0; i < k; ++i) {
        const int64_t page = pages[i];
        if (static_cast<uint64_t>(page - 1) >= top || stack_pos_[page] != 0) {
            for (int64_t q = 0; q < i; ++q) stack_pos_[pages[q]] = 0;
            return false;
        }
        stack_pos_[page] = static_cast<int32_t>(lo + 1 + i);
        stack_[lo + i] = static_cast<int32_t>(page);
    }
    first_free_ = lo;
    return true;
}

template <class P>
void Pool::free_pages(const P* pages, int64_t k, bool checked) {
    if (checked && free_pages_fast(pages, k)) return;
    bool bad = false;
    for (int64_t i = 0; i < k; ++i) {
        const int64_t page = pages[i];
        const int64_t clipped = std::clamp<int64_t>(page, 0, num_pages_ + 1);
        // Unchecked frees still never write outside the stack (range only).
        bad |= checked ? stack_pos_[clipped] != 0 : clipped != page || page == 0;
    }
    if (bad) reject(std::vector<int64_t>(pages, pages + k));
    const int64_t lo = first_free_ - k;
    if (lo < 0) throw std::invalid_argument("free: the same page appears twice in one call");
    // Every page is in [1, num_pages] (checked above) and every position at most num_pages.
    for (int64_t i = 0; i < k; ++i) stack_pos_[pages[i]] = static_cast<int32_t>(lo + 1 + i);
    if (checked && k > 1) {
        for (int64_t i = 0; i < k; ++i) {
            if (stack_pos_[pages[i]] != lo + 1 + i) {  // a page given twice kept its later place
                for (int64_t q = 0; q < k; ++q) stack_pos_[pages[q]] = 0;  // all were allocated
                throw std::invalid_argument("free: the same page appears twice in one call");
            }
        }
    }
    for (int64_t i = 0; i < k; ++i) stack_[lo + i] = static_cast<int32_t>(pages[i]);
    first_free_ = lo;
}

template <class S>
bool Pool::recycle_into(const std::vector<std::vector<int64_t>>& segs, S* out, int64_t n) {
    pages_for(n, "alloc");
    int64_t g = 0;
    for (const auto& seg : segs) {
        const int64_t len = static_cast<int64_t>(seg.size());
        if (len % page_ != 0)
            throw std::invalid_argument("free: " + std::to_string(len) +
                                        " slots is not a whole number of pages (p=" +
                                        std::to_string(page_) + ")");
        g += len;
    }
    if (counting_) {  // free everything, then allocate: recycle's counts either way
        free_count(g);
        return alloc_into(out, n);
    }
    auto free_all = [&](size_t from_seg, int64_t from_pos) {
        std::vector<int64_t> rest;
        for (size_t i = from_seg; i < segs.size(); ++i)
            rest.insert(rest.end(), segs[i].begin() + (i == from_seg ? from_pos : 0),
                        segs[i].end());
        free(rest.data(), static_cast<int64_t>(rest.size()), false);
    };
    if (n > g && (n - g) / page_ > num_pages_ - first_free_ - reserved_) {
        if (g) free_all(0, 0);
        return false;
    }
    int64_t pos = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
        const auto& seg = segs[i];
        const int64_t len = static_cast<int64_t>(seg.size());
        const int64_t take = std::min(len, n - pos);
        for (int64_t j = 0; j < take; ++j)  // the tree's slots: each fits int32
            out[pos + j] = static_cast<S>(seg[static_cast<size_t>(j)]);
        pos += take;
        if (take < len) {  // the excess, freed as one group: what free-all-then-alloc leaves
            free_all(i, take);
            return true;
        }
    }
    if (pos < n && !alloc_into(out + pos, n - pos))
        throw IntegrityFailure("recycle: the free list lost pages it counted");
    return true;
}

template <class S>
bool Pool::recycle_placed(S* out, int64_t n, int64_t got, const std::vector<int64_t>& excess) {
    pages_for(n, "alloc");
    const int64_t g = got + static_cast<int64_t>(excess.size());
    if (got < 0 || got > n || (!excess.empty() && got != n))
        throw std::invalid_argument("recycle: " + std::to_string(got) + " slots placed of " +
                                    std::to_string(n) + " with " +
                                    std::to_string(excess.size()) + " more");
    if (g % page_ != 0)
        throw std::invalid_argument("free: " + std::to_string(g) +
                                    " slots is not a whole number of pages (p=" +
                                    std::to_string(page_) + ")");
    if (counting_) {  // free everything, then allocate: recycle's counts either way
        free_count(g);
        return alloc_into(out, n);
    }
    if (n > g && (n - g) / page_ > num_pages_ - first_free_ - reserved_) {
        free(out, g, false);  // all of it sits in out (g < n)
        return false;
    }
    if (!excess.empty()) {  // the excess, freed as one group
        free(excess.data(), static_cast<int64_t>(excess.size()), false);
        return true;
    }
    if (got < n && !alloc_into(out + got, n - got))
        throw IntegrityFailure("recycle: the free list lost pages it counted");
    return true;
}

bool Pool::reserve(int64_t n) {
    const int64_t k = pages_for(n, "reserve");
    if (k > num_pages_ - first_free_ - reserved_) return false;
    reserved_ += k;
    return true;
}

std::vector<int64_t> Pool::claim(int64_t n) {
    const int64_t k = n / page_;
    if (n < 0 || n % page_ != 0 || k > reserved_)
        throw std::invalid_argument("claim(" + std::to_string(n) + "): " +
                                    std::to_string(reserved_ * page_) + " reserved, page_size " +
                                    std::to_string(page_));
    reserved_ -= k;
    std::vector<int64_t> out(static_cast<size_t>(n));
    if (!alloc_into(out.data(), n))
        throw IntegrityFailure("claim: reserved pages left the stack");
    return out;
}

template <class S>
void Pool::claim_into(S* out, int64_t n) {
    const int64_t k = n / page_;
    if (n < 0 || n % page_ != 0 || k > reserved_)
        throw std::invalid_argument("claim(" + std::to_string(n) + "): " +
                                    std::to_string(reserved_ * page_) + " reserved, page_size " +
                                    std::to_string(page_));
    if constexpr (sizeof(S) == sizeof(int32_t)) require_int32();  // before the reservation goes
    reserved_ -= k;
    if (!alloc_into(out, n)) throw IntegrityFailure("claim: reserved pages left the stack");
}

void Pool::free_count(int64_t n) {
    if (n % page_ != 0 || n < 0)
        throw std::invalid_argument("free: " + std::to_string(n) +
                                    " slots is not a whole number of pages (p=" +
                                    std::to_string(page_) + ")");
    const int64_t k = n / page_;
    if (k > first_free_)  // the one misuse a count still sees
        throw std::invalid_argument("free: " + std::to_string(k) + " page(s) freed with " +
                                    std::to_string(first_free_) + " allocated");
    first_free_ -= k;
}

std::vector<int64_t> Pool::free_slots() const {
    if (counting_) throw std::invalid_argument("free_slots: a counting pool names no slots");
    std::vector<int32_t> pages(stack_.rbegin(), stack_.rend() - first_free_);
    std::vector<int64_t> out(pages.size() * static_cast<size_t>(page_));
    write_pages(pages.data(), static_cast<int64_t>(pages.size()), out.data());
    return out;
}

void Pool::check_free_list() const {
    if (counting_) {
        if (first_free_ < 0 || reserved_ < 0 || first_free_ + reserved_ > num_pages_ ||
            !stack_.empty())
            throw IntegrityFailure("counting pool off: " + std::to_string(first_free_) +
                                   " pages allocated, " + std::to_string(reserved_) +
                                   " reserved of " + std::to_string(num_pages_));
        return;
    }
    const int64_t lo = first_free_, n_stack = num_pages_ - first_free_;
    int64_t n_marked = 0;
    for (int64_t i = 1; i <= num_pages_; ++i) n_marked += stack_pos_[i] > 0;
    bool ok = n_marked == n_stack && stack_pos_.front() == -1 && stack_pos_.back() == -1;
    for (int64_t i = lo; ok && i < num_pages_; ++i) {
        const int64_t page = stack_[i];
        ok = page >= 1 && page <= num_pages_ && stack_pos_[page] == i + 1;
    }
    if (!ok)
        throw IntegrityFailure("allocator free-list corrupt: " + std::to_string(n_stack) +
                               " pages on the stack, " + std::to_string(n_marked) +
                               " marked free");
}

// The slot paths for both element types (pool.hpp).
#define RADIXSCHED_POOL_SLOTS(S)                                                               \
    template bool Pool::alloc_into<S>(S*, int64_t);                                           \
    template void Pool::free<S>(const S*, int64_t, bool);                                     \
    template bool Pool::recycle_into<S>(const std::vector<std::vector<int64_t>>&, S*, int64_t); \
    template bool Pool::recycle_placed<S>(S*, int64_t, int64_t, const std::vector<int64_t>&);  \
    template void Pool::claim_into<S>(S*, int64_t);
RADIXSCHED_POOL_SLOTS(int32_t)
RADIXSCHED_POOL_SLOTS(int64_t)
#undef RADIXSCHED_POOL_SLOTS

}  // namespace radixsched
