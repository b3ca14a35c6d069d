// The Python side of the simulator's stand-in tokens (stepcost.hpp's stand_in), shared by the
// native decode (decode.cpp) and prefill (prefill.cpp) steps: a request's rid hash read from
// the runner's memo.
#pragma once

#include <Python.h>

namespace radixsched {

// `memo[rid]` (a new reference, null with the Python error set on failure) for the runner's
// rid -> hash memo (a dict subclass whose __missing__ fills it): the dict's own entry where it
// has one and the type's `__getitem__` is dict's (a subclass's subscript goes through a Python
// method call, about as costly as the lookup), else the subscript itself.
inline PyObject* memo_item(PyObject* memo, PyObject* rid) {
    if (PyDict_Check(memo)) {
        static PyObject* const getitem = PyUnicode_InternFromString("__getitem__");
        static PyObject* const dict_getitem =  // dict's own descriptor (the type holds it)
            getitem ? _PyType_Lookup(&PyDict_Type, getitem) : nullptr;
        if (getitem == nullptr) return nullptr;  // (its error set)
        if (PyDict_CheckExact(memo) ||
            (dict_getitem != nullptr && _PyType_Lookup(Py_TYPE(memo), getitem) == dict_getitem)) {
            PyObject* got = PyDict_GetItemWithError(memo, rid);  // borrowed
            if (got != nullptr) return Py_NewRef(got);
            if (PyErr_Occurred()) return nullptr;
        }
    }
    return PyObject_GetItem(memo, rid);
}

}  // namespace radixsched
