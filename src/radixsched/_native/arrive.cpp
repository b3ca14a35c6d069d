// See arrive.hpp. Two loops of the arrivals' Python, request by request, with the same reads,
// tests and writes in the same order: `door_pass` (native/arrive.py's `arrive`: the plain door,
// which accepts a request without touching it, and the accepted request's stamps) and
// `queue_pass` (native/queue.py's `add_many` after the matching: arrival numbers, the door's
// match, the entry-order test). Whatever the door must decide goes back to Python.
#include "arrive.hpp"

#include <nanobind/nanobind.h>

#include <cstdint>

#include "py_attr.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

using py::get;
using py::len_of;
using py::set;

struct Names {
    PyObject *arrival_time, *rid, *priority, *sampling, *max_new_tokens, *prompt_ids,
        *output_ids, *queue_entry_time, *times, *arrival, *queue_entry_processed_tokens,
        *num_matched_prefix_tokens;
};

const Names& names() {  // interned once, never released
    static const Names n = [] {
        auto i = [](const char* s) { return PyUnicode_InternFromString(s); };
        return Names{i("arrival_time"),     i("rid"),
                     i("priority"),         i("sampling"),
                     i("max_new_tokens"),   i("prompt_ids"),
                     i("output_ids"),       i("queue_entry_time"),
                     i("times"),            i("arrival"),
                     i("queue_entry_processed_tokens"), i("num_matched_prefix_tokens")};
    }();
    return n;
}

void check(int rc) {
    if (rc < 0) throw nb::python_error();
}

// An int that fits int64 (false: too big or small, or not an int: Python decides).
bool as_int64(nb::handle v, int64_t& out) {
    if (!PyLong_CheckExact(v.ptr())) return false;
    int overflow = 0;
    out = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (out == -1 && PyErr_Occurred()) throw nb::python_error();
    return overflow == 0;
}

// The plain door's verdict without a decision (`arrive`'s test, negated): a new rid, no
// priority, at least one token to generate and a prompt of n tokens that fits with room for
// all of them: max_new <= min(longest - n - 1, capacity - ceil_page(n) - page - 1).
bool passes(nb::handle r, nb::handle rid, nb::handle by_rid, int64_t page, int64_t capacity,
            int64_t longest) {
    const Names& n = names();
    const int has = PyDict_CheckExact(by_rid.ptr()) ? PyDict_Contains(by_rid.ptr(), rid.ptr())
                                                    : PySequence_Contains(by_rid.ptr(), rid.ptr());
    check(has);
    if (has || !get(r, n.priority).is_none()) return false;
    int64_t max_new = 0;
    if (!as_int64(get(get(r, n.sampling), n.max_new_tokens), max_new)) return false;
    const int64_t fill = len_of(get(r, n.prompt_ids)) + len_of(get(r, n.output_ids));
    if (max_new < 1 || fill >= longest) return false;
    const int64_t pages = (fill + page - 1) / page * page;  // -(-fill // page) * page
    const int64_t room_a = longest - fill - 1, room_b = capacity - pages - page - 1;
    return max_new <= (room_a < room_b ? room_a : room_b);
}

// `arrive`'s loop over reqs[start:] while each request passes the plain door: its priority set
// to `default_priority` where `prio`, its stamps (queue_entry_time, arrival_time and
// times.arrival: its arrival time, assigned in that order; queue_entry_processed_tokens:
// `processed`), `by_rid[rid] = r`, `accepted.append(r)`. Returns the index of the first
// request the door must decide (len(reqs): none).
Py_ssize_t door_pass(nb::handle reqs, Py_ssize_t start, nb::handle accepted, nb::handle by_rid,
                     nb::handle processed, int64_t page, int64_t capacity, int64_t longest,
                     bool prio, nb::handle default_priority) {
    const Names& n = names();
    if (page < 1) return start;  // (a page is at least one token: Python decides otherwise)
    nb::object seq = nb::steal(PySequence_Fast(reqs.ptr(), "arrivals: a sequence"));
    if (!seq.is_valid()) throw nb::python_error();
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(seq.ptr());
    for (Py_ssize_t i = start; i < size; ++i) {
        nb::handle r = PySequence_Fast_GET_ITEM(seq.ptr(), i);
        nb::object t = get(r, n.arrival_time);
        nb::object rid = get(r, n.rid);
        if (!passes(r, rid, by_rid, page, capacity, longest)) return i;
        if (prio) set(r, n.priority, default_priority);
        set(r, n.queue_entry_time, t);
        set(r, n.arrival_time, t);
        set(get(r, n.times), n.arrival, t);
        set(r, n.queue_entry_processed_tokens, processed);
        check(PyObject_SetItem(by_rid.ptr(), rid.ptr(), r.ptr()));
        check(PyList_Append(accepted.ptr(), r.ptr()));
    }
    return size;
}

// `add_many`'s pass after the matching, over reqs and their matched lengths `lens`: each
// request's arrival number (`seq_of[id(r)] = seq`, seq counting up), the door's match (the
// length cut to the whole pages of fill_len - 1, at least 0) as num_matched_prefix_tokens, and
// the entry-order test as the queue grows from `size` requests one at a time (`ordered`, the
// last entry `last`: (queue_entry_time, arrival_time)). Returns (seq, ordered, last).
nb::tuple queue_pass(nb::list reqs, nb::list lens, nb::dict seq_of, nb::object seq, int64_t page,
                     Py_ssize_t size, bool ordered, nb::object last) {
    const Names& n = names();
    if (page < 1) throw nb::value_error("queue_pass: page must be >= 1");
    const Py_ssize_t count = PyList_GET_SIZE(reqs.ptr());
    if (PyList_GET_SIZE(lens.ptr()) < count) throw nb::index_error("queue_pass: a length each");
    nb::object one = nb::int_(1);
    for (Py_ssize_t i = 0; i < count; ++i) {
        nb::handle r = PyList_GET_ITEM(reqs.ptr(), i);
        nb::handle matched = PyList_GET_ITEM(lens.ptr(), i);
        nb::object key = nb::steal(PyLong_FromVoidPtr(r.ptr()));  // id(r)
        if (!key.is_valid()) throw nb::python_error();
        check(PyDict_SetItem(seq_of.ptr(), key.ptr(), seq.ptr()));
        seq = nb::steal(PyNumber_Add(seq.ptr(), one.ptr()));
        if (!seq.is_valid()) throw nb::python_error();
        int64_t cap = len_of(get(r, n.prompt_ids)) + len_of(get(r, n.output_ids)) - 1;
        cap = (cap > 0 ? cap : 0) / page * page;
        nb::object cap_obj = nb::int_(cap);
        const int below = PyObject_RichCompareBool(matched.ptr(), cap_obj.ptr(), Py_LT);
        check(below);
        set(r, n.num_matched_prefix_tokens, below ? matched : cap_obj);
        ++size;
        nb::object entry = nb::make_tuple(get(r, n.queue_entry_time), get(r, n.arrival_time));
        if (size == 1) {
            ordered = true;
        } else if (ordered) {
            const int ge = PyObject_RichCompareBool(entry.ptr(), last.ptr(), Py_GE);
            check(ge);
            ordered = ge != 0;
        }
        last = std::move(entry);
    }
    return nb::make_tuple(seq, ordered, last);
}

}  // namespace

void bind_arrive(nb::module_& m) {
    m.def("door_pass", &door_pass, "reqs"_a, "start"_a, "accepted"_a, "by_rid"_a, "processed"_a,
          "page"_a, "capacity"_a, "longest"_a, "prio"_a, "default_priority"_a.none());
    m.def("queue_pass", &queue_pass, "reqs"_a, "lens"_a, "seq_of"_a, "seq"_a, "page"_a, "size"_a,
          "ordered"_a, "last"_a.none());
}

}  // namespace radixsched
