// radixsched.clock.VirtualClock's now() and jump_to(t), the clock calls the native loop makes
// most (a few per scheduler step), done in place where the clock is exactly a VirtualClock
// whose class still holds its own two methods: now() is its `_t` (the very object the method
// returns) and jump_to(t) sets `_t = t` when `t > _t` as Python compares them (what the method
// does). Any other clock (a WallClock, a subclass, a class whose method was replaced) is
// called. An instance attribute shadowing a method is not looked for (none is ever set).
#pragma once

#include <nanobind/nanobind.h>

#include "py_attr.hpp"

namespace radixsched::vclock {

namespace nb = nanobind;

// The class and its two functions as first seen (held for the process's life: no Python
// object is touched at exit), and the interned names.
struct Known {
    PyTypeObject* type = nullptr;
    PyObject* now = nullptr;      // VirtualClock.__dict__["now"]
    PyObject* jump_to = nullptr;  // VirtualClock.__dict__["jump_to"]
    PyObject* now_name = nullptr;
    PyObject* jump_name = nullptr;
    PyObject* t_name = nullptr;
};

inline const Known& known() {
    static const Known k = [] {
        Known r;
        r.now_name = PyUnicode_InternFromString("now");
        r.jump_name = PyUnicode_InternFromString("jump_to");
        r.t_name = PyUnicode_InternFromString("_t");
        nb::object mod = nb::steal(PyImport_ImportModule("radixsched.clock"));
        if (!mod.is_valid()) throw nb::python_error();
        nb::object cls = mod.attr("VirtualClock");
        if (!PyType_Check(cls.ptr())) throw std::runtime_error("VirtualClock is not a class");
        r.type = reinterpret_cast<PyTypeObject*>(cls.release().ptr());
        r.now = _PyType_Lookup(r.type, r.now_name);  // borrowed from the held class
        r.jump_to = _PyType_Lookup(r.type, r.jump_name);
        if (r.now == nullptr || r.jump_to == nullptr)
            throw std::runtime_error("VirtualClock without now or jump_to");
        Py_INCREF(r.now);
        Py_INCREF(r.jump_to);
        return r;
    }();
    return k;
}

// Whether `clock`'s `method` (the interned name) is VirtualClock's own `fn` on exactly a
// VirtualClock.
inline bool plain(PyObject* clock, PyObject* name, PyObject* fn) {
    const Known& k = known();
    return Py_TYPE(clock) == k.type && _PyType_Lookup(k.type, name) == fn;
}

// clock.now()
inline nb::object now(nb::handle clock) {
    const Known& k = known();
    if (plain(clock.ptr(), k.now_name, k.now)) return py::get(clock, k.t_name);
    PyObject* v = PyObject_CallMethodNoArgs(clock.ptr(), k.now_name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

// clock.jump_to(t)
inline void jump_to(nb::handle clock, nb::handle t) {
    const Known& k = known();
    if (plain(clock.ptr(), k.jump_name, k.jump_to)) {
        const nb::object cur = py::get(clock, k.t_name);
        const int gt = PyObject_RichCompareBool(t.ptr(), cur.ptr(), Py_GT);
        if (gt < 0) throw nb::python_error();
        if (gt) py::set(clock, k.t_name, t);
        return;
    }
    PyObject* v = PyObject_CallMethodOneArg(clock.ptr(), k.jump_name, t.ptr());
    if (v == nullptr) throw nb::python_error();
    Py_DECREF(v);
}

// A bound `now` (what `clock.now` gave) called: the clock's `_t` where it is VirtualClock's own
// now bound to exactly a VirtualClock.
inline nb::object call_bound_now(nb::handle bound) {
    const Known& k = known();
    if (PyMethod_Check(bound.ptr()) && PyMethod_GET_FUNCTION(bound.ptr()) == k.now &&
        Py_TYPE(PyMethod_GET_SELF(bound.ptr())) == k.type)
        return py::get(nb::handle(PyMethod_GET_SELF(bound.ptr())), k.t_name);
    PyObject* v = PyObject_CallNoArgs(bound.ptr());
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

}  // namespace radixsched::vclock
