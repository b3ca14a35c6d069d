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
    entries_.emplace(k, Entry{tokens, fill_len, ns, Memo{}});
    order_.put(k);
    if (dedup_) dedup_->put(k, tokens, fill_len, ns, std::move(rep));
    return match(k, nullptr);
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
    auto it = entries_.find(k);
    dirty_.erase(k);
    hints_.erase(k);
    if (dedup_) dedup_->drop(k);
    if (it == entries_.end()) return;
    unreg(k, it->second.memo);
    entries_.erase(it);
    order_.erase(k);
}

std::vector<int64_t> Matcher::refresh() {
    std::vector<int64_t> moved;
    OrderedMap<int64_t, char> dirty;
    std::swap(dirty, dirty_);
    std::unordered_map<int64_t, Hint> hints;
    std::swap(hints, hints_);
    for (const auto& item : dirty.items()) {
        const int64_t k = item.first;
        const Memo& was = entries_.at(k).memo;  // its fields, not its registration
        const int64_t n = was.n, offset = was.offset;
        const Node* node = was.node.get();  // alive: `hold` keeps it
        const NodePtr hold = was.node;
        const bool full = was.full;
        auto h = hints.find(k);
        const Memo& now = match(k, h == hints.end() ? nullptr : &h->second);
        if (n != now.n || node != now.node.get() || offset != now.offset || full != now.full)
            moved.push_back(k);
    }
    return moved;
}

const Memo* Matcher::memo(int64_t k) const {
    auto it = entries_.find(k);
    return it == entries_.end() ? nullptr : &it->second.memo;
}

int64_t Matcher::prefill_match(int64_t k) const {
    const Entry& e = entries_.at(k);
    return std::min(e.memo.n, e.fill_len - 1);
}

const Memo& Matcher::match(int64_t k, const Hint* hint) {
    Entry& e = entries_.at(k);
    Node* start = nullptr;
    int64_t depth = 0;
    if (hint != nullptr) {
        Node* node = hint->node.get();
        if (node == tree_->root().get() || (node->parent != nullptr && node->size() == hint->klen)) {
            start = node;
            depth = hint->depth;
        }
    }
    MatchEndResult end = tree_->match_end(e.tokens, e.fill_len, e.ns, start, depth);
    Memo m;
    m.n = end.length;
    m.full = end.offset >= end.node->size();
    m.node = std::move(end.node);
    m.offset = end.offset;
    set_edge(e, m);
    if (e.memo.edge_node && e.memo.edge_node == m.edge_node && e.memo.edge_key == m.edge_key) {
        m.edge_keys = e.memo.edge_keys;  // the same edge (a cold round over an unchanged tree)
        m.key_at = e.memo.key_at;
        m.reg_at = e.memo.reg_at;
        e.memo = std::move(m);
        refile(e.memo);
    } else {
        unreg(k, e.memo);
        e.memo = std::move(m);
        file(k, e.memo);
    }
    if (dedup_) dedup_->matched(k, e.memo.n);
    return e.memo;
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

void Matcher::mark(int64_t k, Node& node, int64_t depth) {
    dirty_.put(k);
    auto it = hints_.find(k);
    if (it == hints_.end()) {
        hints_.emplace(k, Hint{node.shared_from_this(), depth, node.size()});
    } else if (depth < it->second.depth) {
        it->second = Hint{node.shared_from_this(), depth, node.size()};
    }
}

void Matcher::on_child(Node& parent, const std::string& key) {
    auto by_node = edges_.find(&parent);
    if (by_node == edges_.end()) return;
    Bucket* regs = by_node->second.get(key);
    if (regs == nullptr) return;
    for (const auto& item : regs->items())
        mark(item.first, parent, edge_depth(entries_.at(item.first).memo));
}

void Matcher::on_split(Node& upper, Node& lower) {
    auto by_node = edges_.find(upper.parent);
    if (by_node == edges_.end()) return;
    Bucket* regs = by_node->second.get(upper.child_key);
    if (regs == nullptr || regs->empty()) return;
    const int64_t cut = upper.size();
    for (int64_t k : regs->keys()) {  // a snapshot: re-registration appends to this bucket
        Memo& m = entries_.at(k).memo;
        if (m.node.get() != &lower || dirty_.contains(k)) continue;
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
            for (const auto& item : by_key.second.items())
                mark(item.first, *parent, edge_depth(entries_.at(item.first).memo) - size);
    }
    auto by_node = edges_.find(parent);
    if (by_node == edges_.end()) return;
    Bucket* inside = by_node->second.get(leaf.child_key);
    if (inside == nullptr) return;
    for (const auto& item : inside->items()) {  // matches inside the leaf, past what it keeps
        const Memo& m = entries_.at(item.first).memo;
        if (m.full || m.offset >= keep) mark(item.first, *parent, edge_depth(m));
    }
}

void Matcher::on_reset() {
    dirty_.reserve(order_.size());
    for (const auto& item : order_.items()) dirty_.put(item.first);
    hints_.clear();
}

}  // namespace radixsched
