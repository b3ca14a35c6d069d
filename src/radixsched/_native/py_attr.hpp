// Attribute and sequence access on Python objects for the native core's request bindings
// (kv.cpp, adder.cpp): every failure is the Python exception, never a null object.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

namespace radixsched::py {

namespace nb = nanobind;

inline nb::object get(nb::handle o, PyObject* name) {
    PyObject* v = PyObject_GetAttr(o.ptr(), name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}
inline int64_t get_int(nb::handle o, PyObject* name) { return nb::cast<int64_t>(get(o, name)); }
inline void set(nb::handle o, PyObject* name, nb::handle v) {
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
