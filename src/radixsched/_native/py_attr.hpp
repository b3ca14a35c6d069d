// Attribute and sequence access on Python objects for the native core's request bindings
// (kv.cpp, adder.cpp): every failure is the Python exception, never a null object.
#pragma once

#include <nanobind/nanobind.h>
#include <structmember.h>  // T_OBJECT_EX, READONLY, READ_RESTRICTED

#include <cstdint>

namespace radixsched::py {

namespace nb = nanobind;

namespace detail {

// Where the generic attribute access of instances of `type` reaches `name` through a member
// descriptor of a __slots__ class (T_OBJECT_EX, no access restriction: the requests' fields),
// its offset in the instance; -1 where it does not (a dict attribute, a property, another
// getattro or setattro). Kept per (type, its version tag, name): a change to the type or a
// base (PyType_Modified) invalidates its tag, and tags are never reused.
struct SlotEntry {
    PyTypeObject* type = nullptr;
    unsigned int version = 0;
    PyObject* name = nullptr;
    Py_ssize_t get_at = -1;  // -1: PyObject_GetAttr decides
    Py_ssize_t set_at = -1;  // -1: PyObject_SetAttr decides
};

inline SlotEntry g_slots[512];  // direct-mapped by (type, name): one table for the module

// The entry of (type, name) filled anew (a miss: the generic lookup, once per type version).
[[gnu::noinline]] inline const SlotEntry& fill_slot_entry(SlotEntry& e, PyTypeObject* t,
                                                          PyObject* name) {
    e = SlotEntry{};
    // Looked up first: _PyType_Lookup assigns the version tag it is valid under.
    PyObject* descr = _PyType_Lookup(t, name);  // borrowed
    if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) return e;  // (not cached)
    e.type = t;
    e.version = t->tp_version_tag;
    e.name = name;
    if (descr != nullptr && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        const PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
        if (m->type == T_OBJECT_EX) {
            if (t->tp_getattro == PyObject_GenericGetAttr && !(m->flags & READ_RESTRICTED))
                e.get_at = m->offset;
            if (t->tp_setattro == PyObject_GenericSetAttr &&
                !(m->flags & (READONLY | PY_WRITE_RESTRICTED)))
                e.set_at = m->offset;
        }
    }
    return e;
}

[[gnu::always_inline]] inline const SlotEntry& slot_entry(PyObject* o, PyObject* name) {
    PyTypeObject* t = Py_TYPE(o);
    const auto key = (reinterpret_cast<uintptr_t>(t) ^ reinterpret_cast<uintptr_t>(name)) >> 4;
    SlotEntry& e = g_slots[key % 512];
    if (e.type == t && e.name == name && PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG) &&
        e.version == t->tp_version_tag)
        return e;
    return fill_slot_entry(e, t, name);
}

inline PyObject*& slot_at(PyObject* o, Py_ssize_t offset) {
    return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset);
}

}  // namespace detail

// o.name (a slot read in place where detail::slot_entry finds one: what member_get does).
inline nb::object get(nb::handle o, PyObject* name) {
    const Py_ssize_t at = detail::slot_entry(o.ptr(), name).get_at;
    if (at >= 0) {
        PyObject* v = detail::slot_at(o.ptr(), at);
        if (v != nullptr) return nb::borrow(v);
    }  // else (an unset slot included) the generic path, which raises its AttributeError
    PyObject* v = PyObject_GetAttr(o.ptr(), name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}
inline int64_t get_int(nb::handle o, PyObject* name) { return nb::cast<int64_t>(get(o, name)); }
// o.name = v (a slot written in place where detail::slot_entry finds one: what member_set
// does, the old value released last).
inline void set(nb::handle o, PyObject* name, nb::handle v) {
    const Py_ssize_t at = detail::slot_entry(o.ptr(), name).set_at;
    if (at >= 0 && v.ptr() != nullptr) {
        PyObject*& slot = detail::slot_at(o.ptr(), at);
        PyObject* old = slot;
        slot = Py_NewRef(v.ptr());
        Py_XDECREF(old);
        return;
    }
    if (PyObject_SetAttr(o.ptr(), name, v.ptr()) != 0) throw nb::python_error();
}
inline void set_int(nb::handle o, PyObject* name, int64_t v) { set(o, name, nb::int_(v)); }
inline int64_t len_of(nb::handle o) {
    const Py_ssize_t n = PyObject_Length(o.ptr());
    if (n < 0) throw nb::python_error();
    return n;
}
inline nb::object slice(nb::handle o, int64_t lo, int64_t hi) {  // o[lo:hi]
    PyObject* v = PySequence_GetSlice(o.ptr(), lo, hi);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

}  // namespace radixsched::py
