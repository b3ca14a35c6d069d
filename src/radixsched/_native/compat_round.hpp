// SGLang's compat round of a cache-aware policy whose order is a native one here
// (shortest-prefill-first's sort, dfs-weight's tree order): what the reference queue's
// begin_round does (radixsched/queue.py: match_all's node matching, the compat dedup, then
// the order), over the native tree, in one call.
#pragma once

#include <nanobind/nanobind.h>

#include "compat_match.hpp"

namespace radixsched {

// bind_compat_round (declared in compat_match.hpp, which module.cpp includes) binds
// compat_round(tree, reqs, keys, disabled, namespace_id, dedup, check, threshold, order) ->
// (deferred, ordered):
// 1. every request of `reqs` (a list), in list order, node-matched as the reference loop
//    matches it (the same clock tick, touches, split, and prefix_len, last_node, host_hit_len
//    and num_matched_prefix_tokens set): a request the tree's matcher tracks, from its memo
//    (current: the matcher's dirty ones are re-matched first; a split re-points memos, so
//    they stay current through the round): Tree::touch_at where it ends, which is the walk's
//    effect on the tree; any other request by its walk (Tree::walk_into, as match_nodes).
//    `keys` (a CompatKeys, or None): for each tracked request, what its fill gave when it was
//    put (fill_len, Req.namespace, the first `width` tokens; width = `threshold`), read
//    instead of the request's own fields (put again whenever its fill changes: the
//    matcher's contract, native/matching.py);
// 2. with `dedup`, the compat dedup over those matches (as compat_dedup: the candidates, a
//    device match at most `check`; `threshold` <= 0: all of them, else every member of a
//    (namespace, first `threshold` fill tokens) group but its first): `deferred`, a frozenset
//    of their rids (else an empty one);
// 3. the order, `reqs` reordered in place: order 1 = spf_sglang's stable sort by
//    (rid in deferred, max(1, fill_len - num_matched_prefix_tokens), queue_entry_time); 2 =
//    dfs_weight_sglang's (Tree::dfs_weight_order_at over each match's (node, len(node)) as
//    its touch or walk left it); 0 = none. `ordered` is False, and the list untouched, where
//    a queue_entry_time is not a float or an int of at most 2**53 in magnitude, or is NaN
//    (Python's comparisons there are not a double's: the caller sorts).

}  // namespace radixsched
