// KV accounting around the native tree (NativeKVManager's hot calls, one native call each): an
// allocation that evicts cache leaves when the pool is short, and a request's checkpoint
// (insert its computed KV, free the copies the cache already held, move its lock). Each does
// what radixsched/kv.py's KVManager does, with the same slots in the same places; over a
// counting tree and pool, the same counts (no slot is written: a row's contents are then
// unspecified, only its length counts).
#pragma once

#include <cstdint>

#include "pool.hpp"
#include "radix.hpp"

namespace radixsched {

// std::invalid_argument unless both count (pool.hpp, radix.hpp) or both name slots: every
// call below that takes both checks it first.
void require_same_mode(const Tree& tree, const Pool& pool);

// Slots typed S below: int32_t (the native core's request rows, copied to and from the tree
// and the pool as they are) or int64_t (the Python API's arrays).

// `n` slots into `out`, evicting unlocked leaves first when the pool is short (the evicted
// slots go straight to the allocation: the same slots and free list as free, then alloc).
// False when even that is not enough (the pool then holds what was evicted).
template <class S>
bool alloc_evicting(Tree& tree, Pool& pool, S* out, int64_t n);

// The cache's evict with a native pool: `num_tokens` evicted (Tree::evict's order) and their
// slots freed to `pool` unchecked, as evict_flat then Pool.free(checked=False), without the
// int64 array in between. Returns how many slots were freed.
int64_t evict_free(Tree& tree, Pool& pool, int64_t num_tokens);

template <class S>
struct CheckpointOf {
    const int32_t* tokens;  // the request's fill from position `start` up to `aligned`
    int64_t n_tokens;
    int64_t start;          // lo when `lock` is a node below the root, else 0
    int32_t ns;
    S* row;                 // the request's KV row (at least `aligned` slots)
    int64_t row_len;
    int64_t lo;             // cache_protected_len: row[:lo] are the cache's slots
    int64_t aligned;        // whole pages of computed KV to cache (> lo)
    int64_t priority;
    int64_t inserted_len;
    Node* lock;             // the node the request holds its lock on (may be null)
    const SlotShare* share = nullptr;  // the block `row` lies in, for the leaf to view (or null)
    const SlotShare* key_share = nullptr;  // the prompt `tokens` lie in, for its key (or null)
};

// Insert row[:aligned] under the request's key, point row[lo:dup_end] at the cache's copies
// of what it already held (freeing the request's own), and move the lock to the deepest node.
// Null when the cache did not keep the key (nothing moved then).
template <class S>
NodePtr checkpoint(Tree& tree, Pool& pool, const CheckpointOf<S>& c);
using Checkpoint = CheckpointOf<int64_t>;  // the Python API's (module.cpp)

}  // namespace radixsched

// ---- the binding (kv.cpp) ------------------------------------------------------------------
// radixsched._core.KV: NativeKVManager's per-request moves on a request object, one native call
// each (checkpoint, grow, extend_entry, take_prefix, alloc), reading and writing the request's
// fields as radixsched/kv.py's KVManager does, the row written in place into its buffer.
#include <nanobind/nanobind.h>

#include <initializer_list>
#include <vector>

#include "adder.hpp"

namespace radixsched {

// An instance of a Python slots dataclass built as `cls(*values)` builds it (its generated
// __init__ assigns the fields in order), without running that __init__: `cls.__new__(cls)`,
// then each field set. A class with a __post_init__ (or without its own __init__'s plain
// assignments, which the caller vouches for) is called instead.
class Record {
public:
    Record() = default;
    Record(nanobind::handle cls, std::vector<const char*> fields);
    nanobind::object make(std::initializer_list<nanobind::handle> values) const;
    bool valid() const { return cls_.is_valid(); }

private:
    nanobind::object cls_;
    std::vector<nanobind::object> fields_;  // interned names
    bool call_ = false;                     // call the class (it has a __post_init__)
};

// KVManager.take_prefix: `req`'s row starts with its cached prefix (prefix_len slots from its
// last_node), in a fresh buffer sized for every position it can reach (int32, int64 for a
// pool whose slots do not all fit int32).
void take_prefix(Tree& tree, const Pool& pool, nanobind::handle req);

void bind_kv(nanobind::module_& m, TreeOf tree_of);

// A _core.KV's moves for other native calls (prefill.cpp's fused middle chunks); `kv` must be
// a _core.KV (the cast raises otherwise).
// Free + evictable slots: allocator.available_size() + cache.evictable_size().
int64_t kv_room(nanobind::handle kv);
// NativeKVManager.checkpoint(req, up_to).
void kv_checkpoint(nanobind::handle kv, nanobind::handle req, int64_t up_to);
// What NativeKVManager.extend_entry(req, prefix_len, end) changes for a request with no host hits
// to load (host_hit_len 0, else this raises): its row's slots up to `end` and its kv_len; the
// entry itself is not built.
void kv_extend_slots(nanobind::handle kv, nanobind::handle req, int64_t end);
// NativeKVManager.release(req, cache_kv=cache_kv) (decode.cpp's retire of finished rows).
void kv_release(nanobind::handle kv, nanobind::handle req, bool cache_kv);
// `n` slots claimed from `pool`'s reservation (Pool::claim) straight into req.kv_buf past
// req.kv_row (its head), and kv_row grown over them; the buffer moved first to a new int32
// one of twice the need (at least 64) when too short (decode.cpp's settle).
void append_claimed(nanobind::handle req, Pool& pool, int64_t n);

}  // namespace radixsched
