// The chunked request's continuation as the accelerated scheduler plans it between fused middle
// chunks (radixsched/native/scheduler.py: NativeScheduler._plan_continuation and ChunkPlan.is_middle):
// a fresh PrefillAdder with no mixed decode tokens, no gate and no chunk limit (adder.py's
// __init__), its add_chunked_req, then its budget_state. prefill.cpp's PrefillRun.chunks runs
// the chunks this plans.
//
// Bit for bit: the same operations on the same types in the same order as the Python (see
// adder.hpp); math.floor of a float is exact there and here while it fits int64, and a value
// past int64 only ever meets a min() whose other side fits, so it is clamped to the bound.
#pragma once

#include <cstdint>
#include <optional>

#include "adder.hpp"

namespace nanobind {
class module_;
}

namespace radixsched {

// What the adder's budgets start from (PrefillAdder.__init__ with num_mixed_decode_tokens 0).
struct ChunkBudget {
    int64_t page = 1;
    int64_t max_prefill_tokens = 0;  // rem_input_tokens
    int64_t chunk_size = 0;          // rem_chunk_tokens (chunking on)
    double total_offset = 0.0;       // the running batch's decode reservations (running_offset)
};

// PrefillAdder.__init__'s total_offset: float(0) += full + discounted * ratio, where
// (full, discounted) is RunningBatch.decode_tokens and ratio the new-token ratio.
double running_offset(int64_t full, int64_t discounted, double ratio);

enum class ChunkKind : int {
    Other = 0,   // not a middle chunk: the last one, a stall, or budget left for the queue
    Middle = 1,  // a middle chunk that spends the round's budget: the step is the chunk alone
    Python = 2,  // a value Python would raise on (math.floor of a NaN): Python plans it
};

struct ChunkStep {
    ChunkKind kind = ChunkKind::Other;
    int64_t len = 0;  // a middle chunk's tokens (extend_end - prefix_len), > 0
};

// The continuation of a request at `prefix_len` of `fill_len` tokens with `room` free +
// evictable KV slots (allocator.available_size() + cache.evictable_size()).
ChunkStep plan_chunk(const ChunkBudget& b, int64_t room, int64_t prefix_len, int64_t fill_len);

// The whole continuation as PrefillAdder.add_chunked_req gives it on a fresh adder (no gate),
// then its budget_state(): what native/step.py's continuation needs, with the
// last chunk's decode `reservation` (admission_reservation, not compat).
struct Continuation {
    ChunkKind kind = ChunkKind::Other;  // Python: a value Python would raise on, or no
                                        // tokens left (Python plans it)
    int64_t len = 0;                    // tokens extended now; 0: a stall (nothing admitted)
    bool truncated = false;             // cut short of the fill: still chunked
    Budget after;                       // the adder's budgets after it
    bool other = false;                 // budget_state() after is OTHER
};
// `limit`: the adder's chunked_req_limit (a policy's cap on the continuation: spf's), if any.
Continuation plan_continuation(const ChunkBudget& b, int64_t room, int64_t prefix_len,
                               int64_t fill_len, double reservation,
                               std::optional<int64_t> limit = std::nullopt);

// radixsched._core.plan_chunk (for tests: the plan against the Python adder's).
void bind_chunks(nanobind::module_& m);

}  // namespace radixsched
