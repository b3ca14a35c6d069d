// See prompts.hpp. Each step names the numpy line of traces.py / tokens.py it replaces.
#include "prompts.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RADIXSCHED_AVX512_TOKENS 1
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// sim/cost/splitmix.py: splitmix64 (wrapping uint64 arithmetic).
inline uint64_t splitmix64(uint64_t z) {
    z += kGolden;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// tokens._mod_into's `out[...] = z`: numpy's unsafe uint64 -> int32 cast keeps the low 32 bits.
inline int32_t token(uint64_t z, const Modulus& md) {
    return static_cast<int32_t>(static_cast<uint32_t>(md.mod(splitmix64(z))));
}

// Below this divisor the vector path's remainder is exact (see tokens_avx512).
constexpr uint64_t kVectorVocab = 1ULL << 20;

#ifdef RADIXSCHED_AVX512_TOKENS
// tokens()'s first count - count % 8 tokens, eight at a time; returns how many it wrote. The
// remainder of z by d < 2^20: x = (z >> 32) * (2^32 mod d) + (z & (2^32 - 1)) is z mod d
// modulo d and below 2^53, so it converts to double exactly; floor(x * (1/d)) is the quotient
// or one off it (the product's relative error is ~2^-52, the quotient below 2^33), and
// x - q * d (exact: every term an integer below 2^53) is moved into [0, d) by one add or
// subtract of d. (GCC 12's AVX-512 headers seed results with self-initialised "undefined"
// vectors, which -Wmaybe-uninitialized flags inside every function that inlines them.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512dq"))) size_t tokens_avx512(int32_t* out, size_t count,
                                                                   uint64_t base, uint64_t first,
                                                                   uint64_t d) {
    const __m512i golden = _mm512_set1_epi64(static_cast<long long>(kGolden));
    const __m512i mix1 = _mm512_set1_epi64(static_cast<long long>(0xBF58476D1CE4E5B9ULL));
    const __m512i mix2 = _mm512_set1_epi64(static_cast<long long>(0x94D049BB133111EBULL));
    const __m512i key = _mm512_set1_epi64(static_cast<long long>(base));
    const __m512i low32 = _mm512_set1_epi64(0xFFFFFFFFLL);
    const __m512i wrap = _mm512_set1_epi64(static_cast<long long>((1ULL << 32) % d));
    const __m512d dd = _mm512_set1_pd(static_cast<double>(d));
    const __m512d inv = _mm512_set1_pd(1.0 / static_cast<double>(d));
    const __m512d zero = _mm512_setzero_pd();
    __m512i pos = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first)),
                                   _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
    const __m512i eight = _mm512_set1_epi64(8);
    size_t i = 0;
    for (; i + 8 <= count; i += 8, pos = _mm512_add_epi64(pos, eight)) {
        __m512i z = _mm512_xor_si512(key, _mm512_mullo_epi64(pos, golden));
        z = _mm512_add_epi64(z, golden);  // splitmix64
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), mix1);
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), mix2);
        z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
        const __m512i x = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(z, 32), wrap),
                                           _mm512_and_si512(z, low32));
        const __m512d xd = _mm512_cvtepu64_pd(x);
        const __m512d q =
            _mm512_roundscale_pd(_mm512_mul_pd(xd, inv), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        __m512d r = _mm512_fnmadd_pd(q, dd, xd);
        r = _mm512_mask_add_pd(r, _mm512_cmp_pd_mask(r, zero, _CMP_LT_OQ), r, dd);
        r = _mm512_mask_sub_pd(r, _mm512_cmp_pd_mask(r, dd, _CMP_GE_OQ), r, dd);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvttpd_epi32(r));
    }
    return i;
}
#pragma GCC diagnostic pop

bool has_avx512() {
    static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    return has;
}
#endif

// out[i] = token(base ^ (first + i) * golden) for i in [0, count): a block's row (base
// splitmix64(id ^ salt), first 0: _block_table) or the padding (base the pad key, first the
// position it starts at: _hash_tokens).
void tokens(int32_t* out, size_t count, uint64_t base, uint64_t first, const Modulus& md) {
    size_t i = 0;
#ifdef RADIXSCHED_AVX512_TOKENS
    if (md.d < kVectorVocab && has_avx512()) i = tokens_avx512(out, count, base, first, md.d);
#endif
    for (; i < count; ++i) out[i] = token(base ^ ((first + i) * kGolden), md);
}

// _block_table's row for one id, its first m tokens.
void block_tokens(int32_t* out, size_t m, int64_t id, const MooncakeShape& s, const Modulus& md) {
    tokens(out, m, splitmix64(static_cast<uint64_t>(id) ^ s.block_salt), 0, md);
}

}  // namespace

void fill_mooncake_prompt(int32_t* out, size_t n, const int64_t* ids, size_t nids,
                          const MooncakeShape& s) {
    const Modulus md(s.vocab);
    const size_t full = std::min(nids, n / s.block);  // _gather's full blocks
    size_t at = 0;
    for (size_t k = 0; k < full; ++k, at += s.block) block_tokens(out + at, s.block, ids[k], s, md);
    if (full < nids && at < n) {  // the last block, cut to the prompt's length
        const size_t m = std::min(s.block, n - at);
        block_tokens(out + at, m, ids[full], s, md);
        at += m;
    }
    if (at < n) tokens(out + at, n - at, s.pad_key, at, md);  // _hash_tokens(pad_key, at, n - at)
}

void bind_prompts(nb::module_& m) {
    using Out = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    using Ids = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    m.def(
        "mooncake_prompt",
        [](Out out, Ids ids, uint64_t block_salt, uint64_t pad_key, int64_t block,
           uint64_t vocab) {
            if (block < 1) throw std::invalid_argument("mooncake_prompt: block must be >= 1");
            if (vocab < 1 || vocab >= (1ULL << 63))
                throw std::invalid_argument("mooncake_prompt: vocab must be in [1, 2^63)");
            const MooncakeShape s{block_salt, pad_key, static_cast<size_t>(block), vocab};
            nb::gil_scoped_release nogil;
            fill_mooncake_prompt(out.data(), out.shape(0), ids.data(), ids.shape(0), s);
        },
        "out"_a, "ids"_a, "block_salt"_a, "pad_key"_a, "block"_a, "vocab"_a,
        "Write a Mooncake prompt into `out` (its length): the blocks of `ids`, then the "
        "padding keyed `pad_key` (traces._fill_mooncake's tokens, prompts.hpp)");
    m.def(
        "mooncake_prompts",
        [](nb::list outs, nb::list ids, nb::list pad_keys, uint64_t block_salt, int64_t block,
           uint64_t vocab) {
            if (block < 1) throw std::invalid_argument("mooncake_prompts: block must be >= 1");
            if (vocab < 1 || vocab >= (1ULL << 63))
                throw std::invalid_argument("mooncake_prompts: vocab must be in [1, 2^63)");
            const size_t n = outs.size();
            if (ids.size() != n || pad_keys.size() != n)
                throw std::invalid_argument("mooncake_prompts: one id list and key a prompt");
            // Every argument read while the GIL is held (the arrays kept alive by the lists),
            // then all the prompts written without it: one release for the batch.
            std::vector<Out> o;
            std::vector<Ids> d;
            std::vector<uint64_t> k;
            o.reserve(n);
            d.reserve(n);
            k.reserve(n);
            for (size_t i = 0; i < n; ++i) {
                o.push_back(nb::cast<Out>(outs[i]));
                d.push_back(nb::cast<Ids>(ids[i]));
                k.push_back(nb::cast<uint64_t>(pad_keys[i]));
            }
            nb::gil_scoped_release nogil;
            for (size_t i = 0; i < n; ++i) {
                const MooncakeShape s{block_salt, k[i], static_cast<size_t>(block), vocab};
                fill_mooncake_prompt(o[i].data(), o[i].shape(0), d[i].data(), d[i].shape(0), s);
            }
        },
        "outs"_a, "ids"_a, "pad_keys"_a, "block_salt"_a, "block"_a, "vocab"_a,
        "mooncake_prompt of each (out, ids, pad_key) of the lists, in one call that holds the "
        "GIL only to read them");
    m.def(
        "hash_tokens",
        [](Out out, uint64_t key, uint64_t first, uint64_t vocab) {
            if (vocab < 1 || vocab >= (1ULL << 63))
                throw std::invalid_argument("hash_tokens: vocab must be in [1, 2^63)");
            const Modulus md(vocab);
            nb::gil_scoped_release nogil;
            tokens(out.data(), out.shape(0), key, first, md);
        },
        "out"_a, "key"_a, "first"_a, "vocab"_a,
        "Write tokens._hash_tokens(key, first, len(out), vocab) into `out` (prompts.hpp)");
}

}  // namespace radixsched
