// See kv.hpp; mirrors KVManager.alloc / checkpoint (radixsched/kv.py).
#include "kv.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace radixsched {

bool alloc_evicting(Tree& tree, Pool& pool, int64_t* out, int64_t n) {
    const int64_t short_by = n - pool.available_size();
    if (short_by > 0) return pool.recycle_into(tree.evict(short_by), out, n);
    return pool.alloc_into(out, n);
}

NodePtr checkpoint(Tree& tree, Pool& pool, const Checkpoint& c) {
    const bool from_lock = c.lock != nullptr && c.lock != tree.root().get();
    const int64_t start = from_lock ? c.lo : 0;
    if (c.start != start || c.n_tokens != c.aligned - start || c.lo < 0 || c.aligned <= c.lo ||
        c.row_len < c.aligned)
        throw std::invalid_argument(
            "checkpoint: tokens from " + std::to_string(c.start) + " (" +
            std::to_string(c.n_tokens) + ") and a row of " + std::to_string(c.row_len) +
            " do not cover [" + std::to_string(c.lo) + ", " + std::to_string(c.aligned) + ")");
    const WalkResult res =
        from_lock ? tree.insert(c.tokens, c.n_tokens, c.ns, c.row + c.lo, c.aligned - c.lo,
                                c.priority, c.inserted_len, c.lock, c.lo, c.lo)
                  : tree.insert(c.tokens, c.n_tokens, c.ns, c.row, c.aligned, c.priority,
                                c.inserted_len, nullptr, 0, 0);
    NodePtr node = res.node;
    if (res.length != c.lo || tree.disabled()) {
        // Some of it was cached already: re-match the whole key from the root (its path to
        // the lock is the request's first lo tokens) and use the cache's copies.
        std::vector<int32_t> key;
        if (from_lock) {
            key = tree.path_key(*c.lock);
            if (static_cast<int64_t>(key.size()) != c.lo)
                throw IntegrityFailure("checkpoint: the lock's depth is not the protected length");
        }
        key.insert(key.end(), c.tokens, c.tokens + c.n_tokens);
        std::vector<int64_t> values;
        const WalkResult m = tree.walk(key.data(), c.aligned, c.ns, &values);
        if (m.length < c.aligned) return nullptr;  // the cache did not keep it
        const int64_t dup_end = std::min(res.length, c.aligned);
        if (dup_end > c.lo) {
            pool.free(c.row + c.lo, dup_end - c.lo, true);
            std::copy(values.begin() + c.lo, values.begin() + dup_end, c.row + c.lo);
        }
        node = m.node;
    }
    tree.move_lock(c.lock, *node);
    return node;
}

}  // namespace radixsched
