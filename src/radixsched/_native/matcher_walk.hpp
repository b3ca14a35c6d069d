// The matcher's own walk to a match's end (Tree::match_end's answer, the same nodes and
// lengths), over the tree's public parts only, with raw pointers (no reference-count traffic
// per step). Many walks run together (walk_all): a child lookup that finds a child is cached
// for the others (requests under one system prompt or document look up the same few edges),
// and the lookups the cache cannot answer (mostly the miss at each request's end) are done
// side by side, so that their cache misses overlap instead of stalling one walk each.
//
// Valid only while the tree does not change: the matcher walks during a refresh, which
// changes nothing in the tree.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "radix.hpp"

namespace radixsched {

struct WalkEnd {
    int64_t length = 0;
    Node* node = nullptr;  // where the match ends (the root when nothing matched)
    int64_t offset = 0;  // tokens into `node`
};

// One request's walk: Tree::match_end(tokens, n, ns, start, depth) (`start` null: the root).
struct Walk {
    const int32_t* tokens = nullptr;
    int64_t n = 0;
    int32_t ns = 0;
    Node* start = nullptr;
    int64_t depth = 0;
    WalkEnd end;  // the answer, once done
    // Its state: the last node covered and the depth after it; `child`, when `have`, is the
    // lookup's answer at (node, tokens + pos) (null: no such child).
    Node* node = nullptr;
    int64_t pos = 0;
    Node* child = nullptr;
    bool have = false;
    bool done = false;
};

// (parent, ns at the root, first page) -> the child found there; entries are checked in full
// on every hit, so a collision only costs a lookup in the tree. Valid for one walk_all (the
// tree may change between two): `clear` forgets every entry at once (a slot counts only when
// stamped with the current epoch), so that one cache serves every round without a refill.
class ChildCache {
public:
    bool peek(const Tree& tree, Node& parent, const int32_t* page, int32_t ns, Node*& child) const;
    void put(const Tree& tree, Node& parent, int32_t ns, Node* child);
    void clear();

private:
    struct Slot {
        Node* parent = nullptr;
        Node* child = nullptr;
        int32_t ns = 0;
        uint32_t epoch = 0;  // the cache's epoch when it was put (0: never)
    };
    static constexpr size_t kSlots = 512;
    static size_t slot_of(const Node& parent, int32_t page0, int32_t key_ns);
    std::array<Slot, kSlots> slots_{};
    uint32_t epoch_ = 1;
};

// walk_all's buffers, kept across calls (the matcher's, one per round).
struct WalkScratch {
    ChildCache cache;
    std::vector<Walk*> waiting, next;
};

// `w` to its end (as Tree::match_end gives it).
void walk_one(const Tree& tree, Walk& w);
// Every walk of `walks` to its end, together.
void walk_all(const Tree& tree, std::vector<Walk>& walks, WalkScratch& scratch);

// The tree's key of `parent`'s child whose first page is `page` (Tree::page_key), into `out`
// (its buffer reused).
void page_key_into(const Tree& tree, std::string& out, const int32_t* page, const Node* parent,
                   int32_t ns);

}  // namespace radixsched
