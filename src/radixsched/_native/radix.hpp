// The radix prefix cache of radixsched.cache.radix, in C++: the same tree, the same logical
// clock, the same splits, locks and eviction order, so that a scheduler over it gives the
// reference's schedule bit for bit. Pure C++ (no Python here): the binding (module.cpp) turns
// the event hooks into the Python listener's calls.
//
// Ownership: a node owns its children (shared_ptr, so that a handle held by Python keeps an
// evicted node alive as a detached node); `parent` is a non-owning pointer, valid while the
// node is attached, null for the root and for detached nodes.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace radixsched {

// Accounting is off (the Python IntegrityError).
struct IntegrityFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Built-in eviction strategies (radixsched.cache.evict), by their sort keys.
enum class Strategy { Lru, Mru, Fifo, Filo, Lfu, Priority, Slru };

struct Node;
using NodePtr = std::shared_ptr<Node>;

// An index of a node's children (Node::children) by their key: the child's first page, with
// its namespace id when it hangs under the root in a non-default namespace (the key `page_key`
// spells as bytes). An open-addressing table (linear probing, power-of-two capacity, at most
// 3/4 full) of non-owning pointers and their keys' hashes: a lookup hashes the query's page in
// place and checks the candidate against the child's own first page, so that it builds no key
// string and follows no bucket chain. It holds exactly the children that `children` holds.
class ChildIndex {
public:
    struct Entry {
        uint64_t hash = 0;
        Node* node = nullptr;  // null: a free entry
    };
    // The hash of a key: `n` tokens of `page`, and `nsp` (the namespace id under the root, 0
    // anywhere else and for the default namespace).
    static uint64_t hash(const int32_t* page, int64_t n, int32_t nsp);
    // The child under that key (null when none): its hash, first page and namespace agree.
    Node* get(const int32_t* page, int64_t n, int32_t nsp) const;
    void add(Node& child);  // its key_hash is set; no child holds that key yet
    void replace(const Node& old, Node& now);  // `now` takes `old`'s key and entry
    void remove(const Node& child);
    // A hint: asks for the cache line of `child`'s home entry (before a remove).
    void prefetch(const Node& child) const;
    // The entry a lookup of a key hashing to `h` reads first (null while the table is empty).
    const Entry* home(uint64_t h) const {
        return table_.empty() ? nullptr : &table_[h & (table_.size() - 1)];
    }
    size_t size() const { return size_; }

private:
    size_t find_entry(const Node& child) const;  // its index (the child must be here)
    void grow();

    std::vector<Entry> table_;
    size_t size_ = 0;
};

// An allocator whose resize leaves new ints uninitialised (a node's slots are always written
// right after they are sized).
template <class T>
struct UninitAlloc : std::allocator<T> {
    template <class U>
    struct rebind {
        using other = UninitAlloc<U>;
    };
    UninitAlloc() = default;
    template <class U>
    UninitAlloc(const UninitAlloc<U>&) noexcept {}
    template <class U>
    void construct(U* p) noexcept {
        ::new (static_cast<void*>(p)) U;
    }
    template <class U, class... Args>
    void construct(U* p, Args&&... args) {
        ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
};

// `n` slots widened to int64 (out[i] = in[i]).
void widen_slots(const int32_t* in, int64_t n, int64_t* out);

// `n` slots to `out` as its element type holds them: int32 (the native core's rows, as a
// node's) a plain copy, int64 (the Python API's arrays) widened.
inline void copy_slots(const int32_t* in, int64_t n, int32_t* out) {
    if (n > 0) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(int32_t));
}
inline void copy_slots(const int32_t* in, int64_t n, int64_t* out) { widen_slots(in, n, out); }

// A block of slots that several holders may share (a request's KV row buffer, kv.cpp's
// rows): kept alive while any holds it. A view of part of one, for Tree::insert: `begin` and
// `len` the whole block's.
using SlotOwner = std::shared_ptr<const int32_t>;
struct SlotShare {
    SlotOwner owner;
    const int32_t* begin = nullptr;
    int64_t len = 0;
};

// A node's KV slots, held as int32: half the bytes of int64 slots (a node's slots are copied
// out on every match, prefix take and eviction). Either a block of its own or a view of a
// shared block (SlotShare: the request's KV row it was inserted from, not copied), never
// written through either way (a row's writers write only past what its checkpoints inserted).
// A view is kept only while it holds at least 1/kShareFraction of its block (a shorter piece
// is copied out to a block of its own: shared blocks pin at most that many times the slots
// the tree holds). The native core's request rows are int32 too (a plain copy each way); the
// Python API's arrays are int64 (a widening copy out, a checked narrowing one in: a slot
// outside int32 is refused where it comes in, before anything changes; an int32 row never
// holds one, see pool.hpp).
class SlotVec {
public:
    static constexpr size_t kShareFraction = 16;

    SlotVec() = default;
    SlotVec(const int64_t* first, const int64_t* last) { assign(first, last); }
    SlotVec(const int32_t* first, const int32_t* last) { assign(first, last); }
    // [first, last) of `share`'s block: a view where it is long enough, else a copy.
    SlotVec(const int32_t* first, const int32_t* last, const SlotShare& share);
    SlotVec(const SlotVec&) = default;  // (a copy shares the block: never written through)
    SlotVec& operator=(const SlotVec&) = default;
    SlotVec(SlotVec&& o) noexcept
        : owner_(std::move(o.owner_)), data_(o.data_), n_(o.n_), block_(o.block_) {
        o.data_ = nullptr;
        o.n_ = o.block_ = 0;
    }
    SlotVec& operator=(SlotVec&& o) noexcept {
        if (this != &o) {
            owner_ = std::move(o.owner_);
            data_ = o.data_;
            n_ = o.n_;
            block_ = o.block_;
            o.data_ = nullptr;
            o.n_ = o.block_ = 0;
        }
        return *this;
    }
    SlotVec& operator=(const std::vector<int64_t>& v) {  // the binding's `value` setter
        assign(v.data(), v.data() + v.size());
        return *this;
    }
    void assign(const int64_t* first, const int64_t* last);  // std::invalid_argument if out of int32
    void assign(const int32_t* first, const int32_t* last);  // a copy in a block of its own
    // Slots [m, from.size()) of `from` (a view of its block where long enough).
    void assign_tail(const SlotVec& from, size_t m);
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    void clear() { free_all(); }
    void resize(size_t n);  // the tree only shrinks a node's slots
    void free_all() {  // emptied, its block let go of
        owner_.reset();
        data_ = nullptr;
        n_ = block_ = 0;
    }
    const int32_t* data() const { return data_; }
    int64_t operator[](size_t i) const { return data_[i]; }
    int32_t first_item() const {  // checked: a node's key never is empty
        if (n_ == 0) throw std::out_of_range("SlotVec: no first item");
        return data_[0];
    }
    size_t block_size() const { return block_; }  // its block's slots (a view: more than size())
    // Slots [from, to) to out[0, to - from) (S: int32_t or int64_t).
    template <class S>
    void copy_to(size_t from, size_t to, S* out) const {
        copy_slots(data_ + from, static_cast<int64_t>(to - from), out);
    }
    std::vector<int64_t> to_vector() const {
        auto wide = std::vector<int64_t>(n_);
        copy_to(0, n_, wide.data());
        return wide;
    }

private:
    // [first, last) as a view of `owner`'s block of `block` slots where it holds enough of it.
    void view(const int32_t* first, const int32_t* last, const SlotOwner& owner, size_t block);

    SlotOwner owner_;  // its block's owner (null: empty)
    const int32_t* data_ = nullptr;
    size_t n_ = 0;
    size_t block_ = 0;  // its block's length in slots
};

// A block of `n` uninitialised slots of its own (a node's, a row's).
std::shared_ptr<int32_t> new_slot_block(size_t n);

struct Node : std::enable_shared_from_this<Node> {
    // Its tokens, held as its slots are: a block of its own, or a view of the request's prompt
    // it was inserted from (Tree::insert's `key_share`: a prompt is never written once made),
    // kept only while it holds at least 1/kShareFraction of that prompt.
    SlotVec key;
    SlotVec value;  // one KV slot per token of `key`
    Node* parent = nullptr;
    // Its children, owned, in no particular order (a child's place is its `child_at`; a
    // removal moves the last into the hole): the lookups by key go through `index`, and
    // whatever reads them in order sorts them by slot (children_in_order).
    std::vector<std::shared_ptr<Node>> children;
    int64_t lock_ref = 0;
    int64_t last_access_time = 0;
    int64_t creation_time = 0;
    int64_t hit_count = 0;
    int64_t priority = 0;
    int64_t id = 0;
    // Orders siblings as the Python tree's dict does: the id of the first node at this key
    // (a split's upper part inherits it).
    int64_t slot = 0;
    int32_t ns = 0;  // namespace id (0: the default namespace)
    bool top = false;  // hangs (or hung, once detached) directly under the root
    // Its key in its parent (bytes of its first page, prefixed by the namespace id for a
    // child of the root in a non-default namespace; kept once detached).
    std::string child_key;
    size_t child_at = 0;  // its place in its parent's `children` (while attached)
    // Last, so that the fields above keep their cache lines (eviction reads them per leaf).
    ChildIndex index;  // the same children, for lookups by a page in place
    uint64_t key_hash = 0;  // ChildIndex::hash of its key in its parent (kept once detached)

    int64_t size() const { return static_cast<int64_t>(key.size()); }
};

struct WalkResult {
    NodePtr node;
    int64_t length = 0;
};

struct MatchEndResult {
    int64_t length = 0;
    NodePtr node;
    int64_t offset = 0;
};

// Hooks the binding fills in (each may be empty). Called at the Python cache's points.
struct Events {
    std::function<void(Node& parent, const std::string& child_key)> on_child;
    std::function<void(Node& upper, Node& lower)> on_split;
    std::function<void(Node& leaf, int64_t keep)> on_evict;  // before the leaf changes
    // The evicted node's full path key (tokens, namespace) and the number of tokens freed.
    std::function<void(const std::vector<int32_t>& path, int32_t ns, int64_t n)> host_evict;
};

class Tree {
public:
    Tree(int64_t page_size, Strategy strategy, int64_t slru_threshold, bool disabled,
         bool compat_sglang);
    ~Tree();
    Tree(const Tree&) = delete;
    Tree& operator=(const Tree&) = delete;

    Events events;
    bool heap_persistent;

    const NodePtr& root() const { return root_; }
    int64_t page_size() const { return page_; }
    bool disabled() const { return disabled_; }
    int64_t clock() const { return clock_; }

    // The Python methods of the same names; token spans are already page-trimmed by nothing:
    // each trims its own query (n - n % page).
    WalkResult walk(const int32_t* tokens, int64_t n, int32_t ns, std::vector<int64_t>* values);
    // walk() that writes the matched slots to out[0, length) as it compares (out, when not
    // null, holds at least n - n % page slots; past `length` its contents are unspecified).
    WalkResult walk_into(const int32_t* tokens, int64_t n, int32_t ns, int64_t* out);
    // walk(path_key(start) + tokens[0, n), ns, nullptr) for an attached `start` below the root
    // at depth `depth`, into `res`: the same clock, access times and splits, without rebuilding
    // (or comparing again) the key of start's path. False, touching nothing, when start's path
    // hangs in another namespace than `ns` (the walk of its key from the root would not find
    // it). Throws IntegrityFailure when start's path does not hold `depth` tokens.
    bool walk_below(Node& start, int64_t depth, const int32_t* tokens, int64_t n, int32_t ns,
                    WalkResult& res);
    int64_t match_len(const int32_t* tokens, int64_t n, int32_t ns);
    MatchEndResult match_end(const int32_t* tokens, int64_t n, int32_t ns, Node* start,
                             int64_t depth);
    NodePtr touch_at(Node& node, int64_t offset);
    // Slot arguments typed S below: int32_t (the native core's rows, a plain copy) or int64_t
    // (the Python API's arrays, widened out and narrowed in, checked).
    template <class S>
    void prefix_slots(Node& node, int64_t length, S* out);
    // The slots of positions [from, to) of the path from the root to `node` (which holds
    // `length` >= to tokens) to out[0, to - from), reading only the nodes that hold them.
    template <class S>
    void path_slots(const Node& node, int64_t length, int64_t from, int64_t to, S* out) const;
    // `share` (int32 values only, may be null): the block `values` lie in, which the new
    // leaf may view instead of copying its slots; `key_share` (may be null): the block
    // `tokens` lie in (a prompt), which the new leaf's key may view the same way.
    template <class S>
    WalkResult insert(const int32_t* tokens, int64_t n_tokens, int32_t ns, const S* values,
                      int64_t n_values, int64_t priority, int64_t inserted_len, Node* start,
                      int64_t start_depth, int64_t base, const SlotShare* share = nullptr,
                      const SlotShare* key_share = nullptr);
    int64_t inc_lock_ref(Node& node);
    int64_t dec_lock_ref(Node& node);
    void move_lock(Node* old, Node& node);
    // Evicted slots as segments in eviction order.
    std::vector<std::vector<int64_t>> evict(int64_t num_tokens);
    // The same eviction, its segments concatenated (one array for the allocator).
    std::vector<int64_t> evict_flat(int64_t num_tokens);
    // The same eviction, its concatenation written in place: the first `cap` slots to
    // out[0, cap), the rest appended to `excess`. Returns how many went to `out`.
    template <class S>
    int64_t evict_to(int64_t num_tokens, S* out, int64_t cap, std::vector<int64_t>& excess);
    // The same eviction, its concatenation (as the nodes hold it: int32) replacing `out`'s
    // contents (a buffer the caller reuses: no allocation once it is large enough).
    void evict_flat32(int64_t num_tokens, std::vector<int32_t>& out);
    std::vector<int64_t> reset();  // the slots the tree held

    int64_t evictable_size() const { return evictable_; }
    int64_t protected_size() const { return protected_; }
    int64_t num_evictable_leaves() const { return static_cast<int64_t>(leaves_.size()); }
    std::vector<NodePtr> nodes() const;  // every non-root node, parents first, dict order
    std::vector<int64_t> all_values() const;
    std::vector<int64_t> dfs_weight_order_at(const std::vector<std::pair<Node*, int64_t>>& ends);
    void check_integrity() const;

    // Test hooks (the Python tests corrupt counters to see check_integrity catch it).
    void add_evictable_size(int64_t d) { evictable_ += d; }
    void leaf_set(Node& node, bool member);
    bool leaf_member(const Node& node) const { return is_leaf(node.id); }

    std::string page_key(const int32_t* page, Node* parent, int32_t ns) const;
    static std::vector<NodePtr> children_in_order(const Node& node);
    std::vector<int32_t> path_key(const Node& node) const;  // its tokens from the root

private:
    struct HeapEntry {
        int64_t a, b, id;
        Node* node;  // may be stale (dangling): dereferenced only once is_leaf(id)
        bool operator>(const HeapEntry& o) const {
            if (a != o.a) return a > o.a;
            if (b != o.b) return b > o.b;
            return id > o.id;
        }
    };

    NodePtr new_root();
    // The evictable leaves: `leaves_` in no particular order (nothing reads its order: the
    // heap orders its entries by (a, b, id), and two entries equal in those are equal in all,
    // as an id names one node, so they pop in the same order whatever order they were pushed
    // or heapified in), and by node id 1 + a node's index in it
    // (`leaf_at_`, 0: not a leaf, as for an id past its end). Node ids are never reused,
    // so a heap entry's id tells, without reading its (maybe freed) node, whether that node
    // is an evictable leaf. Adding a member or removing a non-member does nothing.
    bool is_leaf(int64_t id) const {
        return static_cast<uint64_t>(id) < leaf_at_.size() && leaf_at_[static_cast<size_t>(id)];
    }
    int64_t new_id();  // next_id_++, with its (zero) entry in leaf_at_: one per id handed out
    void leaf_add(Node& n);
    void leaf_remove(const Node& n);
    std::pair<int64_t, int64_t> prio(const Node& n) const;
    void mark_evictable(Node& n);
    void push(Node& n);
    void pop_heap_entry();
    NodePtr find_child(Node& node, const int32_t* page, int32_t ns);
    Node* find_child_ptr(Node& node, const int32_t* page, int32_t ns) const;
    int64_t mismatch(const int32_t* tokens, int64_t avail, const Node& node) const;
    bool covers(const int32_t* tokens, int64_t avail, const Node& node) const;
    // covers(), copying the node's slots to `out` (when not null) as it compares; while it
    // compares, the lookup of the page after the node's key (if the query has one) in the
    // node's children is started ahead (cache hints only).
    bool covers_copy(const int32_t* tokens, int64_t avail, const Node& node, int64_t* out) const;
    NodePtr split(Node& child, int64_t m, int64_t now);
    // walk_into's descent from `node` at depth `pos`: tokens[i] (and out[i]) are position
    // pos + i of the key, `n` its (trimmed) end, past pos; `now` the walk's clock.
    WalkResult descend(Node* node, int64_t pos, const int32_t* tokens, int64_t n, int32_t ns,
                       int64_t now, int64_t* out);
    void touch_path_up(Node& node, int64_t depth, int64_t now, int64_t priority,
                       int64_t inserted_len);
    NodePtr make_node(SlotVec key, SlotVec value, Node* parent,
                      int32_t ns, int64_t now, int64_t priority);
    void check_attached(const Node& node) const;
    // Where evicted slots go: whole segments (moved), or appended to one flat array; with
    // `out` (or `out32`, an int32 row), out[pos, cap) is filled first (in eviction order) and
    // only the rest goes to flat.
    struct Freed {
        std::vector<std::vector<int64_t>>* segments = nullptr;
        std::vector<int64_t>* flat = nullptr;
        std::vector<int32_t>* flat32 = nullptr;  // appended to as int32 (instead of flat)
        int64_t* out = nullptr;
        int32_t* out32 = nullptr;
        int64_t cap = 0;
        int64_t pos = 0;  // slots written to out
        void take(SlotVec&& v);
        void copy(const int32_t* begin, const int32_t* end);
    };
    void evict_into(int64_t num_tokens, Freed& freed);
    void evict_whole(Node& leaf, Freed& freed);
    void detach_all();

    int64_t page_;
    Strategy strategy_;
    int64_t slru_threshold_;
    bool disabled_;
    bool compat_;
    int64_t next_id_ = 0;
    int64_t clock_ = 0;
    NodePtr root_;
    int64_t evictable_ = 0;
    int64_t protected_ = 0;
    struct Leaf {
        Node* node;
        int64_t id;  // node->id (a swap-remove re-indexes the moved leaf without reading it)
    };
    std::vector<Leaf> leaves_;  // attached, lock_ref == 0, no children, not the root
    std::vector<uint32_t> leaf_at_;  // by node id (< next_id_): 1 + its index in leaves_, or 0
    std::vector<HeapEntry> heap_;  // min-heap by (a, b, id) via std::greater
};

Strategy strategy_from_name(const std::string& name);
bool strategy_monotone(Strategy s);

}  // namespace radixsched
