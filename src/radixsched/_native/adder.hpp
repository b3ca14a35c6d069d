// The prefill adder's budget arithmetic (radixsched/adder.py's PrefillAdder), for the accelerated
// scheduler's admission loop (adder.cpp walks a round's candidates in one call).
//
// Bit for bit: every float is computed from the same operands in the same order and type as the
// Python (an int operand converts to double first, exactly, as Python's int + float does), and
// every division of a possibly negative int floors as Python's // does.
#pragma once

#include <algorithm>
#include <cstdint>

namespace radixsched {

enum class Verdict : int { Continue = 0, NoToken = 1, Other = 2 };  // AddReqResult

inline int64_t floor_div(int64_t a, int64_t b) {  // Python's a // b (b > 0)
    int64_t q = a / b;
    if ((a % b != 0) && (a < 0)) --q;
    return q;
}
inline int64_t floor_page(int64_t n, int64_t p) { return floor_div(n, p) * p; }
inline int64_t ceil_page(int64_t n, int64_t p) { return -floor_div(-n, p) * p; }

struct AdderConfig {
    int64_t page = 1;
    int64_t clip_max_new_tokens = 0;
    double new_token_ratio = 0.0;
    int64_t prefill_max_requests = -1;  // -1: no limit
    bool exclusive_chunking = false;    // no new chunked request while one continues
    bool compat = false;                // SGLang 0.5.23's budgets (PrefillAdder.compat)
};

// The adder's mutable budgets (PrefillAdder's fields of the same names).
struct Budget {
    double total_offset = 0.0;
    double current_offset = 0.0;
    int64_t rem_input_tokens = 0;
    bool has_chunk = false;  // rem_chunk_tokens is not None
    int64_t rem_chunk_tokens = 0;
    int64_t n_admitted = 0;  // len(can_run_list)
    bool has_new_chunked = false;
    int64_t log_hit_tokens = 0;
    int64_t log_input_tokens = 0;
};

// What _select decides: a verdict (not ok), or the tokens to extend now and whether it chunks.
struct Shape {
    bool ok = false;
    Verdict verdict = Verdict::Other;
    int64_t extend_len = 0;
    bool chunked = false;
};

// `room`: free + evictable KV, read live by the caller (locks change it).
Verdict budget_state(const Budget& b, int64_t room);
// running_reservation (non-compat admission_reservation).
double reservation(const AdderConfig& c, int64_t remaining_new_tokens, bool ignore_eos);
Shape select(const Budget& b, const AdderConfig& c, int64_t room, int64_t cand, int64_t prefix_len,
             double max_new_check, bool has_chunked_req);
void charge(Budget& b, int64_t page, int64_t prefix_len, int64_t extend_len, double reservation);
// Length of the common prefix of a[:na] and b[:nb].
int64_t common_prefix(const int32_t* a, int64_t na, const int32_t* b, int64_t nb);

}  // namespace radixsched

// ---- the binding (adder.cpp) ---------------------------------------------------------------
#include <nanobind/nanobind.h>

#include <utility>

namespace radixsched {
class Tree;
class Matcher;
// The native tree of a Python Tree object and its matcher (null when none listens): module.cpp
// knows the Python class, and hands this resolver to bind_adder.
using TreeOf = std::pair<Tree*, Matcher*> (*)(nanobind::handle);
// radixsched._native._core.Adder: one round's budgets and its admission loop.
void bind_adder(nanobind::module_& m, TreeOf tree_of);

class Pool;
// A round's start (Adder.begin's arguments, rem_chunk_tokens None where !has_chunk).
struct RoundIn {
    double ratio = 0.0, total_offset = 0.0, current_offset = 0.0;
    int64_t rem_input = 0;
    bool has_chunk = false;
    int64_t rem_chunk = 0;
    bool has_new_chunked = false, exclusive = false;
    int64_t slots = 0;
    bool running = false, has_chunked_req = false, batch_is_full = false;
};
// What Adder.round answers: admit's (positions, new chunked request or None, the request
// tried and not admitted or None), the budgets after and the batch's fullness after.
struct RoundOut {
    nanobind::list positions;
    nanobind::object chunked, failed;
    Budget b;
    bool batch_is_full = false;
};
// Adder.round on the native adder `adder` (a _core.Adder): begin(in), each of `can_run`'s
// admissions so far added as a member, then admit (adder.cpp documents it).
RoundOut adder_round(nanobind::handle adder, const RoundIn& in, nanobind::handle tree,
                     Pool& pool, nanobind::handle order, nanobind::list waiting,
                     nanobind::handle deferred, nanobind::list can_run);
}  // namespace radixsched
