// See radix_match.hpp.
#include "radix_match.hpp"

#include <nanobind/stl/shared_ptr.h>

// numpy's C API, this file's own table (imported once, in numpy()): arrays are read and made
// through it without the buffer protocol's and numpy.empty's argument handling.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace radixsched {
namespace {

// numpy's functions, looked up once and held for the life of the process (never released:
// Python objects must not be touched after interpreter shutdown, when statics are destroyed).
struct Numpy {
    PyObject* ascontiguousarray;
    PyObject* int32;
};

const Numpy& numpy() {
    static const Numpy np = [] {
        if (_import_array() < 0) throw nb::python_error();
        nb::module_ m = nb::module_::import_("numpy");
        return Numpy{m.attr("ascontiguousarray").inc_ref().ptr(),
                     m.attr("dtype")("int32").inc_ref().ptr()};
    }();
    return np;
}

// `obj` is a 1-d, aligned, contiguous numpy.ndarray (not a subclass) of native-order int32,
// read in place: its data and length. Its first token's line is asked for at once, so that
// that miss overlaps the length's (both are in blocks of their own, rarely in cache).
bool plain_int32(PyObject* obj, const int32_t** data, Py_ssize_t* len) {
    numpy();  // the C API table is imported
    if (!PyArray_CheckExact(obj)) return false;
    auto* a = reinterpret_cast<PyArrayObject*>(obj);
    if (PyArray_TYPE(a) != NPY_INT32 || !PyArray_ISNOTSWAPPED(a) || !PyArray_ISALIGNED(a) ||
        PyArray_NDIM(a) != 1)
        return false;
    *data = static_cast<const int32_t*>(PyArray_DATA(a));
    __builtin_prefetch(*data);
    if (PyArray_STRIDE(a, 0) != sizeof(int32_t) && PyArray_DIM(a, 0) > 1) return false;
    *len = PyArray_DIM(a, 0);
    return true;
}

// A buffer's format names a native-order 4-byte signed int.
bool int32_format(const char* f) {
    if (f == nullptr) return false;
    if (*f == '@' || *f == '=' || *f == '<') ++f;  // x86-64 and aarch64 are little-endian
    return (f[0] == 'i' || f[0] == 'l') && f[1] == '\0';
}


// A new instance of the tuple type `type` holding (slots, length, node, 0), as
// tuple.__new__(type, (slots, length, node, 0)) makes it.
nb::object result_of(PyTypeObject* type, nb::object slots, int64_t length, const NodePtr& node) {
    nb::object fields[4] = {std::move(slots), nb::int_(length), nb::cast(node), nb::int_(0)};
    PyObject* res = type->tp_alloc(type, 4);
    if (res == nullptr) throw nb::python_error();
    for (Py_ssize_t i = 0; i < 4; ++i) PyTuple_SET_ITEM(res, i, fields[i].release().ptr());
    return nb::steal(res);
}

PyTypeObject* tuple_type(nb::handle result) {
    auto* type = reinterpret_cast<PyTypeObject*>(result.ptr());
    if (!PyType_Check(result.ptr()) || !PyType_IsSubtype(type, &PyTuple_Type))
        throw nb::type_error("match_prefix: result must be a tuple type");
    return type;
}

// The walk over `tok` in namespace `ns`, as a `type` instance holding the matched slots.
nb::object walk_result(Tree& tree, const TokenView& tok, int32_t ns, PyTypeObject* type) {
    const int64_t n = tok.size() - tok.size() % tree.page_size();
    auto [arr, out] = new_slots(n);
    const WalkResult r = tree.walk_into(tok.data(), tok.size(), ns, out);
    if (r.length < n) {  // a partial match: its own exact-size array
        auto [exact, dst] = new_slots(r.length);
        std::memcpy(dst, out, static_cast<size_t>(r.length) * sizeof(int64_t));
        arr = std::move(exact);
    }
    return result_of(type, std::move(arr), r.length, r.node);
}

// set_match_types' objects (held for the life of the process, as numpy()'s).
struct MatchTypes {
    PyTypeObject* result = nullptr;
    PyObject* empty_slots = nullptr;
    PyObject* namespace_id = nullptr;
};

MatchTypes& match_types() {
    static MatchTypes t;
    return t;
}

}  // namespace

std::pair<nb::object, int64_t*> new_slots(int64_t n) {
    numpy();  // the C API table is imported
    npy_intp dims[1] = {static_cast<npy_intp>(n)};
    nb::object arr = nb::steal(PyArray_SimpleNew(1, dims, NPY_INT64));
    if (!arr.is_valid()) throw nb::python_error();
    auto* data = static_cast<int64_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(arr.ptr())));
    return {std::move(arr), data};
}

nb::ndarray<nb::numpy, int64_t, nb::ndim<1>> to_numpy(const SlotVec& v) {
    auto holder = std::make_unique<std::vector<int64_t>>(v.to_vector());
    int64_t* data = holder->data();
    const size_t n = holder->size();
    nb::capsule owner(holder.get(),
                      [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
    holder.release();  // the capsule owns it now
    return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(data, {n}, owner);
}

TokenView::TokenView(nb::handle obj) {
    Py_ssize_t len = 0;
    if (plain_int32(obj.ptr(), &data_, &len)) {
        size_ = len;
        return;
    }
    if (take(obj)) return;
    PyObject* args[] = {obj.ptr(), numpy().int32};
    copy_ = nb::steal(PyObject_Vectorcall(numpy().ascontiguousarray, args, 2, nullptr));
    if (!copy_.is_valid()) throw nb::python_error();
    if (!take(copy_)) throw nb::type_error("tokens must be a 1-d sequence of ints");
}

bool TokenView::take(nb::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        view_ = Py_buffer{};
        return false;
    }
    if (view_.ndim == 1 && view_.itemsize == 4 && int32_format(view_.format)) {
        data_ = static_cast<const int32_t*>(view_.buf);
        size_ = static_cast<int64_t>(view_.len / sizeof(int32_t));
        return true;
    }
    PyBuffer_Release(&view_);
    view_ = Py_buffer{};
    return false;
}

nb::object match_prefix(Tree& tree, nb::handle tokens, int32_t ns, nb::handle result) {
    PyTypeObject* type = tuple_type(result);
    const TokenView tok(tokens);
    return walk_result(tree, tok, ns, type);
}

void set_match_types(nb::handle result, nb::handle empty_slots, nb::handle namespace_id) {
    PyTypeObject* type = tuple_type(result);
    if (!PyCallable_Check(namespace_id.ptr()))
        throw nb::type_error("set_match_types: namespace_id must be callable");
    MatchTypes& t = match_types();
    // Replaced references are dropped: a holder of the old ones holds its own.
    Py_INCREF(type);
    Py_XDECREF(reinterpret_cast<PyObject*>(t.result));
    t.result = type;
    Py_XSETREF(t.empty_slots, Py_NewRef(empty_slots.ptr()));
    Py_XSETREF(t.namespace_id, Py_NewRef(namespace_id.ptr()));
}

namespace {

// A CacheKey (tokens, namespace): its tokens, their number, and the namespace's id (0 for None,
// else namespace_id(namespace), set_match_types' function).
struct KeyParts {
    PyObject* tokens;
    Py_ssize_t len;
    int32_t ns;
};

// The key's two items (a type error naming `who` unless it is a pair).
std::pair<PyObject*, PyObject*> key_items(nb::handle key, const char* who) {
    PyObject* k = key.ptr();
    if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 2)
        throw nb::type_error(
            (std::string(who) + ": the key must be a (tokens, namespace) tuple").c_str());
    return {PyTuple_GET_ITEM(k, 0), PyTuple_GET_ITEM(k, 1)};
}

KeyParts key_parts(nb::handle key, const char* who) {
    const auto [tokens, nsobj] = key_items(key, who);
    const int32_t* data = nullptr;
    Py_ssize_t len = 0;
    if (!plain_int32(tokens, &data, &len)) len = PyObject_Size(tokens);
    if (len < 0) throw nb::python_error();
    int32_t ns = 0;
    if (len > 0 && nsobj != Py_None) {  // (an empty key is never walked: no id asked)
        PyObject* args[] = {nsobj};
        nb::object id =
            nb::steal(PyObject_Vectorcall(match_types().namespace_id, args, 1, nullptr));
        if (!id.is_valid()) throw nb::python_error();
        ns = nb::cast<int32_t>(id);
    }
    return {tokens, len, ns};
}

}  // namespace

nb::object match_key(Tree& tree, nb::handle key) {
    const MatchTypes& t = match_types();
    if (t.result == nullptr) throw std::logic_error("match_key before set_match_types");
    if (tree.disabled()) {
        key_items(key, "match_prefix");  // the key's shape is checked all the same
        return result_of(t.result, nb::borrow(t.empty_slots), 0, tree.root());
    }
    const KeyParts kp = key_parts(key, "match_prefix");
    if (kp.len == 0) return result_of(t.result, nb::borrow(t.empty_slots), 0, tree.root());
    const TokenView tok(nb::handle{kp.tokens});
    return walk_result(tree, tok, kp.ns, t.result);
}

void touch_keys(Tree& tree, nb::handle keys) {
    if (match_types().namespace_id == nullptr)
        throw std::logic_error("touch_prefixes before set_match_types");
    if (tree.disabled()) return;
    for (nb::handle key : keys) {  // in order, each walked before the next is read
        const KeyParts kp = key_parts(key, "touch_prefixes");
        if (kp.len == 0) continue;
        const TokenView tok(nb::handle{kp.tokens});
        tree.walk_into(tok.data(), tok.size(), kp.ns, nullptr);
    }
}

nb::object walk_node(Tree& tree, nb::handle tokens, int32_t ns) {
    const TokenView tok(tokens);
    const WalkResult r = tree.walk_into(tok.data(), tok.size(), ns, nullptr);
    return nb::make_tuple(r.node, r.length);
}

}  // namespace radixsched
