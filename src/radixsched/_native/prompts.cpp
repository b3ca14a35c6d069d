// See prompts.hpp. Each step names the numpy line of traces.py / tokens.py it replaces.
#include "prompts.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <stdexcept>

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

// _block_table's row for one id: splitmix64(id ^ salt) ^ position * golden, positions [0, m).
void block_tokens(int32_t* out, size_t m, int64_t id, const MooncakeShape& s, const Modulus& md) {
    const uint64_t h = splitmix64(static_cast<uint64_t>(id) ^ s.block_salt);
    for (size_t p = 0; p < m; ++p) out[p] = token(h ^ (static_cast<uint64_t>(p) * kGolden), md);
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
    for (; at < n; ++at)  // _hash_tokens(pad_key, at, n - at): arange * golden ^ key
        out[at] = token((static_cast<uint64_t>(at) * kGolden) ^ s.pad_key, md);
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
}

}  // namespace radixsched
