// What the simulator's runner computes for a step, shared by the native decode (decode.cpp)
// and prefill (prefill.cpp) steps: the dense roofline's step time and the stand-in tokens
// (sim/cost/roofline.py, sim/cost/runner.py). Every operation is the Python's, in its order,
// on doubles (Python floats) and wrapping uint64 (the masked Python ints), so each result is
// the value Python computes.
#pragma once

#include <cstdint>

namespace radixsched {

// SplitMix64 (sim/cost/splitmix.py), wrapping uint64 arithmetic.
inline uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// The stand-in token at position `p` of a plain request whose rid hashes to `h`
// (CostModelRunner's _stand_in: splitmix64(h ^ (p * golden mod 2**64)) mod vocab).
inline uint64_t stand_in(uint64_t h, uint64_t p, uint64_t vocab) {
    return splitmix64(h ^ (p * 0x9E3779B97F4A7C15ULL)) % vocab;
}

// CostModel._dense_step_s's rates: the one copy of the roofline's step formula.
struct DenseRates {
    double lin;     // _linear_flops_per_token
    double attn;    // _attn_flops_per_pair
    double flops;   // _flops_per_s
    double weight;  // _dense_weight_bytes
    double kv;      // _kv_bytes_all_gpus
    double bytes;   // _bytes_per_s

    // max(compute * factor, memory) + fixed, as _dense_step_s evaluates it: Python's
    // max(a, b) is b only when b > a. `factor` is _efficiency_factor(tokens), `fixed` _fixed_s.
    double step(double tokens, double pairs, double kv_tokens, double factor,
                double fixed) const {
        double compute = (lin * tokens + attn * pairs) / flops;
        compute = compute * factor;
        const double memory = (weight + kv_tokens * kv) / bytes;
        return (memory > compute ? memory : compute) + fixed;
    }
};

}  // namespace radixsched
