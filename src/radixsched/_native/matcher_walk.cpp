// See matcher_walk.hpp. Every step mirrors Tree::match_end (radix.cpp).
#include "matcher_walk.hpp"

#include <algorithm>
#include <cstring>

namespace radixsched {

void page_key_into(const Tree& tree, std::string& out, const int32_t* page, const Node* parent,
                   int32_t ns) {
    const size_t bytes = static_cast<size_t>(tree.page_size()) * sizeof(int32_t);
    if (parent == tree.root().get() && ns != 0) {
        out.resize(sizeof(int32_t) + bytes);
        std::memcpy(out.data(), &ns, sizeof(int32_t));
        std::memcpy(out.data() + sizeof(int32_t), page, bytes);
    } else {
        out.assign(reinterpret_cast<const char*>(page), bytes);
    }
}

namespace {

bool covers(const int32_t* tokens, int64_t avail, const Node& node) {
    const int64_t k = node.size();
    return avail >= k && std::memcmp(tokens, node.key.data(), k * sizeof(int32_t)) == 0;
}

int64_t mismatch(const int32_t* tokens, int64_t avail, const Node& node, int64_t page) {
    const int64_t n = std::min(avail, node.size());
    const int32_t* key = node.key.data();
    // The first differing token: whole blocks compared at once, then token by token inside
    // the first block that differs (or the tail shorter than a block).
    constexpr int64_t kBlock = 32;
    int64_t m = 0;
    while (m + kBlock <= n && std::memcmp(tokens + m, key + m, kBlock * sizeof(int32_t)) == 0)
        m += kBlock;
    while (m < n && tokens[m] == key[m]) ++m;
    return m - m % page;
}

int32_t key_ns(const Tree& tree, const Node& parent, int32_t ns) {
    return &parent == tree.root().get() ? ns : 0;  // below the root, the key is the page alone
}

// match_end's start: done at once, or waiting for the lookup at (node, pos).
void begin(const Tree& tree, Walk& w) {
    Node* root = tree.root().get();
    if (tree.disabled()) {
        w.end = {0, root, 0};
        w.done = true;
        return;
    }
    const int64_t page = tree.page_size();
    w.n -= w.n % page;
    w.node = w.start != nullptr ? w.start : root;
    w.pos = w.start != nullptr ? w.depth : 0;
    if (w.pos >= w.n) {
        w.end = w.n ? WalkEnd{w.pos, w.node, w.node->size()} : WalkEnd{0, root, 0};
        w.done = true;
    }
}

// match_end's loop from the walk's state, until its end or a lookup the cache cannot answer.
void run(const Tree& tree, Walk& w, const ChildCache* cache) {
    const int64_t page = tree.page_size();
    while (true) {
        if (!w.have &&
            (cache == nullptr || !cache->peek(tree, *w.node, w.tokens + w.pos, w.ns, w.child)))
            return;
        w.have = false;
        Node* child = w.child;
        if (child == nullptr) {
            w.end = {w.pos, w.node, w.node->size()};
            w.done = true;
            return;
        }
        if (!covers(w.tokens + w.pos, w.n - w.pos, *child)) {
            const int64_t m = mismatch(w.tokens + w.pos, w.n - w.pos, *child, page);
            w.end = {w.pos + m, child, m};
            w.done = true;
            return;
        }
        w.node = child;
        w.pos += child->size();
        if (w.pos == w.n) {
            w.end = {w.pos, w.node, w.node->size()};
            w.done = true;
            return;
        }
    }
}

}  // namespace

size_t ChildCache::slot_of(const Node& parent, int32_t page0, int32_t key_ns) {
    uint64_t h = reinterpret_cast<uintptr_t>(&parent) ^ static_cast<uint32_t>(page0);
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(key_ns)) << 32;
    h *= 0x9e3779b97f4a7c15ULL;
    return static_cast<size_t>(h >> 55) % kSlots;
}

bool ChildCache::peek(const Tree& tree, Node& parent, const int32_t* page, int32_t ns,
                      Node*& child) const {
    const int32_t kns = key_ns(tree, parent, ns);
    const Slot& s = slots_[slot_of(parent, page[0], kns)];
    const size_t bytes = static_cast<size_t>(tree.page_size()) * sizeof(int32_t);
    if (s.epoch != epoch_ || s.parent != &parent || s.ns != kns ||
        std::memcmp(s.child->key.data(), page, bytes) != 0)
        return false;
    child = s.child;  // the child whose key is this page (and ns, at the root)
    return true;
}

void ChildCache::put(const Tree& tree, Node& parent, int32_t ns, Node* child) {
    if (child == nullptr) return;
    const int32_t kns = key_ns(tree, parent, ns);
    slots_[slot_of(parent, child->key.first_item(), kns)] = Slot{&parent, child, kns, epoch_};
}

void ChildCache::clear() {
    if (++epoch_ != 0) return;
    slots_.fill(Slot{});  // the epoch wrapped: no slot may carry a reused stamp
    epoch_ = 1;
}

namespace {

// The child of the tree's lookup that `w` waits for (Tree::find_child_ptr's: the node's
// child index, its namespace the walk's under the root, none below).
int32_t lookup_ns(const Tree& tree, const Walk& w) { return w.node == tree.root().get() ? w.ns : 0; }

Node* lookup(const Tree& tree, const Walk& w) {
    return w.node->index.get(w.tokens + w.pos, tree.page_size(), lookup_ns(tree, w));
}

// Loads (into the cache) the home entry of the tree's child lookup that `w` waits for.
void touch_bucket(const Tree& tree, const Walk& w) {
    const ChildIndex& index = w.node->index;
    if (index.size() == 0) return;
    __builtin_prefetch(index.home(ChildIndex::hash(w.tokens + w.pos, tree.page_size(),
                                                   lookup_ns(tree, w))));
}

// Starts loading the next tokens `w` compares (requests' tokens are many and cold; the next
// walk's load overlaps this one's comparisons).
void prefetch_tokens(const Walk& w) {
    constexpr int64_t kTokens = 1024;  // 4 KiB: a page's worth
    constexpr int64_t kLine = 64 / sizeof(int32_t);
    const int64_t end = std::min(w.n, w.pos + kTokens);
    for (int64_t i = w.pos; i < end; i += kLine) __builtin_prefetch(w.tokens + i);
}

}  // namespace

void walk_one(const Tree& tree, Walk& w) {
    begin(tree, w);
    while (!w.done) {
        run(tree, w, nullptr);
        if (w.done) break;
        w.child = lookup(tree, w);
        w.have = true;
    }
}

void walk_all(const Tree& tree, std::vector<Walk>& walks, WalkScratch& scratch) {
    constexpr size_t kAhead = 8;  // lookups in flight
    if (walks.size() <= 2) {  // too few to share lookups: not worth a cache
        for (Walk& w : walks) walk_one(tree, w);
        return;
    }
    ChildCache& cache = scratch.cache;
    cache.clear();
    std::vector<Walk*>& waiting = scratch.waiting;
    std::vector<Walk*>& next = scratch.next;
    waiting.clear();
    for (Walk& w : walks) {
        begin(tree, w);
        if (!w.done) waiting.push_back(&w);
    }
    while (!waiting.empty()) {
        next.clear();
        for (size_t j = 0; j < waiting.size(); ++j) {  // as far as the cache answers
            if (j + 1 < waiting.size()) prefetch_tokens(*waiting[j + 1]);
            Walk* w = waiting[j];
            run(tree, *w, &cache);
            if (!w->done) next.push_back(w);
        }
        // The tree's lookups, each bucket touched kAhead lookups early so that their cache
        // misses overlap (the ones the cache answers by now need no touch).
        Node* found = nullptr;
        for (size_t i = 0; i < next.size(); ++i) {
            if (i + kAhead < next.size()) {
                const Walk& a = *next[i + kAhead];
                if (!cache.peek(tree, *a.node, a.tokens + a.pos, a.ns, found))
                    touch_bucket(tree, a);
            }
            Walk& w = *next[i];
            if (!cache.peek(tree, *w.node, w.tokens + w.pos, w.ns, w.child)) {
                w.child = lookup(tree, w);
                cache.put(tree, *w.node, w.ns, w.child);
            }
            w.have = true;
        }
        std::swap(waiting, next);
    }
}

}  // namespace radixsched
