// SGLang-compat matching of a whole waiting queue in one native call: what the reference
// queue's match_all (radixsched/queue.py, its node-matching branch) does per request with
// NativeRadixCache.match_node, over the native tree, in list order.
#pragma once

#include <nanobind/nanobind.h>

#include <utility>

namespace radixsched {

class Tree;

// A Python Tree's native tree.
using TreeRef = Tree* (*)(nanobind::handle);

// Binds match_nodes(tree, reqs, ends, disabled, namespace_id) -> (device lengths, ends or
// None): for each request of `reqs` (a list), Tree::walk_into over its fill tokens (prompt_ids,
// then output_ids) in its namespace (0 when extra_key and cache_salt are both None, else
// namespace_id((extra_key, cache_salt))); a disabled cache or an empty key: (root, 0) without a
// walk (no clock tick). Sets prefix_len = the length, last_node = the node, host_hit_len = 0,
// num_matched_prefix_tokens = min(length, fill_len - 1); `ends`: also (node, len(node)) each.
// Also binds compat_dedup(reqs, device, check, threshold) -> rids: WaitingQueue.dedup under SGLang
// compat (device: each request's device match; the candidates, those at most `check`; with
// `threshold` <= 0 all of them, else every member of a (namespace, first `threshold` fill
// tokens) group but its first, in list order).
void bind_compat_match(nanobind::module_& m, TreeRef tree_of);

// Binds compat_round: SGLang's whole compat round of spf or dfs-weight (compat_round.hpp);
// `tree_of`: a Python Tree's native tree and the matcher listening to it (null: none).
class Matcher;
void bind_compat_round(nanobind::module_& m,
                       std::pair<Tree*, Matcher*> (*tree_of)(nanobind::handle));

}  // namespace radixsched
