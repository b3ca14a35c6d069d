// See kv.hpp; mirrors KVManager.alloc / checkpoint (radixsched/kv.py).
#include "kv.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace radixsched {

void require_same_mode(const Tree& tree, const Pool& pool) {
    if (tree.counting() != pool.counting())
        throw std::invalid_argument(std::string("a ") +
                                    (tree.counting() ? "counting" : "slotted") + " tree with a " +
                                    (pool.counting() ? "counting" : "slotted") + " pool");
}

template <class S>
bool alloc_evicting(Tree& tree, Pool& pool, S* out, int64_t n) {
    require_same_mode(tree, pool);
    if constexpr (sizeof(S) == sizeof(int32_t)) pool.require_int32();  // before any eviction
    const int64_t short_by = n - pool.available_size();
    if (short_by <= 0) return pool.alloc_into(out, n);
    if (pool.counting()) {  // evicted and freed by number, then allocated: recycle's counts
        pool.free_count(tree.evict_count(short_by));
        return pool.alloc_into(out, n);
    }
    // A bad `n`, or a cache too small to cover it: through segments, as the Python does
    // (`out` stays untouched when it fails).
    if (n % pool.page_size() != 0 || tree.evictable_size() < short_by)
        return pool.recycle_into(tree.evict(short_by), out, n);
    // Else the evicted slots go straight into `out` in eviction order (no copy in between),
    // any excess past n (only when a whole leaf overshoots: no allocation otherwise) into
    // `excess`: recycle_into's result and free list.
    std::vector<int64_t> excess;
    const int64_t got = tree.evict_to(short_by, out, n, excess);
    return pool.recycle_placed(out, n, got, excess);
}

int64_t evict_free(Tree& tree, Pool& pool, int64_t num_tokens) {
    require_same_mode(tree, pool);
    if (pool.counting()) {
        const int64_t n = tree.evict_count(num_tokens);
        pool.free_count(n);
        return n;
    }
    // One buffer reused across calls (moved out while in use: an event hook may call back).
    static std::vector<int32_t> spare;
    std::vector<int32_t> freed = std::move(spare);
    tree.evict_flat32(num_tokens, freed);
    const auto n = static_cast<int64_t>(freed.size());
    if (n != 0) pool.free(freed.data(), n, false);
    spare = std::move(freed);
    return n;
}

template <class S>
NodePtr checkpoint(Tree& tree, Pool& pool, const CheckpointOf<S>& c) {
    require_same_mode(tree, pool);
    const bool from_lock = c.lock != nullptr && c.lock != tree.root().get();
    const int64_t start = from_lock ? c.lo : 0;
    if (c.start != start || c.n_tokens != c.aligned - start || c.lo < 0 || c.aligned <= c.lo ||
        c.row_len < c.aligned)
        throw std::invalid_argument(
            "checkpoint: tokens from " + std::to_string(c.start) + " (" +
            std::to_string(c.n_tokens) + ") and a row of " + std::to_string(c.row_len) +
            " do not cover [" + std::to_string(c.lo) + ", " + std::to_string(c.aligned) + ")");
    const WalkResult res =
        from_lock ? tree.insert(c.tokens, c.n_tokens, c.ns, c.row + c.lo, c.aligned - c.lo,
                                c.priority, c.inserted_len, c.lock, c.lo, c.lo, c.share,
                                c.key_share)
                  : tree.insert(c.tokens, c.n_tokens, c.ns, c.row, c.aligned, c.priority,
                                c.inserted_len, nullptr, 0, 0, c.share, c.key_share);
    NodePtr node = res.node;
    if (res.length != c.lo || tree.disabled()) {
        // Some of it was cached already: re-match the whole key from the root (its path to
        // the lock is the request's first lo tokens) and use the cache's copies. From the lock
        // on when its path is in the key's namespace (the walk from the root finds that path:
        // walk_below touches it without rebuilding its key), else with its path's key.
        WalkResult m;
        if (!tree.disabled() && (c.aligned - start) % tree.page_size() == 0 &&
            (!from_lock || c.lock->ns == c.ns)) {
            // The re-match would walk exactly the path the insert just walked (or built) down
            // to res.node, at depth `aligned`, and split nothing: only its touch of that path
            // (a clock tick, the path's access times), without comparing the key again.
            m = WalkResult{tree.touch_at(*res.node, res.node->size()), c.aligned};
        } else if (!from_lock) {
            m = tree.walk_into(c.tokens, c.aligned, c.ns, nullptr);  // the whole key
        } else if (!tree.walk_below(*c.lock, c.lo, c.tokens, c.n_tokens, c.ns, m)) {
            std::vector<int32_t> key = tree.path_key(*c.lock);
            if (static_cast<int64_t>(key.size()) != c.lo)
                throw IntegrityFailure("checkpoint: the lock's depth is not the protected length");
            key.insert(key.end(), c.tokens, c.tokens + c.n_tokens);
            m = tree.walk_into(key.data(), c.aligned, c.ns, nullptr);
        }
        if (m.length < c.aligned) return nullptr;  // the cache did not keep it
        const int64_t dup_end = std::min(res.length, c.aligned);
        if (dup_end > c.lo) {  // only [lo, dup_end) of the path's slots, straight into the row
            pool.free(c.row + c.lo, dup_end - c.lo, true);
            tree.path_slots(*m.node, m.length, c.lo, dup_end, c.row + c.lo);
        }
        node = m.node;
    }
    tree.move_lock(c.lock, *node);
    return node;
}

template bool alloc_evicting<int32_t>(Tree&, Pool&, int32_t*, int64_t);
template bool alloc_evicting<int64_t>(Tree&, Pool&, int64_t*, int64_t);
template NodePtr checkpoint<int32_t>(Tree&, Pool&, const CheckpointOf<int32_t>&);
template NodePtr checkpoint<int64_t>(Tree&, Pool&, const CheckpointOf<int64_t>&);

}  // namespace radixsched

// ---- NativeKVManager's moves on request objects (the binding) --------------------------------
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>

#include "py_attr.hpp"

// numpy's C API, this file's own table (imported once, in import_numpy()): rows are read and
// made through it without the buffer protocol's and numpy.empty's argument handling.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <class S>
using RowOf = nb::ndarray<S, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Interned names of the request fields read and written here, created once and never released
// (Python objects must not be touched after interpreter shutdown, when statics are destroyed).
struct ReqNames {
    PyObject *prompt_ids, *output_ids, *sampling, *max_new_tokens, *priority, *extra_key,
        *cache_salt, *kv_len, *prefix_len, *cache_protected_len, *cache_inserted_len,
        *lock_node, *last_node, *kv_row, *kv_buf, *host_hit_len, *fill_ids, *extend_end,
        *times, *first_scheduled, *cached_tokens, *host_cached_tokens, *req, *extend_len;
};
const ReqNames* g_req = nullptr;
PyObject* g_extend_entry = nullptr;  // radixsched.runner.ExtendEntry

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

const ReqNames& names() {
    if (g_req == nullptr) {
        static const ReqNames n{
            intern("prompt_ids"),   intern("output_ids"),  intern("sampling"),
            intern("max_new_tokens"), intern("priority"),  intern("extra_key"),
            intern("cache_salt"),   intern("kv_len"),      intern("prefix_len"),
            intern("cache_protected_len"), intern("cache_inserted_len"), intern("lock_node"),
            intern("last_node"),    intern("kv_row"),      intern("kv_buf"),
            intern("host_hit_len"), intern("fill_ids"), intern("extend_end"),
            intern("times"), intern("first_scheduled"), intern("cached_tokens"),
            intern("host_cached_tokens"), intern("req"), intern("extend_len")};
        g_req = &n;
    }
    return *g_req;
}

PyObject* imported(PyObject*& slot, const char* module, const char* attr) {
    if (slot == nullptr) slot = nb::object(nb::module_::import_(module).attr(attr)).release().ptr();
    return slot;
}

using py::get;
using py::get_int;
using py::len_of;
using py::set;
using py::set_int;
using py::slice;

void import_numpy() {
    static const bool done = [] {
        if (_import_array() < 0) throw nb::python_error();
        return true;
    }();
    (void)done;
}

// A request's KV row (its slots in place, valid while the caller holds the array): int32, as
// every row this core makes (r32), or int64, a row made elsewhere (r64: Python code may build
// one, as the reference's rows are); visit() calls f with the one that is set. An empty row
// of any dtype reads as an empty int32 one.
struct RowView {
    int32_t* r32 = nullptr;
    int64_t* r64 = nullptr;
    int64_t len = 0;
    template <class F>
    decltype(auto) visit(F&& f) const {
        if (r64 != nullptr) return f(r64);
        return f(r32);
    }
};

int32_t g_no_slot = 0;  // an empty row's data (never read nor written)

// `obj`'s slots when it is a plain numpy.ndarray (not a subclass) of native-order int32 or
// int64: 1-d, aligned, contiguous (and writable when `write`); else, when not empty, as
// nanobind's ndarray cast reads it (int32 first), which fails as it fails. Only free_row
// reads a row with write false (it never writes it).
RowView row_of(nb::handle obj, bool write = true) {
    import_numpy();
    if (PyArray_CheckExact(obj.ptr())) {
        auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());
        const int t = PyArray_TYPE(a);
        if ((t == NPY_INT32 || t == NPY_INT64) && PyArray_ISNOTSWAPPED(a) &&
            PyArray_ISALIGNED(a) && (!write || PyArray_ISWRITEABLE(a)) && PyArray_NDIM(a) == 1 &&
            (PyArray_STRIDE(a, 0) == PyArray_ITEMSIZE(a) || PyArray_DIM(a, 0) <= 1)) {
            const int64_t len = PyArray_DIM(a, 0);
            if (len == 0) return {&g_no_slot, nullptr, 0};
            if (t == NPY_INT32) return {static_cast<int32_t*>(PyArray_DATA(a)), nullptr, len};
            return {nullptr, static_cast<int64_t*>(PyArray_DATA(a)), len};
        }
    }
    if (len_of(obj) == 0) return {&g_no_slot, nullptr, 0};
    // Not converted (a converted array would not outlive the cast): views of obj's data.
    if (!write) {
        RowOf<const int32_t> narrow;
        if (nb::try_cast(obj, narrow, false))
            return {const_cast<int32_t*>(narrow.data()), nullptr, int64_t(narrow.shape(0))};
        const auto wide = nb::cast<RowOf<const int64_t>>(obj, false);
        return {nullptr, const_cast<int64_t*>(wide.data()), int64_t(wide.shape(0))};
    }
    RowOf<int32_t> narrow;
    if (nb::try_cast(obj, narrow, false)) return {narrow.data(), nullptr, int64_t(narrow.shape(0))};
    const auto wide = nb::cast<RowOf<int64_t>>(obj, false);
    return {nullptr, wide.data(), int64_t(wide.shape(0))};
}

// `obj`'s tokens as nb::cast<Tokens> reads them (its data and length): read in place where
// `obj` is a plain numpy.ndarray of native-order int32, 1-d, aligned and contiguous (a prompt:
// no DLPack capsule made per read), else through that cast, its array (a converted copy where
// it converts) kept in `held`, valid while `held` and `obj` are.
std::pair<const int32_t*, int64_t> tokens_of(nb::handle obj, Tokens& held) {
    import_numpy();
    if (PyArray_CheckExact(obj.ptr())) {
        auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());
        if (PyArray_TYPE(a) == NPY_INT32 && PyArray_ISNOTSWAPPED(a) && PyArray_ISALIGNED(a) &&
            PyArray_NDIM(a) == 1 &&
            (PyArray_STRIDE(a, 0) == PyArray_ITEMSIZE(a) || PyArray_DIM(a, 0) <= 1))
            return {static_cast<const int32_t*>(PyArray_DATA(a)), int64_t(PyArray_DIM(a, 0))};
    }
    held = nb::cast<Tokens>(obj);
    return {held.data(), int64_t(held.shape(0))};
}

// The capsule that keeps an int32 row's block (its SlotOwner) alive: the row array's base.
constexpr const char* kRowCapsule = "radixsched.kv_row_block";

void drop_row_block(PyObject* capsule) {
    delete static_cast<SlotOwner*>(PyCapsule_GetPointer(capsule, kRowCapsule));
}

// numpy.empty(n, numpy.int32), made through numpy's C API: a row and its writable data, over
// a block of slots (new_slot_block) its base capsule holds, which the tree's nodes may share
// (Tree::insert's SlotShare: a checkpoint's leaf views the row's slots); numpy.int64 when
// `wide` (a pool whose slots do not all fit int32: Pool::slots_fit_int32), an array of its own.
nb::object new_row(int64_t n, bool wide) {
    import_numpy();
    npy_intp dims[1] = {static_cast<npy_intp>(n)};
    if (wide) {
        nb::object arr = nb::steal(PyArray_SimpleNew(1, dims, NPY_INT64));
        if (!arr.is_valid()) throw nb::python_error();
        return arr;
    }
    auto owner = std::make_unique<SlotOwner>(new_slot_block(static_cast<size_t>(n)));
    auto* data = const_cast<int32_t*>(owner->get());  // the block is this row's to write
    nb::object cap = nb::steal(PyCapsule_New(owner.get(), kRowCapsule, drop_row_block));
    if (!cap.is_valid()) throw nb::python_error();
    owner.release();  // the capsule owns it now
    nb::object arr = nb::steal(PyArray_SimpleNewFromData(1, dims, NPY_INT32, data));
    if (!arr.is_valid()) throw nb::python_error();
    if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(arr.ptr()), cap.release().ptr()) < 0)
        throw nb::python_error();  // (the reference was stolen either way)
    return arr;
}

// obj[lo:hi] as numpy's slicing makes it (py::slice), made through numpy's C API without the
// slice object and the index parsing, for an exact numpy array of one dimension holding
// [lo, hi): the same dtype, data, stride, writeability and base (numpy's SetBaseObject
// collapses the base chain as slicing does: a view of a view has the first's base). Anything
// else is sliced.
nb::object array_slice(nb::handle obj, int64_t lo, int64_t hi) {
    import_numpy();
    if (PyArray_CheckExact(obj.ptr())) {
        auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());
        if (PyArray_NDIM(a) == 1 && 0 <= lo && lo <= hi && hi <= PyArray_DIM(a, 0)) {
            PyArray_Descr* descr = PyArray_DESCR(a);
            Py_INCREF(descr);  // (stolen by PyArray_NewFromDescr, also when it fails)
            npy_intp dims[1] = {static_cast<npy_intp>(hi - lo)};
            npy_intp strides[1] = {PyArray_STRIDE(a, 0)};
            char* data = PyArray_BYTES(a) + lo * strides[0];
            const int flags = PyArray_FLAGS(a) & NPY_ARRAY_WRITEABLE;  // (numpy sets the rest)
            nb::object v = nb::steal(PyArray_NewFromDescr(&PyArray_Type, descr, 1, dims, strides,
                                                          data, flags, nullptr));
            if (!v.is_valid()) throw nb::python_error();
            Py_INCREF(obj.ptr());  // (stolen by PyArray_SetBaseObject, also when it fails)
            if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(v.ptr()), obj.ptr()) < 0)
                throw nb::python_error();
            return v;
        }
    }
    return slice(obj, lo, hi);
}

// The block of a row buffer made here (new_row: an int32 array over its whole block), as
// Tree::insert shares it; null owner otherwise.
SlotShare row_block(nb::handle obj) {
    import_numpy();
    if (!PyArray_CheckExact(obj.ptr())) return {};
    auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());
    PyObject* base = PyArray_BASE(a);
    if (base == nullptr || !PyCapsule_IsValid(base, kRowCapsule) || PyArray_TYPE(a) != NPY_INT32 ||
        PyArray_NDIM(a) != 1)
        return {};
    const SlotOwner& owner = *static_cast<SlotOwner*>(PyCapsule_GetPointer(base, kRowCapsule));
    if (PyArray_DATA(a) != owner.get()) return {};
    return {owner, owner.get(), PyArray_DIM(a, 0)};
}

// A reference to a prompt array, dropped with the last key that views it. The tree changes
// only under the GIL; where it is not held (or the interpreter is gone, at exit) the
// reference is left, a leak rather than a crash.
struct PromptRef {
    PyObject* obj;
    void operator()(const int32_t*) const noexcept {
        if (Py_IsInitialized() && PyGILState_Check()) Py_DECREF(obj);
    }
};

// A prompt as a block the tree's keys may view (Tree::insert's key share), holding a reference
// to it: an aligned int32 numpy array of one dimension, contiguous (stride 4, so never a
// stand-in) and read-only (a prompt is never written once made; the prompt cache's and the
// workloads' are made read-only). Null owner otherwise: the key is copied.
SlotShare prompt_block(nb::handle obj) {
    import_numpy();
    if (!PyArray_CheckExact(obj.ptr())) return {};
    auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());
    if (PyArray_TYPE(a) != NPY_INT32 || PyArray_NDIM(a) != 1 || PyArray_ISWRITEABLE(a) ||
        PyArray_STRIDE(a, 0) != sizeof(int32_t) || !PyArray_ISALIGNED(a) ||
        !PyArray_ISNOTSWAPPED(a) || PyArray_DIM(a, 0) == 0)
        return {};
    const auto* data = static_cast<const int32_t*>(PyArray_DATA(a));
    Py_INCREF(obj.ptr());  // (dropped by PromptRef, also when the control block's allocation throws)
    return {SlotOwner(data, PromptRef{obj.ptr()}), data, PyArray_DIM(a, 0)};
}

// A non-empty row buffer made here (a writable int32 array over its whole block, new_row)
// whose block nothing else holds (no node of the tree views it): its data and length; null
// otherwise.
int32_t* own_row(nb::handle obj, int64_t* len) {
    const SlotShare b = row_block(obj);
    if (!b.owner || b.len == 0 || b.owner.use_count() != 2) return nullptr;  // (the capsule's, b's)
    auto* a = reinterpret_cast<PyArrayObject*>(obj.ptr());
    if (!PyArray_ISNOTSWAPPED(a) || !PyArray_ISALIGNED(a) || !PyArray_ISWRITEABLE(a)) return nullptr;
    *len = b.len;
    return static_cast<int32_t*>(PyArray_DATA(a));
}

// from[0, n) into a fresh row: a plain copy, int32 widened into an int64 row, or (a row made
// elsewhere, into an int32 one) each int64 slot narrowed, checked (std::invalid_argument).
void copy_row(const int32_t* from, int64_t n, int32_t* to) { copy_slots(from, n, to); }
void copy_row(const int32_t* from, int64_t n, int64_t* to) { copy_slots(from, n, to); }
void copy_row(const int64_t* from, int64_t n, int64_t* to) { std::copy(from, from + n, to); }
void copy_row(const int64_t* from, int64_t n, int32_t* to) {
    for (int64_t i = 0; i < n; ++i) {
        if (from[i] < INT32_MIN || from[i] > INT32_MAX)
            throw std::invalid_argument("a KV slot outside the int32 range");
        to[i] = static_cast<int32_t>(from[i]);
    }
}

// `row`[0, n) copied into `buf` (a fresh row, either dtype).
void copy_into(nb::handle row, int64_t n, nb::handle buf) {
    const RowView to = row_of(buf);
    row_of(row).visit([&](auto* from) { to.visit([&](auto* t) { copy_row(from, n, t); }); });
}

// Released requests' row buffers, kept for the next rows (a row's buffer is 4 bytes per
// position of a request: taking a kept one spares its allocation and the page faults of its
// first writes). A buffer is kept only when nothing else holds it (no view of it, no other
// reference, no node of the tree viewing its block: its contents are then nobody's; a buffer
// whose checkpoints the tree still views is freed once the last such node goes) and handed
// out only where it is at least the
// size asked for and at most twice it. The last kMaxSpare are kept: their references are held
// for the life of the process (never released at exit, as the interned names).
class SpareRows {
public:
    // A row's buffer of at least `n` slots (its contents unspecified, as numpy.empty's): int32,
    // int64 when `wide` (never a kept one).
    nb::object take(int64_t n, bool wide) {
        if (wide) return new_row(n, true);
        for (size_t i = spare_.size(); i-- > 0;) {
            int64_t len = 0;
            int32_t* data = own_row(spare_[i], &len);
            if (data != nullptr && len >= n && len - n <= n) {
                nb::object buf = std::move(spare_[i]);
                spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
                return buf;
            }
        }
        return new_row(n, false);
    }
    // `buf`, the buffer a request just let go of (`buf` the only reference left): kept when
    // it is a row made here (an int32 array over a block of its own) that no node views.
    void give(nb::object buf) {
        PyObject* o = buf.ptr();
        int64_t len = 0;
        if (Py_REFCNT(o) != 1 || own_row(buf, &len) == nullptr) return;
        if (spare_.size() >= kMaxSpare)  // the oldest goes (row sizes drift with the load)
            spare_.erase(spare_.begin());
        spare_.push_back(std::move(buf));
    }

    // Destroyed at exit, after the interpreter: the references are let go of, no decref.
    ~SpareRows() {
        for (nb::object& o : spare_) o.release();
    }

private:
    static constexpr size_t kMaxSpare = 8;
    std::vector<nb::object> spare_;  // owned references
};

SpareRows& spare_rows() {
    static SpareRows rows;  // its exit-time destructor drops the references without a decref
    return rows;
}

// The token of an output id (an int that fits int32, as nb::cast<int32_t> reads it).
int32_t token_of(PyObject* o) {
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        const long v = PyLong_AsLongAndOverflow(o, &overflow);
        if (!overflow && v >= INT32_MIN && v <= INT32_MAX) return static_cast<int32_t>(v);
    }
    return nb::cast<int32_t>(nb::handle(o));
}

// token_of(o) read in place where `o` is an exact int of at most one digit (CPython 3.11's
// layout: the sign and digit count in ob_size, digits of at most 30 bits: its value fits
// int32): true, `*t` set. False otherwise (nothing read: token_of decides).
bool token_in_place(PyObject* o, int32_t* t) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
    if (!PyLong_CheckExact(o)) return false;
    const Py_ssize_t size = Py_SIZE(o);
    if (size < -1 || size > 1) return false;
    const auto digit = static_cast<int32_t>(reinterpret_cast<PyLongObject*>(o)->ob_digit[0]);
    *t = static_cast<int32_t>(size) * digit;
    return true;
#else
    (void)o;
    (void)t;
    return false;
#endif
}

// outs[from, stop) appended to `joined` as tokens (checkpoint's key past the prompt). A list is
// read in place: its ints were made step by step long before (cold, scattered), so each is
// asked for kAhead reads early, that their misses overlap (cache hints only); token_of, which
// may run code of the program's (an int subclass's __index__), is followed by a new read of
// the list's length (the items are read through the list each time).
void append_tokens(std::vector<int32_t>& joined, nb::handle outs, int64_t from, int64_t stop) {
    if (!PyList_CheckExact(outs.ptr())) {
        for (int64_t i = from; i < stop; ++i) joined.push_back(nb::cast<int32_t>(outs[i]));
        return;
    }
    PyObject* const list = outs.ptr();
    constexpr int64_t kAhead = 16;
    Py_ssize_t size = PyList_GET_SIZE(list);
    const int64_t hinted = std::min<int64_t>(stop, size);
    for (int64_t i = from; i < std::min(from + kAhead, hinted); ++i)
        __builtin_prefetch(PyList_GET_ITEM(list, i));
    for (int64_t i = from; i < stop; ++i) {
        if (i >= size) throw std::runtime_error("checkpoint: output_ids shrank while read");
        if (i + kAhead < hinted && i + kAhead < size)
            __builtin_prefetch(PyList_GET_ITEM(list, i + kAhead));
        PyObject* const item = PyList_GET_ITEM(list, i);
        int32_t t;
        if (!token_in_place(item, &t)) {
            t = token_of(item);
            size = PyList_GET_SIZE(list);
        }
        joined.push_back(t);
    }
}

// kv.row_capacity: every position the request can reach, plus a page.
int64_t row_capacity(nb::handle req) {
    const ReqNames& n = names();
    return len_of(get(req, n.prompt_ids)) +
           get_int(get(req, n.sampling), n.max_new_tokens) + 64;
}

[[noreturn]] void alloc_failed(const Tree& tree, const Pool& pool, int64_t n) {
    throw IntegrityFailure("KV allocation of " + std::to_string(n) + " slots failed: available " +
                           std::to_string(pool.available_size()) + ", evictable " +
                           std::to_string(tree.evictable_size()) +
                           " (the admission budget was violated)");
}

TreeOf g_tree_of = nullptr;

const char* const kExtendFields[] = {"req",       "prefix_len",     "new_token_ids", "prefix_slots",
                                     "new_slots", "produces_token", "host_load_len"};

// NativeKVManager's native half: the tree and pool it moves slots between, and its config.
class NativeKV {
public:
    NativeKV(nb::object tree, nb::object pool, int64_t priority_sign, bool compat,
             nb::object ns_of, nb::object empty)
        : tree_obj_(std::move(tree)),
          pool_obj_(std::move(pool)),
          tree_(g_tree_of(tree_obj_).first),
          pool_(nb::cast<Pool*>(pool_obj_)),
          page_(pool_->page_size()),
          wide_(!pool_->slots_fit_int32()),
          negate_(!compat && priority_sign >= 0),
          ns_of_(std::move(ns_of)),
          empty_(std::move(empty)) {
        require_same_mode(*tree_, *pool_);
        names();
    }

    // KVManager.alloc: `n` new slots (an array of the rows' dtype), evicting cache leaves
    // when the free list is short.
    nb::object alloc(int64_t n) {
        nb::object out = new_row(n, wide_);
        const bool ok = row_of(out).visit(
            [&](auto* data) { return alloc_evicting(*tree_, *pool_, data, n); });
        if (!ok) alloc_failed(*tree_, *pool_, n);
        return out;
    }

    // The dtype of the rows made here: int64 for a pool whose slots do not all fit int32.
    bool wide_rows() const { return wide_; }

    // KVManager.grow of one request: its row covers [0, end) (whole pages), grown in place
    // in its buffer (moved to one twice the size when it outgrows it).
    void grow(nb::handle req, int64_t end) {
        const ReqNames& n = names();
        nb::object row = get(req, n.kv_row);
        const int64_t have = len_of(row);
        const int64_t new_len = ceil_page(end, page_);
        if (new_len <= have) return;
        nb::object buf = get(req, n.kv_buf);
        if (len_of(buf) < new_len) {
            nb::object fresh = new_row(2 * new_len, wide_);
            copy_into(row, have, fresh);
            set(req, n.kv_buf, fresh);
            buf = std::move(fresh);
        }
        const int64_t more = new_len - have;
        const bool ok = row_of(buf).visit(
            [&](auto* data) { return alloc_evicting(*tree_, *pool_, data + have, more); });
        if (!ok) alloc_failed(*tree_, *pool_, more);
        set(req, n.kv_row, array_slice(buf, 0, new_len));
    }

    // KVManager.extend_entry without a host tier: positions [prefix_len, end) allocated, the
    // extend described (runner.ExtendEntry).
    nb::object extend_entry(nb::handle req, int64_t prefix_len, int64_t end) {
        const ReqNames& n = names();
        reserve(req, end);
        nb::object prompt = get(req, n.prompt_ids);
        const int64_t outputs = len_of(get(req, n.output_ids));
        nb::object fill = outputs == 0 ? prompt : nb::steal(PyObject_CallMethodNoArgs(
                                                      req.ptr(), n.fill_ids));
        if (!fill.is_valid()) throw nb::python_error();
        int64_t host_load = 0;
        const int64_t host_hit = get_int(req, n.host_hit_len);
        if (host_hit != 0 && prefix_len == get_int(req, n.cache_protected_len) &&
            prefix_len == get_int(req, n.prefix_len)) {
            host_load = std::min(host_hit, end - prefix_len);
            set_int(req, n.host_hit_len, 0);
        }
        set_int(req, n.kv_len, end);
        nb::object row = get(req, n.kv_row);
        nb::object ids = array_slice(fill, prefix_len, end),
                   prefix = array_slice(row, 0, prefix_len),
                   fresh = array_slice(row, prefix_len, end), start = nb::int_(prefix_len),
                   load = nb::int_(host_load);
        nb::handle produces = (end == len_of(prompt) + outputs) ? Py_True : Py_False;
        if (!entry_.valid())
            entry_ = Record(imported(g_extend_entry, "radixsched.runner", "ExtendEntry"),
                            std::vector<const char*>(std::begin(kExtendFields),
                                                     std::end(kExtendFields)));
        return entry_.make({req, start, ids, prefix, fresh, produces, load});
    }

    // extend_entry's slots: the request's row covers [0, end) (a first extend gets its buffer).
    void reserve(nb::handle req, int64_t end) {
        const ReqNames& n = names();
        if (len_of(get(req, n.kv_buf)) == 0) {
            nb::object buf = spare_rows().take(row_capacity(req), wide_);
            set(req, n.kv_buf, buf);
            set(req, n.kv_row, array_slice(buf, 0, 0));
        }
        grow(req, end);
    }

    // free + evictable slots (allocator.available_size() + cache.evictable_size()).
    int64_t room() const { return pool_->available_size() + tree_->evictable_size(); }

    // NativeKVManager.checkpoint (KVManager.checkpoint): insert the request's computed KV
    // [0, up_to) (whole pages) from its locked node, point its row at the cache's copies of
    // what was cached already, move its lock to the new deepest node.
    void checkpoint(nb::handle req, int64_t up_to) {
        const ReqNames& n = names();
        const int64_t aligned = floor_page(std::min(up_to, get_int(req, n.kv_len)), page_);
        const int64_t lo = get_int(req, n.cache_protected_len);
        if (tree_->disabled() || aligned <= lo) {
            set_int(req, n.prefix_len, up_to);
            return;
        }
        nb::object lock_obj = get(req, n.lock_node);
        Node* lock = lock_obj.is_none() ? nullptr : nb::cast<Node*>(lock_obj);
        // The key from the lock's depth (lo; the root's is 0), or whole without a lock.
        const int64_t start = lock != nullptr ? lo : 0;
        nb::object prompt_obj = get(req, n.prompt_ids);
        Tokens held;  // (tokens_of's array where it casts)
        const std::pair<const int32_t*, int64_t> prompt = tokens_of(prompt_obj, held);
        const int32_t* const prompt_data = prompt.first;
        const int64_t np = prompt.second;
        // fill_slice(start, aligned) past the prompt, in the buffer of the calls before (moved
        // out while in use, back at the end: no allocation once it is large enough)
        std::vector<int32_t> joined = std::move(joined_);  // assign() below replaces it
        const int32_t* tokens = prompt_data + start;
        if (aligned > np) {
            joined.reserve(static_cast<size_t>(aligned - start));
            joined.assign(prompt_data + std::min(start, np), prompt_data + np);
            nb::object outs = get(req, n.output_ids);
            append_tokens(joined, outs, std::max<int64_t>(start - np, 0),
                          std::min(aligned - np, len_of(outs)));
            tokens = joined.data();
        }
        nb::object row_obj = get(req, n.kv_row);
        const RowView row = row_of(row_obj);
        // The prompt's block, for the new leaf's key to view (tokens within the prompt only).
        SlotShare key_share;
        if (aligned <= np) {  // (else `tokens` are the joined copy)
            key_share = prompt_block(prompt_obj);
            if (key_share.begin != prompt_data) key_share = SlotShare{};  // converted: copied
        }
        const int32_t ns_id = ns(req);
        const int64_t prio = priority(req), inserted = get_int(req, n.cache_inserted_len);
        // The row's block (its buffer's, when made here): the new leaf views it, no copy.
        SlotShare share;
        if (row.r32 != nullptr && row.len > 0) {
            share = row_block(get(req, n.kv_buf));
            if (share.owner && (row.r32 < share.begin || row.r32 + row.len > share.begin + share.len))
                share = SlotShare{};  // a row over another buffer: copied
        }
        NodePtr node = row.visit([&](auto* slots) {
            using S = std::remove_pointer_t<decltype(slots)>;
            const CheckpointOf<S> c{tokens, aligned - start, start,    ns_id, slots,
                                    row.len, lo,             aligned, prio,  inserted,
                                    lock,   share.owner ? &share : nullptr,
                                    key_share.owner ? &key_share : nullptr};
            return radixsched::checkpoint(*tree_, *pool_, c);
        });
        joined_ = std::move(joined);
        if (node) {  // else the cache did not keep it (nothing moved)
            nb::object a = nb::int_(aligned), h = nb::cast(node);
            set(req, n.cache_protected_len, a);
            set(req, n.cache_inserted_len, a);
            set(req, n.lock_node, h);
            set(req, n.last_node, h);
        }
        set_int(req, n.prefix_len, up_to);
    }

    void take(nb::handle req) { take_prefix(*tree_, *pool_, req); }

    // KVManager.release: everything the request holds given back (its computed KV cached
    // first when `cache_kv`), its own slots and its lock; its KV fields reset.
    void release(nb::handle req, bool cache_kv) {
        const ReqNames& n = names();
        const int64_t kv_len = get_int(req, n.kv_len);
        if (cache_kv && kv_len > get_int(req, n.cache_protected_len)) checkpoint(req, kv_len);
        const int64_t lo = get_int(req, n.cache_protected_len);
        free_row(get(req, n.kv_row), lo);
        nb::object buf = get(req, n.kv_buf);
        nb::object lock = get(req, n.lock_node);
        if (!lock.is_none()) tree_->dec_lock_ref(*nb::cast<Node*>(lock));
        nb::object zero = nb::int_(0);
        set(req, n.lock_node, Py_None);
        set(req, n.last_node, Py_None);
        set(req, n.kv_row, empty_);
        set(req, n.kv_buf, empty_);
        for (PyObject* f : {n.kv_len, n.cache_protected_len, n.cache_inserted_len, n.prefix_len,
                            n.extend_end, n.host_hit_len})
            set(req, f, zero);
        spare_rows().give(std::move(buf));  // kept only where nothing else holds it
    }

    // Scheduler._extend over a round's admissions (adder.Admission, those with tokens to
    // extend, in order): each request's first-schedule stamp (`now()`, read only for a request
    // never scheduled before) and cache counters, then its extend entry. Returns (the entries,
    // and the sums the scheduler's stats add: cached, host-cached and prompt tokens of the
    // requests scheduled for the first time).
    nb::tuple extend_batch(nb::handle admissions, nb::handle now) {
        const ReqNames& n = names();
        nb::list entries;
        int64_t cached_sum = 0, host_sum = 0, prompt_sum = 0;
        for (nb::handle a : admissions) {
            if (get_int(a, n.extend_len) == 0) continue;
            nb::object req = get(a, n.req);
            nb::object times = get(req, n.times);
            if (get(times, n.first_scheduled).is_none()) {
                nb::object t = nb::steal(PyObject_CallNoArgs(now.ptr()));
                if (!t.is_valid()) throw nb::python_error();
                set(times, n.first_scheduled, t);
                const int64_t host = get_int(req, n.host_hit_len);
                const int64_t cached = get_int(req, n.prefix_len) + host;
                const int64_t prompt = len_of(get(req, n.prompt_ids));
                set_int(req, n.cached_tokens, cached);
                set_int(req, n.host_cached_tokens, host);
                cached_sum += std::min(cached, prompt);
                host_sum += std::min(host, prompt);
                prompt_sum += prompt;
            }
            entries.append(
                extend_entry(req, get_int(a, n.prefix_len), get_int(req, n.extend_end)));
        }
        return nb::make_tuple(entries, cached_sum, host_sum, prompt_sum);
    }

private:
    // release's slots: row[lo:] back to the pool (the row is let go of on return).
    void free_row(nb::object row_obj, int64_t lo) {
        const RowView row = row_of(row_obj, false);
        if (row.len > lo) row.visit([&](auto* r) { pool_->free(r + lo, row.len - lo, true); });
    }

    int32_t ns(nb::handle req) {
        const ReqNames& n = names();
        if (get(req, n.extra_key).is_none() && get(req, n.cache_salt).is_none()) return 0;
        return nb::cast<int32_t>(ns_of_(req));
    }

    // KVManager._insert_priority: no priority inserts as 0; more important is kept longer.
    int64_t priority(nb::handle req) {
        nb::object p = get(req, names().priority);
        if (p.is_none()) return 0;
        const auto v = nb::cast<int64_t>(p);
        return negate_ ? -v : v;
    }

    nb::object tree_obj_, pool_obj_;  // kept alive: tree_ and pool_ point into them
    Tree* tree_;
    Pool* pool_;
    int64_t page_;
    bool wide_;    // int64 rows (the pool's slots do not all fit int32)
    bool negate_;  // a priority inserts negated (not compat, priority_sign >= 0)
    nb::object ns_of_;
    nb::object empty_;  // request.EMPTY_SLOTS: a released request's row
    Record entry_;      // runner.ExtendEntry
    std::vector<int32_t> joined_;  // checkpoint's key past the prompt (a reused buffer)
};

}  // namespace

int64_t kv_room(nb::handle kv) { return nb::cast<NativeKV&>(kv).room(); }

void kv_checkpoint(nb::handle kv, nb::handle req, int64_t up_to) {
    nb::cast<NativeKV&>(kv).checkpoint(req, up_to);
}

void kv_release(nb::handle kv, nb::handle req, bool cache_kv) {
    nb::cast<NativeKV&>(kv).release(req, cache_kv);
}

void kv_extend_slots(nb::handle kv, nb::handle req, int64_t end) {
    NativeKV& k = nb::cast<NativeKV&>(kv);
    const ReqNames& n = names();
    if (get_int(req, n.host_hit_len) != 0)
        throw std::invalid_argument("kv_extend_slots: a request with host hits to load");
    k.reserve(req, end);
    set_int(req, n.kv_len, end);
}

Record::Record(nb::handle cls, std::vector<const char*> fields)
    : cls_(nb::borrow(cls)), call_(nb::hasattr(cls, "__post_init__")) {
    for (const char* f : fields) fields_.push_back(nb::steal(intern(f)));
}

nb::object Record::make(std::initializer_list<nb::handle> values) const {
    if (values.size() != fields_.size()) throw std::invalid_argument("Record: field count");
    if (call_) {
        std::vector<PyObject*> args;
        for (nb::handle v : values) args.push_back(v.ptr());
        PyObject* o = PyObject_Vectorcall(cls_.ptr(), args.data(), args.size(), nullptr);
        if (o == nullptr) throw nb::python_error();
        return nb::steal(o);
    }
    auto* type = reinterpret_cast<PyTypeObject*>(cls_.ptr());
    nb::object none_args = nb::steal(PyTuple_New(0));
    nb::object o = nb::steal(type->tp_new(type, none_args.ptr(), nullptr));
    if (!o.is_valid()) throw nb::python_error();
    size_t i = 0;
    for (nb::handle v : values) set(o, fields_[i++].ptr(), v);
    return o;
}

void append_claimed(nb::handle req, Pool& pool, int64_t n) {
    const ReqNames& k = names();
    const nb::object row = get(req, k.kv_row);
    const int64_t have = len_of(row);
    nb::object buf = get(req, k.kv_buf);
    if (len_of(buf) < have + n) {
        nb::object fresh = new_row(std::max<int64_t>(2 * (have + n), 64), !pool.slots_fit_int32());
        copy_into(row, have, fresh);
        set(req, k.kv_buf, fresh);
        buf = std::move(fresh);
    }
    const RowView b = row_of(buf);
    if (b.len < have + n) throw std::logic_error("append_claimed: the KV buffer is too short");
    b.visit([&](auto* data) { pool.claim_into(data + have, n); });
    set(req, k.kv_row, array_slice(buf, 0, have + n));
}

void take_prefix(Tree& tree, const Pool& pool, nb::handle req) {
    const ReqNames& n = names();
    const int64_t len = get_int(req, n.prefix_len);
    nb::object buf =
        spare_rows().take(std::max(row_capacity(req), len), !pool.slots_fit_int32());
    if (len != 0) {
        nb::object last = get(req, n.last_node);
        Node& node = *nb::cast<Node*>(last);
        // int32 to int32 (the rows of any pool whose slots fit int32): a plain copy
        row_of(buf).visit([&](auto* data) { tree.prefix_slots(node, len, data); });
    }
    set(req, n.kv_buf, buf);
    set(req, n.kv_row, array_slice(buf, 0, len));
}

void bind_kv(nb::module_& m, TreeOf tree_of) {
    g_tree_of = tree_of;
    nb::class_<NativeKV>(m, "KV")
        .def(nb::init<nb::object, nb::object, int64_t, bool, nb::object, nb::object>(),
             "tree"_a, "pool"_a, "priority_sign"_a, "compat"_a, "ns_of"_a, "empty_slots"_a)
        .def("release", &NativeKV::release, "req"_a, nb::kw_only(), "cache_kv"_a)
        .def("extend_batch", &NativeKV::extend_batch, "admissions"_a, "now"_a)
        .def("alloc", &NativeKV::alloc, "n"_a)
        .def("grow", &NativeKV::grow, "req"_a, "end"_a)
        .def("extend_entry", &NativeKV::extend_entry, "req"_a, "prefix_len"_a, "end"_a)
        .def("checkpoint", &NativeKV::checkpoint, "req"_a, "up_to"_a)
        .def("take_prefix", &NativeKV::take, "req"_a)
        .def_prop_ro("wide_rows", &NativeKV::wide_rows);
}

}  // namespace radixsched
