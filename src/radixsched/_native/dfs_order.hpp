// dfs-weight's order kept across rounds (native/orders.py's DfsWeightEngine wraps it), reading
// the native tree and the matcher's memos directly: no Python call per request but for the
// deferred test.
//
// Below a *base* node B that every member's match passes through or ends above (the deepest
// such node when the order was last rebuilt; the root at worst), the DFS visits B's children
// by descending member count, ties by their place among B's children (Node::slot), each
// child's subtree as a DFS of its own members, then the members whose match ends at or above
// B, deepest first; deferred members go last. So the order is a stable sort by
//   (deferred, 0, -count(C), C.slot, position in C's own DFS)  for a member under child C,
//   (deferred, 1, -matched length)                             for the others,
// kept in a StableOrder. A child's own order (its segment) is recomputed only when a member
// joined, left or moved under it; a member outside B's subtree, a detached B or a re-key of
// much of the list rebuilds everything (advance returns false: the caller rebuilds).
//
// Invariants: every member of `order_` has an entry in `members_` and none else; a member
// with a child (`has_top`) is in `groups_[top]`, and `count_[top]` is the count its key was
// made with unless `top` is in `touched_` (re-segmented by the next advance).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "adder.hpp"  // TreeOf
#include "order.hpp"
#include "radix.hpp"

namespace radixsched {

class Matcher;

class DfsWeightOrder {
public:
    DfsWeightOrder(nanobind::object tree, TreeOf tree_of);

    nanobind::list reqs() const { return order_.reqs; }
    size_t size() const { return order_.size(); }
    // Insert `r` at position j of the list as a member above the base, of no child's group:
    // the next advance re-keys it (the caller lists it as changed). False: it cannot stand
    // there (nothing changed).
    bool place(nanobind::handle r, int64_t j);
    void remove(nanobind::handle r);
    // Orders `queue` (a list) as the reference round does, around a new base.
    void rebuild(nanobind::handle queue, nanobind::handle deferred);
    // Re-key `changed` members and place `arrivals` (`queue`: the members, then the arrivals,
    // edited in place). False: the caller must rebuild (the state is then to be rebuilt).
    bool advance(nanobind::handle changed, nanobind::handle arrivals, nanobind::handle deferred,
                 nanobind::handle queue);
    // The same over the lists' items (borrowed: the caller holds them; queue_round's call).
    bool advance_items(const std::vector<PyObject*>& moved, const std::vector<PyObject*>& news,
                       nanobind::handle deferred, nanobind::handle queue);
    // Test hooks: the base node, a member's child slot (None: at or above the base), and how
    // many advances (a declined one included), rebuilds and places it has run.
    NodePtr base() const { return base_; }
    nanobind::object top_of(nanobind::handle r) const;
    struct Calls {
        int64_t advance = 0, rebuild = 0, place = 0;
    };
    const Calls& calls() const { return calls_; }

private:
    struct End {
        Node* node;
        int64_t offset;  // into node (its size: at its end)
        int64_t depth;   // the matched length
    };
    struct Member {
        bool has_top = false;
        int64_t top = 0;  // the slot of the base's child its match goes through
        int64_t segpos = -1;  // its place in that child's own DFS (-1: none yet)
    };
    struct Fit {
        bool fits;
        bool has_top;
        int64_t top;
    };
    using Group = std::unordered_set<PyObject*>;

    Tree& tree() const;
    End end(PyObject* r) const;  // where r's match ends (its memo)
    Fit child_of_base(PyObject* r) const;
    bool is_above_base(const Node* node) const;
    NodePtr lca(nanobind::handle queue) const;
    void join(PyObject* r, bool has_top, int64_t top);
    void leave(PyObject* r);
    void segment(int64_t top, const std::vector<PyObject*>& reqs);
    Atoms key(PyObject* r, nanobind::handle deferred) const;
    // The re-segmenting of every touched child (the members re-keyed go to `rekey`).
    void resegment(const std::unordered_set<PyObject*>& fresh,
                   const std::vector<PyObject*>& arrivals, std::vector<PyObject*>& rekey);

    nanobind::object tree_obj_;  // keeps the tree alive
    TreeOf tree_of_;
    StableOrder order_;
    NodePtr base_;
    std::unordered_map<PyObject*, Member> members_;
    std::unordered_map<int64_t, Group> groups_;  // members per child of the base (by slot)
    std::unordered_map<int64_t, int64_t> count_;  // the count each child's keys were made with
    std::unordered_set<int64_t> touched_;
    Calls calls_;
};

void bind_dfs_order(nanobind::module_& m, TreeOf tree_of);

}  // namespace radixsched
