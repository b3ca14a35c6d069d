// See chunks.hpp. Each step names the line of radixsched/adder.py it follows.
#include "chunks.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "adder.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

// math.floor(x) of a finite float, clamped to int64 (chunks.hpp: only a min() reads it).
int64_t floor_clamped(double x) {
    constexpr double two63 = 9223372036854775808.0;
    if (x >= two63) return std::numeric_limits<int64_t>::max();
    if (x < -two63) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(std::floor(x));
}

}  // namespace

double running_offset(int64_t full, int64_t discounted, double ratio) {
    double total = 0.0;  // float(num_mixed_decode_tokens)
    total += static_cast<double>(full) + static_cast<double>(discounted) * ratio;
    return total;
}

ChunkStep plan_chunk(const ChunkBudget& b, int64_t room, int64_t prefix_len, int64_t fill_len) {
    if (b.page <= 0) throw std::invalid_argument("plan_chunk: the page size must be > 0");
    const double r = static_cast<double>(room);
    // rem = min(rem_chunk_tokens, math.floor(room - total_offset))
    const double over = r - b.total_offset;
    if (!std::isfinite(over)) return {ChunkKind::Python, 0};  // math.floor raises there
    int64_t rem = std::min(b.chunk_size, floor_clamped(over));
    if (rem <= 0) rem = b.chunk_size;  // a continuation always makes progress
    // rem = min(rem, floor_page(math.floor(room - current_offset), page)), current_offset 0.0
    rem = std::min(rem, floor_page(floor_clamped(r - 0.0), b.page));
    const int64_t cand = fill_len - prefix_len;
    if (rem <= 0) return {ChunkKind::Other, 0};    // no memory for a page: a stall
    if (cand <= rem) return {ChunkKind::Other, 0};  // not truncated: the last chunk
    // Truncated (new_len = rem < cand): the chunk ends on a page boundary.
    const int64_t end = floor_page(prefix_len + rem, b.page);
    const int64_t len = std::max<int64_t>(end - prefix_len, 0);
    if (len == 0) return {ChunkKind::Other, 0};  // a stall
    Budget after;  // _charge(0, len, 0.0) on the fresh adder's budgets
    after.total_offset = b.total_offset;
    after.current_offset = 0.0;
    after.rem_input_tokens = b.max_prefill_tokens;
    after.has_chunk = true;
    after.rem_chunk_tokens = b.chunk_size;
    charge(after, b.page, 0, len, 0.0);
    // ChunkPlan.is_middle: still chunked, admitted, and budget_state() is OTHER.
    const bool middle = budget_state(after, room) == Verdict::Other;
    return {middle ? ChunkKind::Middle : ChunkKind::Other, len};
}

Continuation plan_continuation(const ChunkBudget& b, int64_t room, int64_t prefix_len,
                               int64_t fill_len, double reservation,
                               std::optional<int64_t> limit) {
    if (b.page <= 0) throw std::invalid_argument("plan_continuation: the page size must be > 0");
    Continuation c;  // the fresh adder's budgets (PrefillAdder.__init__)
    c.after.total_offset = b.total_offset;
    c.after.current_offset = 0.0;
    c.after.rem_input_tokens = b.max_prefill_tokens;
    c.after.has_chunk = true;
    c.after.rem_chunk_tokens = b.chunk_size;
    const double r = static_cast<double>(room);
    const int64_t cand = fill_len - prefix_len;
    const double over = r - b.total_offset;
    if (!std::isfinite(over) || cand <= 0) {  // math.floor raises; nothing left to extend
        c.kind = ChunkKind::Python;
        return c;
    }
    // rem = min(rem_chunk_tokens, math.floor(room - total_offset)), at least the chunk budget
    int64_t rem = std::min(b.chunk_size, floor_clamped(over));
    if (rem <= 0) rem = b.chunk_size;
    rem = std::min(rem, floor_page(floor_clamped(r - 0.0), b.page));  // current_offset 0.0
    if (limit) rem = std::min(rem, *limit);  // rem = min(rem, chunked_req_limit)
    c.truncated = true;  // a stall keeps the request chunked
    if (rem <= 0) {
        c.after.current_offset = r;  // float(room): budget_state() is NO_TOKEN
        return c;
    }
    c.truncated = cand > rem;
    int64_t len = std::min(cand, rem);
    if (c.truncated) {  // the chunk ends on a page boundary
        const int64_t end = floor_page(prefix_len + len, b.page);
        len = std::max<int64_t>(end - prefix_len, 0);
        if (len == 0) {
            c.after.current_offset = r;
            return c;
        }
    }
    c.len = len;
    charge(c.after, b.page, 0, len, c.truncated ? 0.0 : reservation);
    c.other = budget_state(c.after, room) == Verdict::Other;
    if (c.truncated && c.other) c.kind = ChunkKind::Middle;  // ChunkPlan.is_middle
    return c;
}

void bind_chunks(nb::module_& m) {
    m.def(
        "plan_chunk",
        [](int64_t page, int64_t max_prefill_tokens, int64_t chunk_size, int64_t full,
           int64_t discounted, double ratio, int64_t room, int64_t prefix_len,
           int64_t fill_len) {
            const ChunkBudget b{page, max_prefill_tokens, chunk_size,
                                running_offset(full, discounted, ratio)};
            const ChunkStep s = plan_chunk(b, room, prefix_len, fill_len);
            return nb::make_tuple(static_cast<int>(s.kind), s.len);
        },
        "page"_a, "max_prefill_tokens"_a, "chunk_size"_a, "full"_a, "discounted"_a, "ratio"_a,
        "room"_a, "prefix_len"_a, "fill_len"_a,
        "(kind, tokens) of the chunked request's continuation: kind 1 a middle chunk of "
        "`tokens`, 0 anything else, 2 a value the Python raises on (chunks.hpp)");
    m.def(
        "plan_continuation",
        [](int64_t page, int64_t max_prefill_tokens, int64_t chunk_size, int64_t full,
           int64_t discounted, double ratio, int64_t room, int64_t prefix_len, int64_t fill_len,
           double reservation, std::optional<int64_t> limit) {
            const ChunkBudget b{page, max_prefill_tokens, chunk_size,
                                running_offset(full, discounted, ratio)};
            const Continuation c =
                plan_continuation(b, room, prefix_len, fill_len, reservation, limit);
            const Budget& a = c.after;
            return nb::make_tuple(static_cast<int>(c.kind), c.len, c.truncated, a.total_offset,
                                  a.current_offset, a.rem_input_tokens, a.rem_chunk_tokens,
                                  c.other);
        },
        "page"_a, "max_prefill_tokens"_a, "chunk_size"_a, "full"_a, "discounted"_a, "ratio"_a,
        "room"_a, "prefix_len"_a, "fill_len"_a, "reservation"_a, "limit"_a = nb::none(),
        "(kind, tokens, still chunked, total_offset, current_offset, rem_input_tokens, "
        "rem_chunk_tokens, budget_state() is OTHER) of the whole continuation (chunks.hpp)");
}

}  // namespace radixsched
