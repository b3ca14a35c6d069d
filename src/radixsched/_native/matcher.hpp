// The incremental matcher of the waiting queue (its Python face: native/matching.py), fed
// by the native tree's events directly (no call into Python per tree change): a waiting request
// is re-matched only when the tree changed at its edge (native_matching.py's docstring states
// the invariant); every memo equals a fresh match_end on the Python reference tree.
//
// Requests are keyed by an integer chosen by the caller (Python's id(req)). Their fill tokens
// are borrowed: the caller keeps each tracked request's token array alive and unchanged
// until it untracks or re-tracks it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dedup.hpp"
#include "id_map.hpp"
#include "matcher_walk.hpp"
#include "radix.hpp"

namespace radixsched {

// A dict in insertion order (Python's): re-assigning a present key keeps its place.
template <class K, class V>
class OrderedMap {
public:
    using Item = std::pair<K, V>;
    using iterator = typename std::list<Item>::iterator;  // valid until its key is erased
    V& put(const K& k, V v = V{}) { return put_at(k, std::move(v))->second; }
    iterator put_at(const K& k, V v = V{}) {  // inserts at the end when absent
        auto it = index_.find(k);
        if (it != index_.end()) return it->second;
        items_.emplace_back(k, std::move(v));
        auto last = std::prev(items_.end());
        index_.emplace(k, last);
        return last;
    }
    // Moves the item at `it` to the end (as erase then put would), without a lookup.
    void to_back(iterator it) { items_.splice(items_.end(), items_, it); }
    V* get(const K& k) {
        auto it = index_.find(k);
        return it == index_.end() ? nullptr : &it->second->second;
    }
    bool erase(const K& k) {
        auto it = index_.find(k);
        if (it == index_.end()) return false;
        items_.erase(it->second);
        index_.erase(it);
        return true;
    }
    bool contains(const K& k) const { return index_.count(k) != 0; }
    void reserve(size_t n) { index_.reserve(n); }
    bool empty() const { return items_.empty(); }
    size_t size() const { return items_.size(); }
    void clear() {
        items_.clear();
        index_.clear();
    }
    const std::list<Item>& items() const { return items_; }
    std::vector<K> keys() const {
        std::vector<K> out;
        out.reserve(items_.size());
        for (const auto& kv : items_) out.push_back(kv.first);
        return out;
    }

private:
    std::list<Item> items_;
    std::unordered_map<K, typename std::list<Item>::iterator> index_;
};

// Entries in the order they joined, each holding its slot's index in its field `At` (-1: not
// listed); a left entry's slot is null until the next compaction. No allocation per entry.
template <class E, int64_t E::*At>
class SlotList {
public:
    bool has(const E& e) const { return e.*At >= 0; }
    size_t size() const { return live_; }
    void push(E& e) {  // last, unless listed (it keeps its place)
        if (has(e)) return;
        if (items_.size() > 2 * live_ + 64) compact();
        e.*At = static_cast<int64_t>(items_.size());
        items_.push_back(&e);
        ++live_;
    }
    void drop(E& e) {
        if (!has(e)) return;
        items_.at(static_cast<size_t>(e.*At)) = nullptr;
        e.*At = -1;
        --live_;
    }
    template <class F>
    void each(F&& f) const {
        for (E* e : items_)
            if (e != nullptr) f(*e);
    }
    std::vector<E*> take() {  // every listed entry, in order; the list is then empty
        std::vector<E*> out;
        take_into(out);
        return out;
    }
    void take_into(std::vector<E*>& out) {  // take()'s entries into `out` (its buffer reused)
        out.clear();
        out.reserve(live_);
        for (E* e : items_) {
            if (e == nullptr) continue;
            e->*At = -1;
            out.push_back(e);
        }
        items_.clear();
        live_ = 0;
    }
    void reserve(size_t more) { items_.reserve(items_.size() + more); }

private:
    void compact() {
        std::vector<E*> kept = take();
        for (E* e : kept) push(*e);
    }
    std::vector<E*> items_;
    size_t live_ = 0;
};

using Bucket = OrderedMap<int64_t, char>;  // an edge's registrants, in registration order
using EdgeKeys = OrderedMap<std::string, Bucket>;  // a node's edges, by the next page's key

struct Memo {
    int64_t n = 0;
    NodePtr node;  // where the match ends
    int64_t offset = 0;
    bool full = false;  // ends at node's end
    NodePtr edge_node;  // registered at (edge_node, edge_key); null: not registered
    std::string edge_key;  // "" : the whole aligned fill matched (only an eviction moves it)
    // While registered: where (edges_[edge_node], its edge_key item, this request's item in
    // that bucket), so that a re-match at the same edge moves it last without a lookup.
    EdgeKeys* edge_keys = nullptr;
    EdgeKeys::iterator key_at{};
    Bucket::iterator reg_at{};
};

class Matcher {
public:
    explicit Matcher(Tree& tree);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // `rep`: what the dedup's representative choice reads (when the dedup is on).
    const Memo& track(int64_t k, const int32_t* tokens, int64_t fill_len, int32_t ns,
                      RepInputs rep = {});
    void untrack(int64_t k);
    std::vector<int64_t> refresh();  // the requests whose match moved, in dirty order
    const Memo* memo(int64_t k) const;
    // k's memo and the length of the fill it was tracked with, in one lookup (memo null: k is
    // not tracked).
    struct Tracked {
        const Memo* memo = nullptr;
        int64_t fill_len = 0;
    };
    Tracked tracked(int64_t k) const;
    // min(memo n, fill_len - 1): the matched length a prefill reads (k must be tracked).
    int64_t prefill_match(int64_t k) const;
    bool is_dirty(int64_t k) const;
    bool any_dirty() const { return dirty_.size() != 0; }
    std::vector<int64_t> dirty_keys() const;  // in the order they became dirty
    void on_reset();
    void detach();  // the tree goes away: stop listening
    // The in-batch dedup over the tracked requests (dedup.hpp), kept from now on: turned on
    // while nothing is tracked; it sees every track, untrack and re-match.
    void dedup_on(int64_t check, int64_t width);
    bool has_dedup() const { return dedup_ != nullptr; }
    Dedup& dedup();

private:
    struct Entry {
        const int32_t* tokens;
        int64_t fill_len;
        int32_t ns;
        Memo memo;
        int64_t k = 0;  // its key
        int64_t dirty_at = -1;  // its slot in dirty_
        int64_t tracked_at = -1;  // its slot in tracked_
    };
    struct Hint {
        NodePtr node;
        int64_t depth;
        int64_t klen;
    };

    Walk walk_of(const Entry& e, const Hint* hint) const;  // e's walk (from the hint's node)
    void match(int64_t k, Entry& e);  // matches e (k's entry) afresh
    // Sets e's memo to the match ending at `end` (re-registered where it continues); true
    // when the match (length or end) moved.
    bool settle(int64_t k, Entry& e, const WalkEnd& end);
    void reg(int64_t k, Memo& m);
    void set_edge(const Entry& e, Memo& m) const;  // where `m` registers (m.edge_node, edge_key)
    void file(int64_t k, Memo& m);  // registers k at m's edge
    static void refile(const Memo& m);  // k stays at m's edge: moved last, as unreg + reg do
    void unreg(int64_t k, Memo& m);
    void mark(int64_t k, Entry& e, Node& node, int64_t depth);
    static int64_t edge_depth(const Memo& m) { return m.full ? m.n : m.n - m.offset; }
    void on_child(Node& parent, const std::string& key);
    void on_split(Node& upper, Node& lower);
    void on_evict(Node& leaf, int64_t keep);

    Tree* tree_;
    IdMap<Entry> entries_;  // entries keep their addresses (SlotList points at them)
    SlotList<Entry, &Entry::tracked_at> tracked_;  // in tracking order
    std::unordered_map<Node*, EdgeKeys> edges_;  // node-based: items keep their addresses
    SlotList<Entry, &Entry::dirty_at> dirty_;  // in the order they became dirty
    std::string key_buf_;  // a page key being compared
    IdMap<Hint> hints_;
    std::unique_ptr<Dedup> dedup_;  // null: off
    // refresh()'s buffers, kept across rounds (no allocation per round once grown).
    std::vector<Entry*> refresh_dirty_;
    std::vector<Walk> refresh_walks_;
    WalkScratch walk_scratch_;
};

}  // namespace radixsched
