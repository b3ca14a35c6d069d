// The Python ints of the simulator's stand-in tokens (decode.cpp's decode steps, prefill.cpp's
// first tokens): one object per token value below kTokenIntLimit, made the first time that
// value is asked for and kept for the process, shared by every request's output list (an int
// is immutable: a list holds a reference, not an object of its own); larger values are made
// anew. Called with the GIL held only.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

namespace radixsched {

inline constexpr uint64_t kTokenIntLimit = uint64_t(1) << 20;  // every vocabulary in practice

// A new reference to the Python int `v` (null with the Python error set when it cannot be made).
inline PyObject* token_int(uint64_t v) {
    if (v >= kTokenIntLimit) return PyLong_FromUnsignedLongLong(v);
    static std::vector<PyObject*> made;  // made[v]: the kept int of value v, or null
    if (v >= made.size()) made.resize(std::max<size_t>(size_t(v) + 1, 2 * made.size()), nullptr);
    PyObject*& slot = made[size_t(v)];
    if (slot == nullptr) {
        slot = PyLong_FromLong(long(v));
        if (slot == nullptr) return nullptr;
    }
    Py_INCREF(slot);
    return slot;
}

}  // namespace radixsched
