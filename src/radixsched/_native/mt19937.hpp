// CPython's Mersenne Twister (Modules/_randommodule.c, 3.11) and `_randbelow`
// (Lib/random.py's `_randbelow_with_getrandbits`), over a state held elsewhere: the 624 words
// and the index of the next word to temper (624: the block is spent, the next draw
// regenerates it), as `Random.getstate()` lists them and as `_random.Random` stores them.
//
// - genrand_uint32: regenerate the block when the index is 624, then temper word `index++`;
// - getrandbits(k), 0 < k <= 32: genrand_uint32() >> (32 - k);
// - _randbelow(n), n > 0: k = n.bit_length(), then r = getrandbits(k) until r < n.
#pragma once

#include <cstddef>
#include <cstdint>

namespace radixsched::mt {

constexpr size_t kWords = 624;

// Matsumoto and Nishimura's recurrence over the whole block (CPython's loop, in one).
inline void regenerate(uint32_t* mt) {
    constexpr size_t kShift = 397;
    for (size_t k = 0; k < kWords; ++k) {
        const uint32_t y = (mt[k] & 0x80000000U) | (mt[(k + 1) % kWords] & 0x7fffffffU);
        mt[k] = mt[(k + kShift) % kWords] ^ (y >> 1) ^ ((y & 1U) != 0 ? 0x9908b0dfU : 0U);
    }
}

// genrand_uint32 on the block `mt` and its index (in [0, 624]).
template <class Index>
uint32_t next(uint32_t* mt, Index& index) {
    if (index >= static_cast<Index>(kWords)) {
        regenerate(mt);
        index = 0;
    }
    uint32_t y = mt[index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    return y ^ (y >> 18);
}

// _randbelow(bound) for bound in [1, 2^32): k = bound.bit_length() <= 32.
template <class Index>
uint32_t below(uint32_t* mt, Index& index, uint32_t bound) {
    const int k = 32 - __builtin_clz(bound);
    uint32_t r = 0;
    do {
        r = next(mt, index) >> (32 - k);
    } while (r >= bound);
    return r;
}

}  // namespace radixsched::mt
