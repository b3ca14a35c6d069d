// Mooncake trace lines read natively (radixsched/sim/workloads/traces.py: _native_columns):
// a block of lines, each one JSON object of exactly the keys "timestamp", "input_length",
// "output_length" and "hash_ids", each once, in any order, JSON whitespace (space, tab, CR)
// around its tokens; every value a plain non-negative JSON integer (digits only: no sign,
// fraction, exponent or leading zero), the ids in one flat list. Any other line (a float
// timestamp, another key, an escape, a blank line, a number past 2^53) makes the block
// irregular, and the Python reader reads the whole trace: what this parser takes, orjson reads
// as the same numbers (an integer below 2^53 is exact as a double).
#pragma once

#include <cstddef>
#include <cstdint>

namespace nanobind {
class module_;
}

namespace radixsched {

// The block's columns, row by row: stamps[i], inputs[i], outputs[i], counts[i] (line i's
// number of ids), its ids appended to ids. Returns the number of ids written, or -1 where the
// block has other than `rows` lines, a line this parser does not take, or more than `cap`
// ids. Writes at most `rows` rows and `cap` ids.
struct TraceColumns {
    double* stamps;
    int64_t* inputs;
    int64_t* outputs;
    int64_t* counts;
    size_t rows;
    int64_t* ids;
    size_t cap;
};
int64_t parse_mooncake_lines(const char* data, size_t size, const TraceColumns& out);

// radixsched._core.mooncake_lines(block, stamps, inputs, outputs, counts, ids): the above, on
// any bytes-like block (its buffer held), the GIL released while it parses.
void bind_trace_lines(nanobind::module_& m);

}  // namespace radixsched
