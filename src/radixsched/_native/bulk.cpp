// See bulk.hpp.
#include "bulk.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "py_attr.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

// A buffer held for the scope (released however the scope ends).
class Buffer {
public:
    Buffer(PyObject* o, int flags) {
        if (PyObject_GetBuffer(o, &view_, flags) != 0) throw nb::python_error();
    }
    ~Buffer() { PyBuffer_Release(&view_); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    const Py_buffer& view() const { return view_; }

private:
    Py_buffer view_{};
};

nb::object pack_times(nb::handle seqs, nb::handle proto) {
    if (!PyList_CheckExact(seqs.ptr())) throw std::invalid_argument("pack_times: seqs, a list");
    {
        const Buffer one(proto.ptr(), PyBUF_SIMPLE);
        if (one.view().len != static_cast<Py_ssize_t>(sizeof(double)))
            throw std::invalid_argument("pack_times: proto, one float64");
    }
    const Py_ssize_t n = PyList_GET_SIZE(seqs.ptr());
    nb::list out = nb::steal<nb::list>(PyList_New(n));
    if (!out.is_valid()) throw nb::python_error();
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* seq = PyList_GET_ITEM(seqs.ptr(), i);
        if (!PyList_CheckExact(seq)) return nb::none();
        const Py_ssize_t k = PyList_GET_SIZE(seq);
        PyObject* packed = PySequence_Repeat(proto.ptr(), k);  // k zeros, one allocation
        if (packed == nullptr) throw nb::python_error();
        PyList_SET_ITEM(out.ptr(), i, packed);  // owned by `out` from here
        const Buffer buf(packed, PyBUF_WRITABLE);
        if (buf.view().len != k * static_cast<Py_ssize_t>(sizeof(double)))
            throw std::invalid_argument("pack_times: proto * k, k float64");
        auto* dst = static_cast<double*>(buf.view().buf);
        for (Py_ssize_t j = 0; j < k; ++j) {
            PyObject* v = PyList_GET_ITEM(seq, j);
            if (!PyFloat_CheckExact(v)) return nb::none();
            dst[j] = PyFloat_AS_DOUBLE(v);
        }
    }
    return std::move(out);
}

// The doubles of `seq`: an exact list of exact floats (copied into `scratch`), or a
// contiguous one-dimensional buffer of format "d" (held in `held`: released by the caller);
// false (no error set) where it is neither.
bool doubles_of(PyObject* seq, std::vector<double>& scratch, Py_buffer& held, bool& holding,
                const double*& data, Py_ssize_t& n) {
    if (PyList_CheckExact(seq)) {
        n = PyList_GET_SIZE(seq);
        scratch.resize(static_cast<size_t>(n));
        for (Py_ssize_t j = 0; j < n; ++j) {
            PyObject* v = PyList_GET_ITEM(seq, j);
            if (!PyFloat_CheckExact(v)) return false;
            scratch[static_cast<size_t>(j)] = PyFloat_AS_DOUBLE(v);
        }
        data = scratch.data();
        return true;
    }
    if (!PyObject_CheckBuffer(seq)) return false;
    if (PyObject_GetBuffer(seq, &held, PyBUF_FORMAT | PyBUF_ND) != 0) {
        PyErr_Clear();  // (not contiguous: the caller converts it)
        return false;
    }
    holding = true;
    if (held.ndim != 1 || held.itemsize != sizeof(double) || held.format == nullptr ||
        std::strcmp(held.format, "d") != 0)
        return false;
    data = static_cast<const double*>(held.buf);
    n = held.len / static_cast<Py_ssize_t>(sizeof(double));
    return true;
}

// results/requests.py's token_gaps of seqs[first:last] (each longer than one time), written to
// `out` in order: each sequence's later - earlier, in double as numpy subtracts; false (out
// partly written) where a sequence is not doubles_of's or the gaps do not fill `out`.
bool join_gaps(nb::list seqs, Py_ssize_t first, Py_ssize_t last,
               nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cpu> out) {
    if (first < 0 || last > PyList_GET_SIZE(seqs.ptr()) || first > last)
        throw std::invalid_argument("join_gaps: 0 <= first <= last <= len(seqs)");
    double* dst = out.data();
    const auto size = static_cast<Py_ssize_t>(out.shape(0));
    Py_ssize_t at = 0;
    std::vector<double> scratch;
    for (Py_ssize_t i = first; i < last; ++i) {
        Py_buffer held{};
        bool holding = false;
        const double* t = nullptr;
        Py_ssize_t n = 0;
        const bool ok = doubles_of(PyList_GET_ITEM(seqs.ptr(), i), scratch, held, holding, t, n);
        const bool fits = ok && n >= 2 && size - at >= n - 1;
        if (fits)
            for (Py_ssize_t k = 1; k < n; ++k) dst[at++] = t[k] - t[k - 1];
        if (holding) PyBuffer_Release(&held);
        if (!fits) return false;
    }
    return at == size;
}

using Gaps = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A gap's bucket (results/gapstats.py's _buckets: its float64 bits, as int64, shifted right
// arithmetically by `shift`).
int64_t bucket_of(double g, int shift) {
    int64_t bits = 0;
    std::memcpy(&bits, &g, sizeof bits);
    return bits >> shift;  // arithmetic on a negative bit pattern, as numpy's shift of an int64
}

// gapstats._first_pass's count of a batch: counts[bucket] += 1 for each gap; false where a
// bucket is below 0 or at len(counts) or past it (counts then partly added to).
bool count_buckets(Gaps g, nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> counts,
                   int shift) {
    const size_t n = g.shape(0);
    const auto top = static_cast<int64_t>(counts.shape(0));
    const double* v = g.data();
    int64_t* c = counts.data();
    for (size_t i = 0; i < n; ++i) {
        const int64_t b = bucket_of(v[i], shift);
        if (b < 0 || b >= top) return false;
        ++c[b];
    }
    return true;
}

// gapstats._second_pass's kept gaps of a batch: those whose bucket `keep` marks, in order, into
// `out` (as long as g at least); their number. Every bucket must lie in keep's range.
size_t keep_buckets(Gaps g, nb::ndarray<const bool, nb::ndim<1>, nb::c_contig, nb::device::cpu> keep,
                    int shift, nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cpu> out) {
    const size_t n = g.shape(0);
    if (out.shape(0) < n) throw std::invalid_argument("keep_buckets: out shorter than the gaps");
    const auto top = static_cast<int64_t>(keep.shape(0));
    const double* v = g.data();
    const bool* k = keep.data();
    double* dst = out.data();
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
        const int64_t b = bucket_of(v[i], shift);
        if (b < 0 || b >= top) throw std::invalid_argument("keep_buckets: a bucket out of range");
        if (k[b]) dst[at++] = v[i];
    }
    return at;
}

// The attribute names read here, interned once (held for the process's life).
struct Names {
    PyObject* times;
    PyObject* arrival;
    PyObject* first_scheduled;
    PyObject* first_token;
    PyObject* finish;
    PyObject* reason;
    PyObject* prompt_ids;
    PyObject* output_ids;
    PyObject* cached_tokens;
    PyObject* host_cached_tokens;
    PyObject* computed_prefill_tokens;
    PyObject* tenant_key;
    PyObject* token_times;
};

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

const Names& names() {
    static const Names n{intern("times"),          intern("arrival"),
                         intern("first_scheduled"), intern("first_token"),
                         intern("finish"),          intern("reason"),
                         intern("prompt_ids"),      intern("output_ids"),
                         intern("cached_tokens"),   intern("host_cached_tokens"),
                         intern("computed_prefill_tokens"), intern("tenant_key"),
                         intern("token_times")};
    return n;
}

// `tt` as an array('d') of the same doubles: made as `proto * len` and written in place from
// an exact list of exact floats (pack_times' copy), else array('d', tt) (proto's type called).
nb::object packed_one(PyObject* tt, nb::handle proto) {
    if (PyList_CheckExact(tt)) {
        const Py_ssize_t k = PyList_GET_SIZE(tt);
        bool floats = true;
        for (Py_ssize_t j = 0; j < k && floats; ++j) {  // (the floats read in next)
            if (j + 8 < k) __builtin_prefetch(PyList_GET_ITEM(tt, j + 8));
            floats = PyFloat_CheckExact(PyList_GET_ITEM(tt, j));
        }
        if (floats) {
            nb::object packed = nb::steal(PySequence_Repeat(proto.ptr(), k));  // k zeros
            if (!packed.is_valid()) throw nb::python_error();
            const Buffer buf(packed.ptr(), PyBUF_WRITABLE);
            if (buf.view().len != k * static_cast<Py_ssize_t>(sizeof(double)))
                throw std::invalid_argument("compact_requests: proto * k, k float64");
            auto* dst = static_cast<double*>(buf.view().buf);
            for (Py_ssize_t j = 0; j < k; ++j) dst[j] = PyFloat_AS_DOUBLE(PyList_GET_ITEM(tt, j));
            return packed;
        }
    }
    nb::object v = nb::steal(PyObject_CallFunction(
        reinterpret_cast<PyObject*>(Py_TYPE(proto.ptr())), "sO", "d", tt));
    if (!v.is_valid()) throw nb::python_error();
    return v;
}

// shared[n], made by make(n) where absent (deferred.py's shared_stand_in, which adds it).
nb::object stand_in_of(nb::dict shared, nb::handle make, Py_ssize_t n) {
    const nb::object key = nb::steal(PyLong_FromSsize_t(n));
    if (!key.is_valid()) throw nb::python_error();
    if (PyObject* s = PyDict_GetItemWithError(shared.ptr(), key.ptr())) return nb::borrow(s);
    if (PyErr_Occurred()) throw nb::python_error();
    return make(key);
}

// Empties `list` (an exact list only this caller holds: else nothing is done), its items
// released in order with the next ones' objects prefetched: a finished request's output ids
// and token times, objects made one decode step at a time and scattered through the heap,
// whose releases otherwise wait on a cache miss each.
// `items`: scratch, reused from call to call.
void release_items(PyObject* list, std::vector<PyObject*>& items) {
    if (!PyList_CheckExact(list) || Py_REFCNT(list) != 1) return;
    const Py_ssize_t n = PyList_GET_SIZE(list);
    if (n == 0) return;  // (an empty list may have no item buffer)
    items.resize(size_t(n));
    std::memcpy(items.data(), reinterpret_cast<PyListObject*>(list)->ob_item,
                size_t(n) * sizeof(PyObject*));
    Py_SET_SIZE(list, 0);  // the list lets go of them (its buffer is freed with it)
    constexpr Py_ssize_t kAhead = 16;
    constexpr uintptr_t kPool = 4096;  // pymalloc's pool: the header a small object's free reads
    for (Py_ssize_t j = 0; j < n; ++j) {
        if (j + kAhead < n) {
            PyObject* next = items[size_t(j + kAhead)];
            __builtin_prefetch(next, 1);
            __builtin_prefetch(reinterpret_cast<void*>(uintptr_t(next) & ~(kPool - 1)), 1);
        }
        Py_DECREF(items[size_t(j)]);
    }
}

// deferred.py's compact: every request's token times packed first (packed_one), as the Python
// loop does (the packed arrays, which last the run, allocated before any prompt is freed: they
// do not fill the holes the prompts leave, which the next prompts reuse), then each request's
// prompt and output replaced by their lengths' shared stand-ins, its lists released in turn.
void compact_requests(nb::list reqs, nb::dict shared, nb::handle make, nb::handle proto) {
    const Names& k = names();
    std::vector<nb::object> packed;
    packed.reserve(reqs.size());
    for (nb::handle r : reqs)
        packed.push_back(packed_one(py::get(py::get(r, k.times), k.token_times).ptr(), proto));
    std::vector<PyObject*> scratch;
    size_t i = 0;
    for (nb::handle r : reqs) {
        const nb::object times = py::get(r, k.times);
        const nb::object tt = py::get(times, k.token_times);
        py::set(r, k.prompt_ids, stand_in_of(shared, make, py::len_of(py::get(r, k.prompt_ids))));
        const nb::object out = py::get(r, k.output_ids);
        py::set(r, k.output_ids, stand_in_of(shared, make, py::len_of(out)));
        py::set(times, k.token_times, packed.at(i++));
        release_items(out.ptr(), scratch);  // (each list now held here only, where ever)
        release_items(tt.ptr(), scratch);
    }
}

// A time as RequestArrays.of reads it: its double, or NaN for None (`present` false); false
// where it is neither a float nor None.
bool read_time(nb::handle v, double& out, bool& present) {
    if (v.is_none()) {
        out = std::numeric_limits<double>::quiet_NaN();
        present = false;
        return true;
    }
    if (!PyFloat_CheckExact(v.ptr())) return false;
    out = PyFloat_AS_DOUBLE(v.ptr());
    present = true;
    return true;
}

// An exact int in int64's range.
bool read_int(nb::handle v, int64_t& out) {
    if (!PyLong_CheckExact(v.ptr())) return false;
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0) return false;
    if (x == -1 && PyErr_Occurred()) throw nb::python_error();
    out = x;
    return true;
}

constexpr int8_t kRunning = 0, kEnded = 1, kAborted = 2;  // reqarrays.py's codes

using F64s = nb::ndarray<double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Bools = nb::ndarray<bool, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I8s = nb::ndarray<int8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64s = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// Rows of `times` (4 x n): arrival, first_scheduled, first_token, finish; of `present`
// (3 x n): the last three's masks; `code`: each request's finish; rows of `ints` (5 x n):
// prompt and output lengths, cached, host-cached and computed tokens. Returns (distinct
// tenant keys, the token times of the requests completed in order) or None (see the header).
nb::object request_columns(nb::handle reqs, nb::handle abort, F64s times, Bools present,
                           I8s code, I64s ints) {
    const size_t n = code.shape(0);
    if (times.shape(0) != 4 || present.shape(0) != 3 || ints.shape(0) != 5 ||
        times.shape(1) != n || present.shape(1) != n || ints.shape(1) != n)
        throw std::invalid_argument("request_columns: 4, 3 and 5 rows of one entry a request");
    const Names& k = names();
    double* t = times.data();
    bool* p = present.data();
    int64_t* c = ints.data();
    nb::object tenants = nb::steal(PySet_New(nullptr));
    nb::list completed;
    if (!tenants.is_valid()) throw nb::python_error();
    size_t i = 0;
    for (nb::handle r : reqs) {
        if (i == n) throw std::invalid_argument("request_columns: more requests than entries");
        const nb::object tm = py::get(r, k.times);
        bool arrived = false;
        if (!read_time(py::get(tm, k.arrival), t[i], arrived) || !arrived) return nb::none();
        if (!read_time(py::get(tm, k.first_scheduled), t[n + i], p[i]) ||
            !read_time(py::get(tm, k.first_token), t[2 * n + i], p[n + i]) ||
            !read_time(py::get(tm, k.finish), t[3 * n + i], p[2 * n + i]))
            return nb::none();
        const nb::object fin = py::get(r, k.finish);
        const int8_t how = fin.is_none()                                 ? kRunning
                           : py::get(fin, k.reason).ptr() == abort.ptr() ? kAborted
                                                                         : kEnded;
        code.data()[i] = how;
        c[i] = py::len_of(py::get(r, k.prompt_ids));
        c[n + i] = py::len_of(py::get(r, k.output_ids));
        if (!read_int(py::get(r, k.cached_tokens), c[2 * n + i]) ||
            !read_int(py::get(r, k.host_cached_tokens), c[3 * n + i]) ||
            !read_int(py::get(r, k.computed_prefill_tokens), c[4 * n + i]))
            return nb::none();
        if (PySet_Add(tenants.ptr(), py::get(r, k.tenant_key).ptr()) != 0)
            throw nb::python_error();
        if (how == kEnded && p[2 * n + i]) completed.append(py::get(tm, k.token_times));
        ++i;
    }
    if (i != n) throw std::invalid_argument("request_columns: fewer requests than entries");
    return nb::make_tuple(PySet_GET_SIZE(tenants.ptr()), completed);
}

// Where instances of `t` hold their slots: each of `t`'s own members, every one an object
// slot (T_OBJECT_EX) of a class without a __dict__ or weak references whose only base is
// object, made by the generic allocator; empty where `t` is not such a class.
std::vector<Py_ssize_t> slot_offsets(PyTypeObject* t) {
    std::vector<Py_ssize_t> at;
    if (t->tp_base != &PyBaseObject_Type || t->tp_dictoffset != 0 ||
        t->tp_weaklistoffset != 0 || t->tp_alloc != PyType_GenericAlloc ||
        t->tp_members == nullptr)
        return at;
    for (const PyMemberDef* m = t->tp_members; m->name != nullptr; ++m) {
        if (m->type != T_OBJECT_EX) return {};
        at.push_back(m->offset);
    }
    const auto whole = static_cast<Py_ssize_t>(sizeof(PyObject) + at.size() * sizeof(PyObject*));
    if (t->tp_basicsize != whole) return {};
    return at;
}

// The offset `name` is written at on instances of `like`'s type (py_attr.hpp's lookup), or -1.
Py_ssize_t settable(nb::handle like, nb::handle name) {
    if (!PyUnicode_CheckExact(name.ptr())) return -1;
    return py::detail::slot_entry(like.ptr(), name.ptr()).set_at;
}

// A new instance of like's type holding like's slots (new references); `slots`: their
// offsets (slot_offsets, every one set on `like`).
PyObject* copy_of(nb::handle like, const std::vector<Py_ssize_t>& slots) {
    PyTypeObject* t = Py_TYPE(like.ptr());
    PyObject* o = t->tp_alloc(t, 0);  // every slot null (zeroed), tracked when a GC type
    if (o == nullptr) throw nb::python_error();
    for (const Py_ssize_t at : slots)
        py::detail::slot_at(o, at) = Py_NewRef(py::detail::slot_at(like.ptr(), at));
    return o;
}

// slot_offsets of like's type where every slot is set on `like`, else empty.
std::vector<Py_ssize_t> set_slots(nb::handle like) {
    std::vector<Py_ssize_t> slots = slot_offsets(Py_TYPE(like.ptr()));
    for (const Py_ssize_t at : slots)
        if (py::detail::slot_at(like.ptr(), at) == nullptr) return {};
    return slots;
}

nb::object copy_slots(nb::handle like, nb::list objs, nb::tuple names) {
    const std::vector<Py_ssize_t> slots = set_slots(like);
    if (slots.empty()) return nb::none();
    std::vector<Py_ssize_t> copied;
    for (nb::handle name : names) {
        const Py_ssize_t at = settable(like, name);
        if (at < 0 || py::detail::slot_entry(like.ptr(), name.ptr()).get_at != at)
            return nb::none();
        copied.push_back(at);
    }
    const Py_ssize_t n = PyList_GET_SIZE(objs.ptr());
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* src = PyList_GET_ITEM(objs.ptr(), i);
        if (Py_TYPE(src) != Py_TYPE(like.ptr())) return nb::none();
        for (const Py_ssize_t at : copied)
            if (py::detail::slot_at(src, at) == nullptr) return nb::none();
    }
    nb::list out = nb::steal<nb::list>(PyList_New(n));
    if (!out.is_valid()) throw nb::python_error();
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* o = copy_of(like, slots);
        PyList_SET_ITEM(out.ptr(), i, o);  // owned by `out` from here
        PyObject* src = PyList_GET_ITEM(objs.ptr(), i);
        for (const Py_ssize_t at : copied)
            Py_SETREF(py::detail::slot_at(o, at), Py_NewRef(py::detail::slot_at(src, at)));
    }
    return std::move(out);
}

nb::object clone_like(nb::handle like, nb::dict columns, nb::tuple fresh_lists) {
    const std::vector<Py_ssize_t> slots = set_slots(like);
    if (slots.empty()) return nb::none();
    std::vector<std::pair<Py_ssize_t, PyObject*>> set;  // (offset, its column: a list)
    Py_ssize_t n = -1;
    for (auto [name, column] : columns) {
        const Py_ssize_t at = settable(like, name);
        if (at < 0 || !PyList_CheckExact(column.ptr())) return nb::none();
        if (n >= 0 && PyList_GET_SIZE(column.ptr()) != n)
            throw std::invalid_argument("clone_like: columns of one length");
        n = PyList_GET_SIZE(column.ptr());
        set.emplace_back(at, column.ptr());
    }
    std::vector<Py_ssize_t> lists;
    for (nb::handle name : fresh_lists) {
        const Py_ssize_t at = settable(like, name);
        if (at < 0) return nb::none();
        lists.push_back(at);
    }
    if (n < 0) throw std::invalid_argument("clone_like: a column at least");
    nb::list out = nb::steal<nb::list>(PyList_New(n));
    if (!out.is_valid()) throw nb::python_error();
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* o = copy_of(like, slots);
        PyList_SET_ITEM(out.ptr(), i, o);  // owned by `out` from here: freed with it on a throw
        for (const auto& [at, column] : set)
            Py_SETREF(py::detail::slot_at(o, at), Py_NewRef(PyList_GET_ITEM(column, i)));
        for (const Py_ssize_t at : lists) {
            PyObject* fresh = PyList_New(0);
            if (fresh == nullptr) throw nb::python_error();
            Py_SETREF(py::detail::slot_at(o, at), fresh);
        }
    }
    return std::move(out);
}

}  // namespace

void bind_bulk(nb::module_& m) {
    m.def("count_buckets", &count_buckets, "gaps"_a.noconvert(), "counts"_a.noconvert(),
          "shift"_a,
          "counts[bits(gap) >> shift] += 1 for each gap; False where a bucket is out of range "
          "(bulk.hpp)");
    m.def("keep_buckets", &keep_buckets, "gaps"_a.noconvert(), "keep"_a.noconvert(), "shift"_a,
          "out"_a.noconvert(),
          "the gaps whose bucket `keep` marks, in order, into `out`: their number (bulk.hpp)");
    m.def("join_gaps", &join_gaps, "seqs"_a, "first"_a, "last"_a, "out"_a.noconvert(),
          "the gaps within each of seqs[first:last] (float lists or float64 buffers), end to "
          "end into `out`; False where one is neither or the sizes differ (bulk.hpp)");
    m.def("copy_slots", &copy_slots, "like"_a, "objs"_a, "names"_a,
          "copies of `like` (a __slots__ object), one an object of `objs` (of like's type), "
          "each with that object's `names` slots; None where `like` or one of `objs` is not "
          "such an object or a name not their slot (bulk.hpp)");
    m.def("clone_like", &clone_like, "like"_a, "columns"_a, "fresh_lists"_a,
          "copies of `like` (a __slots__ object), one a row of `columns` (name -> list) set "
          "in each, each of `fresh_lists` a new empty list; None where `like` is not such an "
          "object or a name not its slot (bulk.hpp)");
    m.def("compact_requests", &compact_requests, "reqs"_a, "shared"_a, "make"_a, "proto"_a,
          "deferred.py's compact of `reqs`: token times packed as array('d'), prompt and "
          "output replaced by shared[len], made by make(len) where absent (bulk.hpp)");
    m.def("pack_times", &pack_times, "seqs"_a, "proto"_a,
          "each float list of `seqs` as an array('d') (`proto * len`, written in place); "
          "None where one is not exactly a list of floats (bulk.hpp)");
    m.def("request_columns", &request_columns, "reqs"_a, "abort"_a, "times"_a.noconvert(),
          "present"_a.noconvert(), "code"_a.noconvert(), "ints"_a.noconvert(),
          "RequestArrays.of's columns in one pass: (tenants, completed token times), or None "
          "where a value is not as it takes them (bulk.hpp)");
}

}  // namespace radixsched
