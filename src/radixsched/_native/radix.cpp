// See radix.hpp. Every method mirrors the Python method of the same name in
// radixsched/cache/radix.py; comments there state the invariants.
#include "radix.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <type_traits>
#include <unordered_map>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace radixsched {

namespace {
void widen_block(const int32_t* in, int64_t n, int64_t* out) {
    int64_t i = 0;
#ifdef __SSE2__
    for (; i + 4 <= n; i += 4) {  // each int32 next to its sign: the int64 it is
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
        const __m128i sign = _mm_srai_epi32(v, 31);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi32(v, sign));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 2), _mm_unpackhi_epi32(v, sign));
    }
#endif
    for (; i < n; ++i) out[i] = in[i];
}
}  // namespace

void widen_slots(const int32_t* in, int64_t n, int64_t* out) {
    // A long run goes through an L1-sized scratch block, then one memcpy per block: the copy's
    // string stores write the destination's lines (a row, rarely in cache) without reading
    // them in first, as plain stores would (twice the memory traffic on a cold row).
    constexpr int64_t kBlock = 2048;  // 16 KiB of slots
    if (n < 2 * kBlock) {
        widen_block(in, n, out);
        return;
    }
    alignas(64) int64_t block[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
        const int64_t c = std::min(kBlock, n - i);
        widen_block(in + i, c, block);
        std::memcpy(out + i, block, static_cast<size_t>(c) * sizeof(int64_t));
    }
}

namespace {
// in[0, n) narrowed to out[0, n); false (out then unspecified) when one is outside int32.
bool narrow_slots(const int64_t* in, int64_t n, int32_t* out) {
    int64_t i = 0;
    bool ok = true;
#ifdef __SSE2__
    __m128i bad = _mm_setzero_si128();
    for (; i + 4 <= n; i += 4) {  // an int64 fits int32 when its high half is its low's sign
        const __m128 a = _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
        const __m128 b =
            _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 2)));
        const __m128i lo = _mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
        const __m128i hi = _mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
        bad = _mm_or_si128(bad, _mm_xor_si128(hi, _mm_srai_epi32(lo, 31)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), lo);
    }
    ok = _mm_movemask_epi8(_mm_cmpeq_epi32(bad, _mm_setzero_si128())) == 0xFFFF;
#endif
    for (; i < n; ++i) {
        ok = ok && in[i] >= INT32_MIN && in[i] <= INT32_MAX;
        out[i] = static_cast<int32_t>(in[i]);
    }
    return ok;
}
}  // namespace

std::shared_ptr<int32_t> new_slot_block(size_t n) {
    return std::shared_ptr<int32_t>(new int32_t[std::max<size_t>(n, 1)],
                                    std::default_delete<int32_t[]>());
}

void SlotVec::assign(const int64_t* first, const int64_t* last) {
    const auto n = static_cast<size_t>(last - first);
    if (n == 0) return free_all();
    std::shared_ptr<int32_t> block = new_slot_block(n);
    if (!narrow_slots(first, last - first, block.get()))
        throw std::invalid_argument("a KV slot outside the int32 range");
    data_ = block.get();
    owner_ = std::move(block);
    n_ = block_ = n;
}

void SlotVec::assign(const int32_t* first, const int32_t* last) {
    const auto n = static_cast<size_t>(last - first);
    if (n == 0) return free_all();
    std::shared_ptr<int32_t> block = new_slot_block(n);
    copy_slots(first, static_cast<int64_t>(n), block.get());
    data_ = block.get();
    owner_ = std::move(block);
    n_ = block_ = n;
}

void SlotVec::view(const int32_t* first, const int32_t* last, const SlotOwner& owner,
                   size_t block) {
    const auto n = static_cast<size_t>(last - first);
    if (n * kShareFraction < block || n == 0) {
        assign(first, last);  // too little of its block to keep the block for (or nothing)
        return;
    }
    owner_ = owner;
    data_ = first;
    n_ = n;
    block_ = block;
}

SlotVec::SlotVec(const int32_t* first, const int32_t* last, const SlotShare& share) {
    if (!share.owner || first < share.begin || last > share.begin + share.len || last < first)
        throw std::invalid_argument("SlotVec: a view outside its block");
    view(first, last, share.owner, static_cast<size_t>(share.len));
}

void SlotVec::assign_tail(const SlotVec& from, size_t m) {
    if (m > from.n_) throw std::invalid_argument("SlotVec: a tail past the end");
    // (copied first when `from` is this: view() reads from's fields)
    const SlotOwner owner = from.owner_;
    view(from.data_ + m, from.data_ + from.n_, owner, from.block_);
}

void SlotVec::resize(size_t n) {
    if (n > n_) throw std::invalid_argument("SlotVec: resize only shrinks");
    if (n == n_) return;
    if (n != 0 && n * kShareFraction >= block_) {  // still holds enough of its block: view()'s
        n_ = n;                                      // outcome, without a copy of the owner
        return;
    }
    const SlotOwner owner = std::move(owner_);  // the block, kept while assign copies out of it
    assign(data_, data_ + n);
}

namespace {
constexpr int64_t kRootPriority = INT64_MIN;

// Asks for the cache lines of the next chunk [from, from + 256) (clipped to `k`) of the query,
// the key and the slots (when not null) while the current one is compared: a hint only.
inline void prefetch_chunk(const int32_t* tokens, const int32_t* key, const int32_t* value,
                           int64_t from, int64_t k) {
    constexpr int64_t kChunk = 256;
    const int64_t to = std::min(from + kChunk, k);
    for (int64_t j = from; j < to; j += 16) {
        __builtin_prefetch(tokens + j);
        __builtin_prefetch(key + j);
    }
    if (value)
        for (int64_t j = from; j < to; j += 16) __builtin_prefetch(value + j);
}

std::string node_desc(const Node& n) {
    return "TreeNode(id=" + std::to_string(n.id) + ", len=" + std::to_string(n.size()) +
           ", lock=" + std::to_string(n.lock_ref) + ")";
}
}  // namespace

Strategy strategy_from_name(const std::string& name) {
    static const std::unordered_map<std::string, Strategy> names = {
        {"lru", Strategy::Lru},   {"mru", Strategy::Mru},
        {"fifo", Strategy::Fifo}, {"filo", Strategy::Filo},
        {"lfu", Strategy::Lfu},   {"priority", Strategy::Priority},
        {"slru", Strategy::Slru},
    };
    auto it = names.find(name);
    if (it == names.end()) throw std::invalid_argument("unknown eviction policy: " + name);
    return it->second;
}

bool strategy_monotone(Strategy s) { return s != Strategy::Mru; }

uint64_t ChildIndex::hash(const int32_t* page, int64_t n, int32_t nsp) {
    uint64_t h = 0x243F6A8885A308D3ULL ^ (static_cast<uint64_t>(static_cast<uint32_t>(nsp)) << 17);
    for (int64_t i = 0; i < n; ++i)
        h = (h ^ static_cast<uint32_t>(page[i])) * 0xFF51AFD7ED558CCDULL;
    return h ^ (h >> 29) ^ (h >> 47);
}

Node* ChildIndex::get(const int32_t* page, int64_t n, int32_t nsp) const {
    if (size_ == 0) return nullptr;
    const uint64_t h = hash(page, n, nsp);
    const size_t mask = table_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const Entry& e = table_[i];
        Node* c = e.node;
        if (c == nullptr) return nullptr;
        // The key's namespace: a child of the root carries its own (top), others none.
        if (e.hash == h && (!c->top || c->ns == nsp) &&
            std::memcmp(c->key.data(), page, static_cast<size_t>(n) * sizeof(int32_t)) == 0)
            return c;
    }
}

void ChildIndex::grow() {
    std::vector<Entry> old = std::move(table_);
    table_.assign(old.empty() ? 2 : old.size() * 2, Entry{});
    const size_t mask = table_.size() - 1;
    for (Entry& e : old) {
        if (!e.node) continue;
        size_t i = e.hash & mask;
        while (table_[i].node) i = (i + 1) & mask;
        table_[i] = e;
    }
}

void ChildIndex::add(Node& child) {
    if ((size_ + 1) * 4 > table_.size() * 3) grow();
    const size_t mask = table_.size() - 1;
    size_t i = child.key_hash & mask;
    while (table_[i].node) i = (i + 1) & mask;
    table_[i] = Entry{child.key_hash, &child};
    ++size_;
}

size_t ChildIndex::find_entry(const Node& child) const {
    const size_t mask = table_.size() - 1;
    for (size_t i = child.key_hash & mask, probes = 0; probes < table_.size();
         i = (i + 1) & mask, ++probes) {
        if (table_[i].node == &child) return i;
        if (!table_[i].node) break;
    }
    throw IntegrityFailure("a child is missing from its parent's children");
}

void ChildIndex::replace(const Node& old, Node& now) { table_[find_entry(old)].node = &now; }

void ChildIndex::prefetch(const Node& child) const {
    if (!table_.empty()) __builtin_prefetch(&table_[child.key_hash & (table_.size() - 1)]);
}

void ChildIndex::remove(const Node& child) {
    // Backward-shift deletion: every entry stays reachable from its home slot.
    const size_t mask = table_.size() - 1;
    size_t hole = find_entry(child);
    for (size_t j = (hole + 1) & mask; table_[j].node; j = (j + 1) & mask) {
        const size_t home = table_[j].hash & mask;
        // Entry j may move into the hole unless its home lies cyclically in (hole, j].
        const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        table_[hole] = table_[j];
        hole = j;
    }
    table_[hole] = Entry{};
    --size_;
}

Tree::Tree(int64_t page_size, Strategy strategy, int64_t slru_threshold, bool disabled,
           bool compat_sglang)
    : heap_persistent(strategy_monotone(strategy)),
      page_(page_size),
      strategy_(strategy),
      slru_threshold_(slru_threshold),
      disabled_(disabled),
      compat_(compat_sglang) {
    if (page_size < 1) throw std::invalid_argument("page_size must be >= 1");
    root_ = new_root();
}

Tree::~Tree() { detach_all(); }

void Tree::detach_all() {
    // Handles Python still holds must never see a freed parent.
    for (const NodePtr& n : nodes()) n->parent = nullptr;
}

NodePtr Tree::new_root() {
    auto root = std::make_shared<Node>();
    root->id = root->slot = new_id();
    root->last_access_time = root->creation_time = clock_;
    root->priority = kRootPriority;
    root->lock_ref = 1;  // never evicted, never unlocked
    return root;
}

std::pair<int64_t, int64_t> Tree::prio(const Node& n) const {
    switch (strategy_) {
        case Strategy::Lru: return {n.last_access_time, 0};
        case Strategy::Mru: return {-n.last_access_time, 0};
        case Strategy::Fifo: return {n.creation_time, 0};
        case Strategy::Filo: return {-n.creation_time, 0};
        case Strategy::Lfu: return {n.hit_count, n.last_access_time};
        case Strategy::Priority: return {n.priority, n.last_access_time};
        case Strategy::Slru:
            return {n.hit_count >= slru_threshold_ ? 1 : 0, n.last_access_time};
    }
    return {0, 0};
}

void Tree::push(Node& n) {
    auto [a, b] = prio(n);
    heap_.push_back({a, b, n.id, &n});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<HeapEntry>());
}

void Tree::pop_heap_entry() {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<HeapEntry>());
    heap_.pop_back();
}

int64_t Tree::new_id() {
    leaf_at_.push_back(0);  // its entry: not a leaf (yet)
    return next_id_++;
}

void Tree::leaf_add(Node& n) {
    const auto id = static_cast<size_t>(n.id);
    if (id >= leaf_at_.size()) throw std::invalid_argument(node_desc(n) + ": not of this tree");
    if (leaf_at_[id]) return;
    if (leaves_.size() >= UINT32_MAX) throw std::length_error("too many evictable leaves");
    leaves_.push_back(Leaf{&n, n.id});
    leaf_at_[id] = static_cast<uint32_t>(leaves_.size());
}

void Tree::leaf_remove(const Node& n) {
    if (!is_leaf(n.id)) return;
    uint32_t& at = leaf_at_[static_cast<size_t>(n.id)];
    const Leaf last = leaves_.back();  // moves into n's place (n may be it)
    leaves_[at - 1] = last;
    leaf_at_[static_cast<size_t>(last.id)] = at;
    leaves_.pop_back();
    at = 0;
}

void Tree::mark_evictable(Node& n) {
    leaf_add(n);
    if (heap_persistent) push(n);
}

void Tree::leaf_set(Node& node, bool member) {
    if (member) {
        leaf_add(node);
    } else {
        leaf_remove(node);
    }
}

std::string Tree::page_key(const int32_t* page, Node* parent, int32_t ns) const {
    std::string k;
    const size_t bytes = static_cast<size_t>(page_) * sizeof(int32_t);
    if (parent == root_.get() && ns != 0) {
        k.resize(sizeof(int32_t) + bytes);
        std::memcpy(k.data(), &ns, sizeof(int32_t));
        std::memcpy(k.data() + sizeof(int32_t), page, bytes);
    } else {
        k.assign(reinterpret_cast<const char*>(page), bytes);
    }
    return k;
}

NodePtr Tree::find_child(Node& node, const int32_t* page, int32_t ns) {
    Node* c = find_child_ptr(node, page, ns);
    return c ? c->shared_from_this() : nullptr;
}

Node* Tree::find_child_ptr(Node& node, const int32_t* page, int32_t ns) const {
    return node.index.get(page, page_, &node == root_.get() ? ns : 0);
}

bool Tree::covers(const int32_t* tokens, int64_t avail, const Node& node) const {
    const int64_t k = node.size();
    return avail >= k && std::memcmp(tokens, node.key.data(), k * sizeof(int32_t)) == 0;
}

namespace {

// The lookup of the page after a node's key in that node's children (ChildIndex::get), started
// a step at a time while the node's key is compared, each step reading only lines the step
// before asked for: the page's tokens, then its home entry, then the child that entry names,
// then the start of that child's key and slots. Cache hints only: nothing is written, and a
// wrong guess (the node does not match, or the entry is another child's) costs a few lines.
class Lookahead {
public:
    Lookahead(const int32_t* page, int64_t page_len, const ChildIndex& index)
        : page_(page), len_(page_len), index_(index) {
        if (page_) __builtin_prefetch(page_);
    }
    void step() {
        switch (step_++) {
            case 0:
                if (!page_ || index_.size() == 0) return;
                hash_ = ChildIndex::hash(page_, len_, 0);  // under a non-root node: no namespace
                entry_ = index_.home(hash_);
                __builtin_prefetch(entry_);
                return;
            case 1:
                if (!entry_ || entry_->hash != hash_ || !entry_->node) return;
                child_ = entry_->node;
                for (size_t b = 0; b < sizeof(Node); b += 64)
                    __builtin_prefetch(reinterpret_cast<const char*>(child_) + b);
                return;
            case 2: {  // the child's first 4 lines of key and of slots
                if (!child_) return;
                const int64_t n = child_->size();
                for (int64_t j = 0; j < std::min<int64_t>(n, 64); j += 16)
                    __builtin_prefetch(child_->key.data() + j);
                for (int64_t j = 0; j < std::min<int64_t>(n, 64); j += 16)
                    __builtin_prefetch(child_->value.data() + j);
                return;
            }
            default: return;
        }
    }

private:
    const int32_t* page_;
    int64_t len_;
    const ChildIndex& index_;
    int step_ = 0;
    uint64_t hash_ = 0;
    const ChildIndex::Entry* entry_ = nullptr;
    const Node* child_ = nullptr;
};

}  // namespace

bool Tree::covers_copy(const int32_t* tokens, int64_t avail, const Node& node,
                       int64_t* out) const {
    // In chunks, so that the reads of the query, the key and the slots overlap.
    constexpr int64_t kChunk = 256;
    const int64_t k = node.size();
    if (avail < k) return false;
    const int32_t* key = node.key.data();
    const int32_t* value = node.value.data();
    prefetch_chunk(tokens, key, out ? value : nullptr, 0, k);
    Lookahead next(avail - k >= page_ ? tokens + k : nullptr, page_, node.index);
    for (int64_t i = 0; i < k; i += kChunk) {
        const int64_t c = std::min(kChunk, k - i);
        prefetch_chunk(tokens, key, out ? value : nullptr, i + kChunk, k);
        if (std::memcmp(tokens + i, key + i, c * sizeof(int32_t)) != 0) return false;
        if (out) widen_slots(value + i, c, out + i);
        next.step();
    }
    return true;
}

int64_t Tree::mismatch(const int32_t* tokens, int64_t avail, const Node& node) const {
    const int64_t n = std::min(avail, node.size());
    int64_t m = 0;
    while (m < n && tokens[m] == node.key[m]) ++m;
    return m - m % page_;
}

namespace {

// `child` appended to `parent`'s children, its place noted.
void own_child(Node& parent, NodePtr child) {
    child->child_at = parent.children.size();
    parent.children.push_back(std::move(child));
}

// `child` out of `parent`'s children (the last one moving into its place), returned.
NodePtr disown_child(Node& parent, const Node& child) {
    std::vector<NodePtr>& kids = parent.children;
    const size_t at = child.child_at;
    if (at >= kids.size() || kids[at].get() != &child)
        throw IntegrityFailure(node_desc(child) + " not in its parent");
    NodePtr out = std::move(kids[at]);
    if (at + 1 != kids.size()) {
        kids[at] = std::move(kids.back());
        kids[at]->child_at = at;
    }
    kids.pop_back();
    return out;
}

}  // namespace

NodePtr Tree::make_node(SlotVec key, SlotVec value, Node* parent,
                        int32_t ns, int64_t now, int64_t priority) {
    auto n = std::make_shared<Node>();
    n->key = std::move(key);
    n->value = std::move(value);
    n->parent = parent;
    n->ns = ns;
    n->last_access_time = n->creation_time = now;
    n->priority = priority;
    n->id = n->slot = new_id();
    return n;
}

NodePtr Tree::split(Node& child, int64_t m, int64_t now) {
    Node* parent = child.parent;
    if (child.child_at >= parent->children.size() ||
        parent->children[child.child_at].get() != &child)
        throw IntegrityFailure(node_desc(child) + " not in its parent");
    NodePtr lower = parent->children[child.child_at];  // keeps the child alive
    // The upper part takes the child's arrays (cut to m), the child their tail: a view of the
    // same blocks where long enough (SlotVec), else a copy of the tail alone.
    NodePtr up = make_node(std::move(child.key), std::move(child.value), parent, child.ns, now,
                           child.priority);
    child.key.assign_tail(up->key, static_cast<size_t>(m));
    child.value.assign_tail(up->value, static_cast<size_t>(m));
    up->key.resize(static_cast<size_t>(m));
    up->value.resize(static_cast<size_t>(m));
    up->lock_ref = child.lock_ref;
    up->hit_count = child.hit_count;
    up->slot = child.slot;
    up->top = child.top;
    up->child_key = child.child_key;
    up->key_hash = child.key_hash;
    if (!compat_) up->creation_time = child.creation_time;
    up->child_at = child.child_at;
    parent->children[up->child_at] = up;  // the same key: the same place
    parent->index.replace(child, *up);
    child.parent = up.get();
    child.top = false;
    child.child_key = page_key(child.key.data(), up.get(), child.ns);
    child.key_hash = ChildIndex::hash(child.key.data(), page_, 0);
    up->index.add(child);
    own_child(*up, std::move(lower));
    if (events.on_split) events.on_split(*up, child);
    return up;
}

WalkResult Tree::walk(const int32_t* tokens, int64_t n, int32_t ns,
                      std::vector<int64_t>* values) {
    if (values == nullptr) return walk_into(tokens, n, ns, nullptr);
    const size_t base = values->size();
    values->resize(base + static_cast<size_t>(n - n % page_));
    const WalkResult r = walk_into(tokens, n, ns, values->data() + base);
    values->resize(base + static_cast<size_t>(r.length));
    return r;
}

WalkResult Tree::walk_into(const int32_t* tokens, int64_t n, int32_t ns, int64_t* out) {
    n -= n % page_;
    const int64_t now = ++clock_;
    root_->last_access_time = now;
    if (n == 0) return {root_, 0};
    return descend(root_.get(), 0, tokens, n, ns, now, out);
}

bool Tree::walk_below(Node& start, int64_t depth, const int32_t* tokens, int64_t n, int32_t ns,
                      WalkResult& res) {
    // The walk of the whole key would find start's path from the root (the path's key is its
    // prefix; a child's first page, with the namespace under the root, names it) and cover
    // every node on it: each is only touched here.
    int64_t held = 0;
    const Node* top = nullptr;
    for (const Node* cur = &start; cur != root_.get(); cur = cur->parent) {
        if (cur == nullptr)  // detached: its path from the root is not depth tokens long
            throw IntegrityFailure("checkpoint: the lock's depth is not the protected length");
        held += cur->size();
        top = cur;
    }
    if (held != depth)
        throw IntegrityFailure("checkpoint: the lock's depth is not the protected length");
    if (top == nullptr || top->ns != ns) return false;
    n -= n % page_;
    const int64_t now = ++clock_;
    root_->last_access_time = now;
    for (Node* cur = &start; cur != root_.get(); cur = cur->parent) cur->last_access_time = now;
    res = n == 0 ? WalkResult{start.shared_from_this(), depth}
                 : descend(&start, depth, tokens, depth + n, ns, now, nullptr);
    return true;
}

WalkResult Tree::descend(Node* node, int64_t pos, const int32_t* tokens, int64_t n, int32_t ns,
                         int64_t now, int64_t* out) {
    const int64_t base = pos;  // tokens[pos - base] is position pos
    Node* child = find_child_ptr(*node, tokens, ns);
    while (child) {
        child->last_access_time = now;
        const int64_t rel = pos - base;
        if (covers_copy(tokens + rel, n - pos, *child, out ? out + rel : nullptr)) {
            node = child;
            pos += child->size();
            if (pos == n) break;
            child = find_child_ptr(*node, tokens + (pos - base), ns);
        } else {
            const int64_t m = mismatch(tokens + rel, n - pos, *child);
            node = split(*child, m, now).get();  // its parent owns it
            if (out) node->value.copy_to(0, static_cast<size_t>(m), out + rel);
            pos += m;
            break;
        }
    }
    return {node->shared_from_this(), pos};
}

int64_t Tree::match_len(const int32_t* tokens, int64_t n, int32_t ns) {
    if (disabled_) return 0;
    n -= n % page_;
    if (n == 0) return 0;
    Node* child = find_child_ptr(*root_, tokens, ns);
    int64_t pos = 0;
    while (child) {
        if (!covers(tokens + pos, n - pos, *child))
            return pos + mismatch(tokens + pos, n - pos, *child);
        pos += child->size();
        if (pos == n) return pos;
        child = find_child_ptr(*child, tokens + pos, ns);
    }
    return pos;
}

MatchEndResult Tree::match_end(const int32_t* tokens, int64_t n, int32_t ns, Node* start,
                               int64_t depth) {
    if (disabled_) return {0, root_, 0};
    n -= n % page_;
    NodePtr node = start ? start->shared_from_this() : root_;
    int64_t pos = start ? depth : 0;
    if (pos >= n) {
        if (n) return {pos, node, node->size()};
        return {0, root_, 0};
    }
    NodePtr child = find_child(*node, tokens + pos, ns);
    while (child) {
        if (!covers(tokens + pos, n - pos, *child)) {
            const int64_t m = mismatch(tokens + pos, n - pos, *child);
            return {pos + m, child, m};
        }
        node = child;
        pos += child->size();
        if (pos == n) break;
        child = find_child(*node, tokens + pos, ns);
    }
    return {pos, node, node->size()};
}

NodePtr Tree::touch_at(Node& node, int64_t offset) {
    const int64_t now = ++clock_;
    root_->last_access_time = now;
    for (Node* cur = &node; cur != root_.get(); cur = cur->parent) {
        if (cur == nullptr) throw std::invalid_argument("touch_at: the node is not in the tree");
        cur->last_access_time = now;
    }
    if (offset < node.size()) return split(node, offset, now);
    return node.shared_from_this();
}

template <class S>
void Tree::prefix_slots(Node& node, int64_t length, S* out) {
    int64_t held = 0;
    for (Node* cur = &node; cur != root_.get(); cur = cur->parent) {
        if (cur == nullptr) throw IntegrityFailure("prefix_slots: the node is not in the tree");
        held += cur->size();
    }
    if (held != length)
        throw IntegrityFailure("prefix of " + std::to_string(length) +
                               " tokens but its path holds " + std::to_string(held));
    int64_t end = length;
    for (Node* cur = &node; cur != root_.get(); cur = cur->parent) {
        end -= cur->size();
        cur->value.copy_to(0, cur->value.size(), out + end);
    }
}

template <class S>
void Tree::path_slots(const Node& node, int64_t length, int64_t from, int64_t to,
                      S* out) const {
    int64_t end = length;  // the depth at which `cur` ends
    for (const Node* cur = &node; end > from; cur = cur->parent) {
        if (cur == nullptr || cur == root_.get())
            throw IntegrityFailure("path_slots: the path holds fewer than " +
                                   std::to_string(length) + " tokens");
        const int64_t begin = end - cur->size();
        const int64_t a = std::max(begin, from), b = std::min(end, to);
        if (a < b)
            cur->value.copy_to(static_cast<size_t>(a - begin), static_cast<size_t>(b - begin),
                               out + (a - from));
        end = begin;
    }
}

void Tree::touch_path_up(Node& node, int64_t depth, int64_t now, int64_t priority,
                         int64_t inserted_len) {
    if (node.parent == nullptr)
        throw IntegrityFailure("insert start " + node_desc(node) + " is not in the tree");
    int64_t pos = depth;
    for (Node* cur = &node; cur != root_.get(); cur = cur->parent) {
        cur->last_access_time = now;
        if (priority > cur->priority) cur->priority = priority;
        if (pos > inserted_len) cur->hit_count += 1;
        pos -= cur->size();
    }
    if (pos != 0)
        throw IntegrityFailure("insert start at depth " + std::to_string(depth) + " ends at " +
                               std::to_string(depth - pos) + " tokens");
}

template <class S>
WalkResult Tree::insert(const int32_t* tokens, int64_t n_tokens, int32_t ns, const S* values,
                        int64_t n_values, int64_t priority, int64_t inserted_len, Node* start,
                        int64_t start_depth, int64_t base, const SlotShare* share,
                        const SlotShare* key_share) {
    n_tokens -= n_tokens % page_;  // `tokens` hold the key's positions from `base` on
    const int64_t n = base + n_tokens;
    if (n_values < n_tokens)
        throw std::invalid_argument("insert: " + std::to_string(n_values) + " values for a " +
                                    std::to_string(n_tokens) + "-token (aligned) key");
    const int64_t now = ++clock_;
    root_->last_access_time = now;
    if (priority > root_->priority) root_->priority = priority;
    if (n == 0) return {root_, 0};
    Node* node;
    int64_t pos;
    if (start != nullptr && start != root_.get() && start_depth <= n) {
        pos = start_depth;
        if (pos < base)
            throw std::invalid_argument("insert: the key starts at " + std::to_string(base) +
                                        ", past the start depth " + std::to_string(pos));
        touch_path_up(*start, pos, now, priority, inserted_len);
        node = start;
        if (pos == n) return {node->shared_from_this(), pos};
    } else if (base) {
        throw std::invalid_argument("insert: a key starting at " + std::to_string(base) +
                                    " needs a start node at that depth");
    } else {
        node = root_.get();
        pos = 0;
    }
    // Raw pointers below: every node on the path is owned by its attached parent.
    Node* child = find_child_ptr(*node, tokens + (pos - base), ns);
    while (child) {
        child->last_access_time = now;
        const int64_t rel = pos - base;
        const bool whole = covers(tokens + rel, n - pos, *child);
        const int64_t m = whole ? child->size() : mismatch(tokens + rel, n - pos, *child);
        node = whole ? child : split(*child, m, now).get();
        pos += m;
        if (priority > node->priority) node->priority = priority;
        if (pos > inserted_len) node->hit_count += 1;
        if (pos == n) return {node->shared_from_this(), pos};
        if (!whole) break;  // the remainder's first page differs from the split-off child's
        child = find_child_ptr(*node, tokens + rel + m, ns);
    }
    const int64_t rel = pos - base;
    const bool top = node == root_.get();
    SlotVec slots;
    if constexpr (std::is_same_v<S, int32_t>) {
        if (share != nullptr)
            slots = SlotVec(values + rel, values + n_tokens, *share);  // a view where long enough
        else
            slots.assign(values + rel, values + n_tokens);
    } else {
        slots.assign(values + rel, values + n_tokens);
    }
    SlotVec key;
    if (key_share != nullptr)
        key = SlotVec(tokens + rel, tokens + n_tokens, *key_share);  // a view where long enough
    else
        key.assign(tokens + rel, tokens + n_tokens);
    NodePtr leaf = make_node(std::move(key), std::move(slots), node, ns, now, priority);
    leaf->child_key = page_key(tokens + rel, node, ns);
    leaf->key_hash = ChildIndex::hash(tokens + rel, page_, top ? ns : 0);
    leaf->top = top;
    if (n > inserted_len) leaf->hit_count = 1;
    if (node->children.empty() && node->lock_ref == 0) leaf_remove(*node);
    node->index.add(*leaf);
    own_child(*node, leaf);
    if (events.on_child) events.on_child(*node, leaf->child_key);
    evictable_ += n - pos;
    mark_evictable(*leaf);
    return {leaf, pos};
}

void Tree::check_attached(const Node& node) const {
    if (node.parent == nullptr && &node != root_.get())
        throw std::invalid_argument(node_desc(node) +
                                    " is not in the tree (evicted, or from before a reset)");
}

int64_t Tree::inc_lock_ref(Node& node) {
    if (disabled_) return 0;
    check_attached(node);
    if (&node == root_.get()) return 0;
    if (node.lock_ref == 0 && node.children.empty()) leaf_remove(node);
    int64_t moved = 0;
    for (Node* cur = &node; cur != root_.get(); cur = cur->parent) {
        if (cur->lock_ref == 0) moved += cur->size();
        cur->lock_ref += 1;
    }
    evictable_ -= moved;
    protected_ += moved;
    return -moved;
}

int64_t Tree::dec_lock_ref(Node& node) {
    if (disabled_) return 0;
    check_attached(node);
    if (&node == root_.get()) return 0;
    if (node.lock_ref <= 0) throw IntegrityFailure("dec_lock_ref on unlocked " + node_desc(node));
    int64_t moved = 0;
    for (Node* cur = &node; cur != root_.get(); cur = cur->parent) {
        cur->lock_ref -= 1;
        if (cur->lock_ref == 0) moved += cur->size();
    }
    if (node.lock_ref == 0 && node.children.empty()) mark_evictable(node);
    evictable_ += moved;
    protected_ -= moved;
    return moved;
}

void Tree::move_lock(Node* old, Node& node) {
    if (old == nullptr || old == &node || disabled_) {
        inc_lock_ref(node);
        if (old != nullptr) dec_lock_ref(*old);
        return;
    }
    check_attached(node);
    // Two walks up from node (no list of the nodes between): is old above it, then lock them.
    for (Node* cur = &node; cur != old; cur = cur->parent) {
        if (cur == root_.get()) {  // not below old: lock the new path, release the old one
            inc_lock_ref(node);
            dec_lock_ref(*old);
            return;
        }
    }
    if (old->lock_ref <= 0) throw IntegrityFailure("dec_lock_ref on unlocked " + node_desc(*old));
    if (node.lock_ref == 0 && node.children.empty()) leaf_remove(node);
    int64_t moved = 0;
    for (Node* cur = &node; cur != old; cur = cur->parent) {
        if (cur->lock_ref == 0) moved += cur->size();
        cur->lock_ref += 1;
    }
    evictable_ -= moved;
    protected_ += moved;
}

std::vector<int32_t> Tree::path_key(const Node& node) const {
    std::vector<const Node*> chain;
    for (const Node* cur = &node; cur != nullptr && cur != root_.get(); cur = cur->parent)
        chain.push_back(cur);
    std::vector<int32_t> out;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it)
        out.insert(out.end(), (*it)->key.data(), (*it)->key.data() + (*it)->key.size());
    return out;
}

void Tree::Freed::take(SlotVec&& v) {
    copy(v.data(), v.data() + v.size());
    v.free_all();  // emptied and given back, as a move leaves it
}

void Tree::Freed::copy(const int32_t* begin, const int32_t* end) {
    if (segments) {
        segments->emplace_back(end - begin);
        widen_slots(begin, end - begin, segments->back().data());
        return;
    }
    if (out != nullptr || out32 != nullptr) {
        const int64_t k = std::min<int64_t>(cap - pos, end - begin);
        if (out32 != nullptr)
            copy_slots(begin, k, out32 + pos);
        else
            copy_slots(begin, k, out + pos);
        pos += k;
        begin += k;
    }
    if (flat32 != nullptr) {
        flat32->insert(flat32->end(), begin, end);
        return;
    }
    if (begin != end) {
        const size_t at = flat->size();
        flat->resize(at + static_cast<size_t>(end - begin));
        widen_slots(begin, end - begin, flat->data() + at);
    }
}

void Tree::evict_whole(Node& leaf, Freed& freed) {
    leaf.parent->index.prefetch(leaf);  // its miss overlaps the children's below
    const int64_t length = leaf.size();
    if (events.host_evict) events.host_evict(path_key(leaf), leaf.ns, length);
    if (events.on_evict) events.on_evict(leaf, 0);
    // The slots move out: a detached node keeps its key (handles may still ask its length),
    // not its slots, which the caller now owns.
    freed.take(std::move(leaf.value));
    leaf.value.clear();
    Node* parent = leaf.parent;
    const NodePtr hold = disown_child(*parent, leaf);  // alive until this returns
    parent->index.remove(leaf);
    leaf.parent = nullptr;
    leaf_remove(leaf);
    evictable_ -= length;
    if (parent != root_.get() && parent->children.empty() && parent->lock_ref == 0) {
        leaf_add(*parent);
        push(*parent);
    }
}

std::vector<std::vector<int64_t>> Tree::evict(int64_t num_tokens) {
    std::vector<std::vector<int64_t>> segments;
    Freed freed{&segments, nullptr};
    evict_into(num_tokens, freed);
    return segments;
}

std::vector<int64_t> Tree::evict_flat(int64_t num_tokens) {
    std::vector<int64_t> flat;
    Freed freed{nullptr, &flat};
    evict_into(num_tokens, freed);
    return flat;
}

void Tree::evict_flat32(int64_t num_tokens, std::vector<int32_t>& out) {
    out.clear();
    Freed freed;
    freed.flat32 = &out;
    evict_into(num_tokens, freed);
}

template <class S>
int64_t Tree::evict_to(int64_t num_tokens, S* out, int64_t cap, std::vector<int64_t>& excess) {
    Freed freed{nullptr, &excess};
    if constexpr (std::is_same_v<S, int32_t>)
        freed.out32 = out;
    else
        freed.out = out;
    freed.cap = cap;
    evict_into(num_tokens, freed);
    return freed.pos;
}

void Tree::evict_into(int64_t num_tokens, Freed& freed) {
    if (disabled_ || num_tokens <= 0 || leaves_.empty()) return;
    if (!heap_persistent || heap_.size() > 4 * leaves_.size() + 64) {
        heap_.clear();
        for (const Leaf& leaf : leaves_) {
            auto [a, b] = prio(*leaf.node);
            heap_.push_back({a, b, leaf.id, leaf.node});
        }
        std::make_heap(heap_.begin(), heap_.end(), std::greater<HeapEntry>());
    }
    int64_t evicted = 0;
    while (evicted < num_tokens && !heap_.empty()) {
        const HeapEntry e = heap_.front();
        pop_heap_entry();
        // Stale: locked, grew a child or evicted (its memory may be reused by another node:
        // the id tells them apart, and it is read only once the node is known to be alive).
        if (!is_leaf(e.id)) continue;
        Node& leaf = *e.node;
        auto [a, b] = prio(leaf);
        if (a != e.a || b != e.b) {
            push(leaf);
            continue;
        }
        const int64_t length = leaf.size();
        const int64_t remaining = num_tokens - evicted;
        if (length > remaining && !compat_) {
            const int64_t cut = (remaining + page_ - 1) / page_ * page_;
            if (cut < length) {  // only the tail: the leaf stays, shorter, still evictable
                if (events.host_evict) events.host_evict(path_key(leaf), leaf.ns, cut);
                const int64_t keep = length - cut;
                if (events.on_evict) events.on_evict(leaf, keep);
                freed.copy(leaf.value.data() + keep, leaf.value.data() + leaf.value.size());
                leaf.key.resize(keep);
                leaf.value.resize(keep);
                evictable_ -= cut;
                evicted += cut;
                push(leaf);
                break;
            }
        }
        evict_whole(leaf, freed);
        evicted += length;
    }
    if (!heap_persistent) heap_.clear();
}

std::vector<int64_t> Tree::reset() {
    if (protected_)
        throw std::runtime_error("reset with " + std::to_string(protected_) +
                                 " locked tokens: release all requests first");
    std::vector<int64_t> values = all_values();
    detach_all();
    root_ = new_root();
    evictable_ = protected_ = 0;
    for (const Leaf& leaf : leaves_) leaf_at_[static_cast<size_t>(leaf.id)] = 0;
    leaves_.clear();
    heap_.clear();
    return values;
}

std::vector<NodePtr> Tree::children_in_order(const Node& node) {
    std::vector<NodePtr> kids;
    kids.reserve(node.children.size());
    for (const NodePtr& c : node.children) kids.push_back(c);
    std::sort(kids.begin(), kids.end(),
              [](const NodePtr& x, const NodePtr& y) { return x->slot < y->slot; });
    return kids;
}

std::vector<NodePtr> Tree::nodes() const {
    std::vector<NodePtr> out;
    std::vector<NodePtr> stack = children_in_order(*root_);
    std::reverse(stack.begin(), stack.end());
    while (!stack.empty()) {
        NodePtr n = std::move(stack.back());
        stack.pop_back();
        std::vector<NodePtr> kids = children_in_order(*n);
        stack.insert(stack.end(), kids.rbegin(), kids.rend());
        out.push_back(std::move(n));
    }
    return out;
}

std::vector<int64_t> Tree::all_values() const {
    std::vector<int64_t> out;
    for (const NodePtr& n : nodes()) {
        const size_t at = out.size();
        out.resize(at + n->value.size());
        n->value.copy_to(0, n->value.size(), out.data() + at);
    }
    return out;
}

// The reference's DFS (cache/radix.py's dfs_weight_order_at) over the part of the tree that
// the matches reach: each node reached visits its reached children, heaviest first (the
// weight: how many matches end in the child's subtree), then lists the matches ending in it:
// those at its end in their order, then those inside it by descending offset (ties in their
// order). Matches in a detached node (its parent chain does not reach the root) come last.
std::vector<int64_t> Tree::dfs_weight_order_at(
    const std::vector<std::pair<Node*, int64_t>>& ends) {
    std::unordered_map<Node*, std::vector<int64_t>> at_end;
    std::unordered_map<Node*, std::map<int64_t, std::vector<int64_t>>> inside;
    std::vector<int64_t> orphans;
    std::vector<Node*> members;  // nodes with at least one match ending in them
    for (int64_t i = 0; i < static_cast<int64_t>(ends.size()); ++i) {
        auto [node, offset] = ends[i];
        Node* cur = node;
        while (cur != nullptr && cur != root_.get()) cur = cur->parent;
        if (node == nullptr || cur != root_.get()) {
            orphans.push_back(i);
            continue;
        }
        if (!at_end.count(node) && !inside.count(node)) members.push_back(node);
        if (offset >= node->size()) {
            at_end[node].push_back(i);
        } else {
            inside[node][offset].push_back(i);
        }
    }
    std::unordered_map<Node*, int64_t> weight;
    for (Node* node : members) {
        int64_t c = 0;
        if (auto it = at_end.find(node); it != at_end.end()) c += it->second.size();
        if (auto it = inside.find(node); it != inside.end())
            for (const auto& kv : it->second) c += kv.second.size();
        for (Node* cur = node; cur != nullptr; cur = cur->parent) weight[cur] += c;
    }
    // Each weighted node's weighted children, heaviest first, ties by slot: the order that
    // children_in_order (by slot) stably sorted by weight gives, as siblings' slots are
    // distinct (a node's slot is its own id or, for a split's upper part, the id of the child
    // it replaced). Read from the weights alone, a node with many children holding no match
    // (a base shared by thousands) costs only its weighted ones. A weighted node is attached:
    // its parent's child (eviction and reset clear a detached node's parent).
    struct Kid {
        int64_t weight, slot;
        Node* node;
    };
    std::unordered_map<Node*, std::vector<Kid>> kids;
    for (const auto& [node, w] : weight)
        if (node != root_.get()) kids[node->parent].push_back(Kid{w, node->slot, node});
    for (auto& [parent, list] : kids)
        std::sort(list.begin(), list.end(), [](const Kid& x, const Kid& y) {
            return x.weight != y.weight ? x.weight > y.weight : x.slot < y.slot;
        });
    std::vector<int64_t> order;
    std::vector<std::pair<Node*, bool>> stack;  // iterative post-order: (node, expanded?)
    if (weight.count(root_.get())) stack.emplace_back(root_.get(), false);
    while (!stack.empty()) {
        auto [node, expanded] = stack.back();
        stack.pop_back();
        if (expanded) {
            if (auto it = at_end.find(node); it != at_end.end())
                order.insert(order.end(), it->second.begin(), it->second.end());
            if (auto it = inside.find(node); it != inside.end())
                for (auto kv = it->second.rbegin(); kv != it->second.rend(); ++kv)
                    order.insert(order.end(), kv->second.begin(), kv->second.end());
            continue;
        }
        stack.emplace_back(node, true);
        if (auto it = kids.find(node); it != kids.end())
            for (auto k = it->second.rbegin(); k != it->second.rend(); ++k)
                stack.emplace_back(k->node, false);
    }
    order.insert(order.end(), orphans.begin(), orphans.end());
    return order;
}

void Tree::check_integrity() const {
    const Node& root = *root_;
    if (root.lock_ref != 1 || root.parent != nullptr || root.size())
        throw IntegrityFailure("root corrupt: lock_ref=" + std::to_string(root.lock_ref) +
                               ", key len " + std::to_string(root.size()));
    if (disabled_) {
        if (!root.children.empty() || evictable_ || protected_)
            throw IntegrityFailure("disabled cache holds nodes or sizes");
        return;
    }
    int64_t evictable = 0, prot = 0, n_values = 0;
    std::unordered_set<Node*> leaves;
    for (const NodePtr& np : nodes()) {
        const Node& node = *np;
        const Node* parent = node.parent;
        const int64_t klen = node.size();
        const std::string d = node_desc(node);
        if (parent == nullptr) throw IntegrityFailure(d + " in the tree has parent None");
        if (klen == 0 || klen % page_)
            throw IntegrityFailure(d + ": key length " + std::to_string(klen) +
                                   " not a positive multiple of " + std::to_string(page_));
        if (static_cast<int64_t>(node.value.size()) != klen)
            throw IntegrityFailure(d + ": " + std::to_string(node.value.size()) +
                                   " values for " + std::to_string(klen) + " tokens");
        const std::string ck = page_key(node.key.data(), const_cast<Node*>(parent), node.ns);
        if (node.child_at >= parent->children.size() ||
            parent->children[node.child_at].get() != &node)
            throw IntegrityFailure(d + " not under its own first-page key in its parent");
        const int32_t nsp = parent == root_.get() ? node.ns : 0;
        if (node.key_hash != ChildIndex::hash(node.key.data(), page_, nsp) ||
            find_child_ptr(*const_cast<Node*>(parent), node.key.data(), node.ns) != &node ||
            parent->index.size() != parent->children.size())
            throw IntegrityFailure(d + " not in its parent's child index under its key");
        if (node.child_key != ck)
            throw IntegrityFailure(d + ": stored child_key differs from its first page");
        if (node.top != (parent == root_.get()))
            throw IntegrityFailure(d + ": stored subtree_key differs from its top's key");
        if (parent != root_.get() && parent->ns != node.ns)
            throw IntegrityFailure(d + ": namespace differs from its parent's");
        if (node.lock_ref < 0)
            throw IntegrityFailure(d + ": negative lock_ref " + std::to_string(node.lock_ref));
        int64_t child_locks = 0;
        for (const NodePtr& c : node.children) child_locks += c->lock_ref;
        if (node.lock_ref < child_locks)
            throw IntegrityFailure(d + ": lock_ref " + std::to_string(node.lock_ref) +
                                   " < sum of children's " + std::to_string(child_locks));
        if (node.lock_ref == 0) {
            evictable += klen;
            if (node.children.empty()) leaves.insert(const_cast<Node*>(&node));
        } else {
            prot += klen;
        }
        n_values += klen;
    }
    if (evictable != evictable_ || prot != protected_)
        throw IntegrityFailure("sizes: walk evictable " + std::to_string(evictable) +
                               " / protected " + std::to_string(prot) + ", counters " +
                               std::to_string(evictable_) + " / " + std::to_string(protected_));
    std::unordered_set<Node*> members;
    bool indexed = true;
    for (size_t i = 0; indexed && i < leaves_.size(); ++i) {
        const int64_t id = leaves_[i].id;
        indexed = members.insert(leaves_[i].node).second && leaves_[i].node->id == id &&
                  is_leaf(id) && leaf_at_[static_cast<size_t>(id)] == i + 1;
    }
    const auto n_indexed = std::count_if(leaf_at_.begin(), leaf_at_.end(),
                                         [](uint32_t at) { return at != 0; });
    if (!indexed || static_cast<size_t>(n_indexed) != leaves_.size())
        throw IntegrityFailure("evictable leaves: the index by id disagrees with the list");
    if (leaves != members) {
        int64_t missing = 0, extra = 0;
        for (Node* n : leaves) missing += !members.count(n);
        for (Node* n : members) extra += !leaves.count(n);
        throw IntegrityFailure("evictable leaves: walk " + std::to_string(leaves.size()) +
                               ", set " + std::to_string(leaves_.size()) + ", missing " +
                               std::to_string(missing) + ", extra " + std::to_string(extra));
    }
    std::vector<int64_t> values = all_values();
    std::sort(values.begin(), values.end());
    const int64_t n_unique = std::unique(values.begin(), values.end()) - values.begin();
    if (n_unique != n_values)
        throw IntegrityFailure(std::to_string(n_values - n_unique) +
                               " KV slot(s) held by two tree positions");
}

// The slot paths for both element types (radix.hpp): int32 rows (the native core's) and
// int64 arrays (the Python API's).
#define RADIXSCHED_SLOT_PATHS(S)                                                              \
    template void Tree::prefix_slots<S>(Node&, int64_t, S*);                                 \
    template void Tree::path_slots<S>(const Node&, int64_t, int64_t, int64_t, S*) const;     \
    template WalkResult Tree::insert<S>(const int32_t*, int64_t, int32_t, const S*, int64_t, \
                                        int64_t, int64_t, Node*, int64_t, int64_t,           \
                                        const SlotShare*, const SlotShare*);                 \
    template int64_t Tree::evict_to<S>(int64_t, S*, int64_t, std::vector<int64_t>&);
RADIXSCHED_SLOT_PATHS(int32_t)
RADIXSCHED_SLOT_PATHS(int64_t)
#undef RADIXSCHED_SLOT_PATHS

}  // namespace radixsched
