// The running batch's decode columns (what radixsched.native.scheduler's decode jump reads), in
// C++: one row per running request, in batch order, with its lengths. A decode jump over k
// steps is a few passes over these columns: how many slots the steps need, how many steps fit
// in the free memory, which rows can have finished, and the advance itself.
//
// Invariant: every column has size() entries; `stopping_` counts the rows whose `stops` is set
// (a request that may stop before max_new_tokens: stop ids, or EOS it does not ignore).
// Arithmetic is on int64 and follows the Python it replaced: floor division as Python's `//`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace nanobind {
class module_;
}

// The Python binding (decode.cpp): _core.DecodeBatch.
void bind_decode(nanobind::module_& m);

namespace radixsched {

struct DecodeRow {
    int64_t fill;     // prompt + output length: the next token's KV goes at fill - 1
    int64_t have;     // len(kv_row): slots allocated (deferred: the owed ones included)
    int64_t out_len;  // output tokens
    int64_t max_new;  // max_new_tokens
    bool ignore_eos;
    bool stops;
};

class DecodeCols {
public:
    std::size_t size() const { return fill_.size(); }
    bool can_stop() const { return stopping_ > 0; }
    DecodeRow row(std::size_t i) const;

    void push(const DecodeRow& r);
    // Drop the rows at `positions` (strictly ascending), the others keeping their order.
    void remove_at(const std::vector<int64_t>& positions);

    // Slots row `i` must allocate to decode `steps` more tokens: after k steps it holds KV for
    // positions [0, fill - 1 + k), in whole pages.
    int64_t need(std::size_t i, int64_t steps, int64_t page) const;
    int64_t need_total(int64_t steps, int64_t page) const;
    // The largest k <= limit whose need_total fits in `room` (1 when none does). Page 1 with
    // every row ending where its next token goes: sum(fill - 1 - have) + n * k, solved
    // directly; else a binary search.
    int64_t max_steps_that_fit(int64_t limit, int64_t room, int64_t page) const;
    // (ignore_eos, other) sums of min(max(max_new - out_len, 0), clip).
    std::pair<int64_t, int64_t> decode_tokens(int64_t clip) const;
    std::pair<int64_t, int64_t> progress() const;  // (sum out_len, sum max_new)
    int64_t to_go(std::size_t i) const;                 // max(max_new - out_len, 0)
    int64_t min_left() const;                      // min(max_new - out_len); size() > 0
    // Rows that can have finished: all when a row can stop, else those at max_new.
    std::vector<int64_t> maybe_finished() const;
    // k decode steps: fill and out_len grow by k, have by need(i, k, page). Returns the total.
    int64_t advance(int64_t k, int64_t page);
    int64_t total_fill() const;  // sum(fill): the decode context of the next step


    const std::vector<int64_t>& fill() const { return fill_; }
    const std::vector<int64_t>& have() const { return have_; }
    const std::vector<int64_t>& out_len() const { return out_len_; }
    const std::vector<int64_t>& max_new() const { return max_new_; }
    const std::vector<uint8_t>& ignore_eos() const { return ignore_eos_; }
    const std::vector<uint8_t>& stops() const { return stops_; }

private:
    std::vector<int64_t> fill_, have_, out_len_, max_new_;
    std::vector<uint8_t> ignore_eos_, stops_;
    int64_t stopping_ = 0;
};

// Index of the first of `ends` at or after `key`: numpy's searchsorted(ends, key, "left"), its
// binary search and its NaN order (NaN last) included, so that it agrees on any array.
std::size_t search_left(const std::vector<double>& ends, std::size_t n, double key);

}  // namespace radixsched
