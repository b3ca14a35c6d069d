// See optimal.hpp.
#include "optimal.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {

namespace {

// The length of the common prefix of a[0, n) and b[0, n): whole chunks by memcmp (vectorised
// by the C library), then the chunk where they differ token by token.
int64_t common(const int32_t* a, const int32_t* b, int64_t n) {
    constexpr int64_t kChunk = 64;
    int64_t i = 0;
    while (i + kChunk <= n && std::memcmp(a + i, b + i, kChunk * sizeof(int32_t)) == 0) i += kChunk;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

}  // namespace

uint32_t SpanTrie::add(const int32_t* key, int64_t len) {
    if (nodes_.size() >= std::numeric_limits<uint32_t>::max())
        throw std::length_error("optimal_prefixes: more than 2^32 trie nodes");
    nodes_.push_back(Node{key, len});
    return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t SpanTrie::root(int64_t ns) {
    auto it = roots_.find(ns);
    if (it != roots_.end()) return it->second;
    const uint32_t r = add(nullptr, 0);
    roots_.emplace(ns, r);
    return r;
}

int64_t SpanTrie::insert(const int32_t* seq, int64_t n, int64_t ns) {
    uint32_t node = root(ns);
    int64_t at = 0;
    while (at < n) {
        auto it = child_.find(edge(node, seq[at]));
        if (it == child_.end()) {  // nothing here starts with seq[at]: the rest is a new leaf
            const uint32_t leaf = add(seq + at, n - at);
            child_.emplace(edge(node, seq[at]), leaf);
            return at;
        }
        const uint32_t next = it->second;
        const Node span = nodes_[next];
        const int64_t most = std::min(span.len, n - at);
        const int64_t m = common(span.key, seq + at, most);
        at += m;
        if (m == span.len) {
            node = next;
            continue;
        }
        if (at == n) return at;  // seq ends inside the span: a prefix of what is there
        // Split: the span's first m tokens become a node between `node` and `next`.
        const uint32_t mid = add(span.key, m);
        it->second = mid;
        nodes_[next].key = span.key + m;
        nodes_[next].len = span.len - m;
        child_.emplace(edge(mid, span.key[m]), next);
        const uint32_t leaf = add(seq + at, n - at);
        child_.emplace(edge(mid, seq[at]), leaf);
        return at;
    }
    return at;
}

void bind_optimal(nb::module_& m) {
    using Seq = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    m.def(
        "optimal_prefixes",
        [](const std::vector<Seq>& seqs, const std::vector<int64_t>& namespaces) {
            if (seqs.size() != namespaces.size())
                throw std::invalid_argument("optimal_prefixes: one namespace per sequence");
            std::vector<int64_t> out(seqs.size());
            {
                nb::gil_scoped_release nogil;  // the list holds the arrays for the call
                SpanTrie trie;
                for (size_t i = 0; i < seqs.size(); ++i)
                    out[i] = trie.insert(seqs[i].data(), static_cast<int64_t>(seqs[i].shape(0)),
                                         namespaces[i]);
            }
            return out;
        },
        "seqs"_a, "namespaces"_a,
        "Each int32 sequence's longest common prefix with the earlier ones of its namespace, "
        "in the order given (results.optimal's bound; optimal.hpp)");
}

}  // namespace radixsched
