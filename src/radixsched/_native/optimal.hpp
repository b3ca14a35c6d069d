// The optimal hit rate's exact bound (radixsched/results/optimal.py): in arrival order, each
// sequence's longest common prefix with any earlier sequence of its namespace. The Python
// reference inserts every sequence into a RadixCache of its own; this is the same walk over a
// trie of spans that point into the caller's arrays (no token is copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace nanobind {
class module_;
}

namespace radixsched {

// Invariants: every node but the roots holds a non-empty span of one inserted sequence; a
// node's children start with distinct tokens (the map's key is (node, first token)); the
// spans outlive the trie (the caller keeps the sequences alive while it is in use).
class SpanTrie {
   public:
    // How much of seq[0, n) the trie already held in namespace `ns` (>= 0); the rest is added.
    int64_t insert(const int32_t* seq, int64_t n, int64_t ns);

   private:
    struct Node {
        const int32_t* key;
        int64_t len;
    };
    static uint64_t edge(uint32_t node, int32_t token) {
        return (static_cast<uint64_t>(node) << 32) | static_cast<uint32_t>(token);
    }
    uint32_t root(int64_t ns);
    uint32_t add(const int32_t* key, int64_t len);

    std::vector<Node> nodes_;
    std::unordered_map<int64_t, uint32_t> roots_;
    std::unordered_map<uint64_t, uint32_t> child_;  // edge(parent, first token) -> child
};

// radixsched._core.optimal_prefixes(seqs, namespaces) -> list[int]: SpanTrie::insert of each
// int32 sequence in the order given.
void bind_optimal(nanobind::module_& m);

}  // namespace radixsched
