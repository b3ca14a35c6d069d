// The Python face of the native dedup (dedup.hpp), bound on the native tree's class beside its
// matcher (module.cpp): the representative inputs come with each track, and a round's verdict
// is one call (native/matching.py).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "dedup.hpp"

namespace radixsched {

namespace nb = nanobind;

// rid's code points in UTF-8; lone surrogates pass too (bytewise order stays code point order).
inline RepInputs rep_inputs(double entry, double arrival, nb::handle rid) {
    RepInputs rep{entry, arrival, {}};
    if (rid.is_none()) return rep;
    if (!PyUnicode_Check(rid.ptr())) throw nb::type_error("a request id must be a str");
    Py_ssize_t size = 0;
    if (const char* s = PyUnicode_AsUTF8AndSize(rid.ptr(), &size)) {
        rep.rid.assign(s, static_cast<size_t>(size));
        return rep;
    }
    PyErr_Clear();
    nb::object raw = nb::steal(PyUnicode_AsEncodedString(rid.ptr(), "utf-8", "surrogatepass"));
    if (!raw.is_valid()) throw nb::python_error();
    rep.rid.assign(PyBytes_AS_STRING(raw.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(raw.ptr())));
    return rep;
}

inline nb::object str_of(const std::string& rid) {
    nb::object s = nb::steal(
        PyUnicode_DecodeUTF8(rid.data(), static_cast<Py_ssize_t>(rid.size()), "surrogatepass"));
    if (!s.is_valid()) throw nb::python_error();
    return s;
}

// On the tree class T (whose the_matcher() is its matcher): dedup_on(check, width) and
// dedup_round(afresh) -> (rids that left the deferred set, rids that entered it, flipped keys).
template <class T>
void bind_dedup(nb::class_<T>& c) {
    c.def("dedup_on",
          [](T& t, int64_t check, int64_t width) { t.the_matcher().dedup_on(check, width); })
        .def("dedup_round", [](T& t, bool afresh) {
            DedupOutcome got = t.the_matcher().dedup().decide(afresh);
            nb::list left, entered;
            for (const std::string& rid : got.left) left.append(str_of(rid));
            for (const std::string* rid : got.entered) entered.append(str_of(*rid));
            return nb::make_tuple(left, entered, nb::cast(got.flipped));
        });
}

}  // namespace radixsched
