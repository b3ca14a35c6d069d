// Mooncake trace prompts built in one pass (radixsched/sim/workloads/traces.py: _fill_mooncake,
// _block_table, _gather, and tokens.py's _hash_tokens for the padding): a prompt is its blocks'
// tokens, then its line's padding past the last block.
//
// Bit for bit: every token is the same uint64 arithmetic as the numpy path (wrapping
// multiplies, SplitMix64 of sim/cost/splitmix.py), the remainder is exact (numpy's
// z - (z // v) * v on unsigned integers is z % v), and the int32 store truncates as numpy's
// unsafe cast of the uint64 does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nanobind {
class module_;
}

namespace radixsched {

// z % d for a divisor fixed across many calls: q = mulhi(z, floor((2^64-1)/d)) is q_true or
// q_true - 1 (the reciprocal is short of 2^64/d by at most 1, so the product is short of z/d
// by less than 1), so one conditional subtraction makes the remainder exact. d >= 1.
struct Modulus {
    uint64_t d;
    uint64_t m;
    explicit Modulus(uint64_t divisor) : d(divisor), m(UINT64_MAX / divisor) {}
    uint64_t mod(uint64_t z) const {
        const auto q = static_cast<uint64_t>((static_cast<unsigned __int128>(z) * m) >> 64);
        const uint64_t r = z - q * d;  // in [0, 2d): exact in uint64 while d < 2^63
        return r >= d ? r - d : r;
    }
};

struct MooncakeShape {
    uint64_t block_salt;  // tokens._key(_SALT_BLOCK)
    uint64_t pad_key;     // tokens._key(_SALT_PAD, line): the request's own padding
    size_t block;         // tokens a block holds, >= 1
    uint64_t vocab;       // >= 1, < 2^63
};

// out[0, n): the first min(nids, n / block) blocks whole, the next one cut to what is left
// (when ids has one), then the padding: position p's token mod(splitmix64(p * golden ^ pad)).
// A block id's token at position p: mod(splitmix64(splitmix64(id ^ salt) ^ p * golden)).
void fill_mooncake_prompt(int32_t* out, size_t n, const int64_t* ids, size_t nids,
                          const MooncakeShape& s);

// radixsched._core.mooncake_prompt(out, ids, block_salt, pad_key, block, vocab), and
// hash_tokens(out, key, first, vocab): position p's token mod(splitmix64(p * golden ^ key)) for
// p in [first, first + len(out)) (tokens._hash_tokens: the padding, generated prompts).
void bind_prompts(nanobind::module_& m);

}  // namespace radixsched
