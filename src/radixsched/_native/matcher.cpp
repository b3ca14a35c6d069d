// See matcher.hpp.
#include "matcher.hpp"

#include <algorithm>
#include <stdexcept>

namespace radixsched {

Matcher::Matcher(Tree& tree) : tree_(&tree) {
    tree.events.on_child = [this](Node& p, const std::string& key) { on_child(p, key); };
    tree.events.on_split = [this](Node& up, Node& low) { on_split(up, low); };
    tree.events.on_evict = [this](Node& leaf, int64_t keep) { on_evict(leaf, keep); };
}

Matcher::~Matcher() { detach(); }

void Matcher::detach() {
    if (tree_ == nullptr) return;
    tree_->events.on_child = nullptr;
    tree_->events.on_split = nullptr;
    tree_->events.on_evict = nullptr;
    tree_ = nullptr;
}

const Memo& Matcher::track(int64_t k, const int32_t* tokens, int64_t fill_len, int32_t ns,
                           RepInputs rep) {
    untrack(k);
    Memo unmatched;
    unmatched.n = -1;  // so that match() tells the dedup its first length
    Entry& e = entries_.try_emplace(k, Entry{tokens, fill_len, ns, std::move(unmatched), k});
    tracked_.push(e);
    if (dedup_) dedup_->put(k, tokens, fill_len, ns, std::move(rep));
    match(k, e);
    return e.memo;
}

void Matcher::dedup_on(int64_t check, int64_t width) {
    if (!entries_.empty()) throw std::runtime_error("the dedup must start before any tracking");
    dedup_ = std::make_unique<Dedup>(check, width);
}

Dedup& Matcher::dedup() {
    if (!dedup_) throw std::runtime_error("the native dedup is off on this matcher");
    return *dedup_;
}

void Matcher::untrack(int64_t k) {
    Entry* e = entries_.find(k);
    hints_.erase(k);
    if (dedup_) dedup_->drop(k);
    if (e == nullptr) return;
    dirty_.drop(*e);
    tracked_.drop(*e);
    unreg(k, e->memo);
    entries_.erase(k);
}

std::vector<int64_t> Matcher::refresh() {
    std::vector<Entry*>& dirty = refresh_dirty_;
    dirty_.take_into(dirty);
    if (dirty.empty()) {
        hints_.clear();
        return {};
    }
    // Every walk first (re-matching changes nothing in the tree, nor marks), then the memos in
    // dirty order; the hints (which keep their nodes alive) are spent once the walks are done.
    std::vector<Walk>& walks = refresh_walks_;
    walks.clear();
    walks.reserve(dirty.size());
    for (Entry* e : dirty) {
        walks.push_back(walk_of(*e, hints_.find(e->k)));
    }
    walk_all(*tree_, walks, walk_scratch_);
    hints_.clear();
    std::vector<int64_t> moved;
    for (size_t i = 0; i < dirty.size(); ++i)
        if (settle(dirty[i]->k, *dirty[i], walks[i].end)) moved.push_back(dirty[i]->k);
    return moved;
}

bool Matcher::is_dirty(int64_t k) const {
    const Entry* e = entries_.find(k);
    return e != nullptr && dirty_.has(*e);
}

std::vector<int64_t> Matcher::dirty_keys() const {
    std::vector<int64_t> out;
    out.reserve(dirty_.size());
    dirty_.each([&out](const Entry& e) { out.push_back(e.k); });
    return out;
}

const Memo* Matcher::memo(int64_t k) const {
    const Entry* e = entries_.find(k);
    return e == nullptr ? nullptr : &e->memo;
}

Matcher::Tracked Matcher::tracked(int64_t k) const {
    const Entry* e = entries_.find(k);
    return e == nullptr ? Tracked{} : Tracked{&e->memo, e->fill_len};
}

int64_t Matcher::prefill_match(int64_t k) const {
    const Entry& e = entries_.at(k);
    return std::min(e.memo.n, e.fill_len - 1);
}

Walk Matcher::walk_of(const Entry& e, const Hint* hint) const {
    Walk w;
    w.tokens = e.tokens;
    w.n = e.fill_len;
    w.ns = e.ns;
    if (hint != nullptr) {
        Node* node = hint->node.get();
        if (node == tree_->root().get() || (node->parent != nullptr && node->size() == hint->klen)) {
            w.start = node;
            w.depth = hint->depth;
        }
    }
    return w;
}

void Matcher::match(int64_t k, Entry& e) {
    Walk w = walk_of(e, nullptr);
    walk_one(*tree_, w);
    settle(k, e, w.end);
}

bool Matcher::settle(int64_t k, Entry& e, const WalkEnd& end) {
    Memo& m = e.memo;
    const bool full = end.offset >= end.node->size();
    const bool same_node = end.node == m.node.get();  // m.node keeps the old node alive
    const bool moved = end.length != m.n || !same_node || end.offset != m.offset || full != m.full;
    const int64_t old_n = m.n;
    // Where it registers: after the node when the match ends at its end, else at the node's
    // place under its parent (set_edge's rule).
    Node* edge = full ? end.node : end.node->parent;
    bool same_edge = m.edge_node.get() == edge;
    if (same_edge) {
        if (!full) {
            same_edge = m.edge_key == end.node->child_key;
        } else if (end.length + tree_->page_size() > e.fill_len) {
            same_edge = m.edge_key.empty();
        } else {
            page_key_into(*tree_, key_buf_, e.tokens + end.length, end.node, e.ns);
            same_edge = m.edge_key == key_buf_;
        }
    }
    if (same_edge) {  // the same edge (a cold round over an unchanged tree): moved last
        m.n = end.length;
        if (!same_node) m.node = end.node->shared_from_this();
        m.offset = end.offset;
        m.full = full;
        refile(m);
    } else {
        unreg(k, m);
        m.n = end.length;
        if (!same_node) m.node = end.node->shared_from_this();
        m.offset = end.offset;
        m.full = full;
        set_edge(e, m);
        file(k, m);
    }
    // The dedup's member holds the memo's n (track() told it the first one).
    if (dedup_ && m.n != old_n) dedup_->matched(k, m.n);
    return moved;
}

void Matcher::reg(int64_t k, Memo& m) {
    set_edge(entries_.at(k), m);
    file(k, m);
}

void Matcher::file(int64_t k, Memo& m) {
    m.edge_keys = &edges_[m.edge_node.get()];
    m.key_at = m.edge_keys->put_at(m.edge_key);
    m.reg_at = m.key_at->second.put_at(k);
}

void Matcher::refile(const Memo& m) {
    Bucket& regs = m.key_at->second;
    if (regs.size() > 1) {
        regs.to_back(m.reg_at);
    } else {  // a lone registrant: unreg drops its key, reg puts it back last
        m.edge_keys->to_back(m.key_at);
    }
}

void Matcher::set_edge(const Entry& e, Memo& m) const {
    if (m.full) {
        const int64_t p = tree_->page_size();
        m.edge_node = m.node;
        if (m.n + p > e.fill_len) {
            m.edge_key.clear();  // the whole aligned fill matched
        } else {
            m.edge_key = tree_->page_key(e.tokens + m.n, m.node.get(), e.ns);
        }
    } else {  // inside a node: the edge is that node's place under its parent
        m.edge_node = m.node->parent->shared_from_this();
        m.edge_key = m.node->child_key;
    }
}

void Matcher::unreg(int64_t k, Memo& m) {
    if (!m.edge_node) return;
    auto by_node = edges_.find(m.edge_node.get());
    if (by_node != edges_.end()) {
        if (Bucket* regs = by_node->second.get(m.edge_key)) {
            regs->erase(k);
            if (regs->empty()) {
                by_node->second.erase(m.edge_key);
                if (by_node->second.empty()) edges_.erase(by_node);
            }
        }
    }
    m.edge_node.reset();
    m.edge_key.clear();
    m.edge_keys = nullptr;
}

void Matcher::mark(int64_t k, Entry& e, Node& node, int64_t depth) {
    dirty_.push(e);
    Hint* h = hints_.find(k);
    if (h == nullptr) {
        hints_.try_emplace(k, Hint{node.shared_from_this(), depth, node.size()});
    } else if (depth < h->depth) {
        *h = Hint{node.shared_from_this(), depth, node.size()};
    }
}

void Matcher::on_child(Node& parent, const std::string& key) {
    auto by_node = edges_.find(&parent);
    if (by_node == edges_.end()) return;
    Bucket* regs = by_node->second.get(key);
    if (regs == nullptr) return;
    for (const auto& item : regs->items()) {
        Entry& e = entries_.at(item.first);
        mark(item.first, e, parent, edge_depth(e.memo));
    }
}

void Matcher::on_split(Node& upper, Node& lower) {
    auto by_node = edges_.find(upper.parent);
    if (by_node == edges_.end()) return;
    Bucket* regs = by_node->second.get(upper.child_key);
    if (regs == nullptr || regs->empty()) return;
    const int64_t cut = upper.size();
    for (int64_t k : regs->keys()) {  // a snapshot: re-registration appends to this bucket
        Entry& e = entries_.at(k);
        Memo& m = e.memo;
        if (m.node.get() != &lower || dirty_.has(e)) continue;
        unreg(k, m);
        if (m.offset < cut) {
            m.node = upper.shared_from_this();
        } else if (m.offset == cut) {
            m.node = upper.shared_from_this();
            m.full = true;
        } else {
            m.offset -= cut;
        }
        reg(k, m);
    }
}

void Matcher::on_evict(Node& leaf, int64_t keep) {
    Node* parent = leaf.parent;
    const int64_t size = leaf.size();
    if (auto at = edges_.find(&leaf); at != edges_.end()) {  // matches through the whole leaf
        for (const auto& by_key : at->second.items())
            for (const auto& item : by_key.second.items()) {
                Entry& e = entries_.at(item.first);
                mark(item.first, e, *parent, edge_depth(e.memo) - size);
            }
    }
    auto by_node = edges_.find(parent);
    if (by_node == edges_.end()) return;
    Bucket* inside = by_node->second.get(leaf.child_key);
    if (inside == nullptr) return;
    for (const auto& item : inside->items()) {  // matches inside the leaf, past what it keeps
        Entry& e = entries_.at(item.first);
        if (e.memo.full || e.memo.offset >= keep) mark(item.first, e, *parent, edge_depth(e.memo));
    }
}

void Matcher::on_reset() {
    dirty_.reserve(tracked_.size());
    tracked_.each([this](Entry& e) { dirty_.push(e); });
    hints_.clear();
}

}  // namespace radixsched
