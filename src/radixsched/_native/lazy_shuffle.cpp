// `random_order` (policies.py) natively, bit for bit: an iterator over the round's positions
// that, like the reference generator, reads the list's length at its first read and then, for
// each position i it hands out, draws j = i + rng.randrange(n - i) (no draw for the last
// position) and swaps list items i and j unless j == i. Only the positions read are drawn:
// admission may stop early, and the generator's state then ends where Python's would.
//
// The draws are `randrange(b)` = `_randbelow(b)` (mt19937.hpp) made on the `random.Random`
// object itself: `_random.Random`'s C struct (CPython 3.11, Modules/_randommodule.c:
// `PyObject_HEAD; int index; uint32_t state[624];`) is read and written in place, so no state
// moves between Python and here and anything may draw from the generator between two reads.
// That layout is checked once per process before any use (`random_layout_ok`): the type's
// size, and a generator's getstate() and next draw against the struct. Only an exact
// `random.Random` is taken (a subclass may draw otherwise: the caller runs the reference).
#include "lazy_shuffle.hpp"

#include "mt19937.hpp"

#include <nanobind/nanobind.h>

#include <cstdint>
#include <stdexcept>

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

// _random.Random's instance (its C struct in CPython 3.11).
struct RandomObject {
    PyObject_HEAD
    int index;  // of the next word to temper, in [0, 624]
    uint32_t state[mt::kWords];
};

bool same_state(nb::handle gen, const RandomObject& r) {
    nb::tuple st = nb::cast<nb::tuple>(gen.attr("getstate")());
    if (nb::len(st) != mt::kWords + 1) return false;
    for (size_t i = 0; i < mt::kWords; ++i)
        if (nb::cast<uint32_t>(st[i]) != r.state[i]) return false;
    return nb::cast<int64_t>(st[mt::kWords]) == r.index;
}

// Whether `_random.Random` instances are RandomObjects: the type's size, then a generator
// part-way through its block read through the struct as getstate() lists it, and a draw made
// through the struct equal to getrandbits(32) on a copy, both states equal after it.
bool check_layout() {
    nb::object type = nb::module_::import_("_random").attr("Random");
    const auto* t = reinterpret_cast<PyTypeObject*>(type.ptr());
    if (!PyType_Check(type.ptr()) || t->tp_basicsize != sizeof(RandomObject)) return false;
    nb::object gen = type(20261207), copy = type();
    for (int k = 0; k < 700; ++k) gen.attr("getrandbits")(32);  // regenerated once, index 76
    auto* r = reinterpret_cast<RandomObject*>(gen.ptr());
    if (!same_state(gen, *r)) return false;
    copy.attr("setstate")(gen.attr("getstate")());
    const uint32_t ours = mt::next(r->state, r->index);
    if (nb::cast<uint32_t>(copy.attr("getrandbits")(32)) != ours) return false;
    return same_state(copy, *r);
}

// random.Random (a subclass of _random.Random adding no C fields), once _random.Random's
// layout is checked; else null.
PyTypeObject* random_type() {
    static PyTypeObject* const type = [] {
        if (!check_layout()) return static_cast<PyTypeObject*>(nullptr);
        nb::object t = nb::module_::import_("random").attr("Random");
        nb::object base = nb::module_::import_("_random").attr("Random");
        if (!PyType_Check(t.ptr()) || !PyType_Check(base.ptr()) ||
            !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t.ptr()),
                              reinterpret_cast<PyTypeObject*>(base.ptr())))
            return static_cast<PyTypeObject*>(nullptr);
        return reinterpret_cast<PyTypeObject*>(t.release().ptr());  // kept for the process
    }();
    return type;
}

class LazyShuffle {
public:
    LazyShuffle(nb::list queue, nb::object rng) : queue_(std::move(queue)), rng_(std::move(rng)) {
        PyTypeObject* type = random_type();
        if (type == nullptr)
            throw std::runtime_error("LazyShuffle: _random.Random's layout is not CPython 3.11's");
        if (Py_TYPE(rng_.ptr()) != type)  // exactly: a subclass may draw otherwise
            throw nb::type_error("LazyShuffle: the generator must be exactly a random.Random");
    }

    int64_t next() {
        if (done()) throw nb::stop_iteration();  // (the first call: the generator starts)
        const int64_t i = i_++;
        if (i < n_ - 1) swap_with_pick(i);
        return i;
    }

    // RoundOrder.head(k) (radixsched/queue.py) of the order over `queue` whose remembered
    // positions are `seen` and whose iterator is this one, step for step: for i < k, position
    // i (read and appended to `seen` when not remembered; none past the order's end: the head
    // ends), then queue's item there (IndexError past the list's end).
    nb::list head(nb::handle queue, nb::list seen, int64_t k) {
        PyObject* got = seen.ptr();
        nb::list out;
        for (int64_t i = 0; i < k; ++i) {
            if (PyList_GET_SIZE(got) <= i) {
                if (done()) break;
                nb::object pos = nb::int_(next());
                if (PyList_Append(got, pos.ptr()) != 0) throw nb::python_error();
            }
            nb::object item = nb::steal(PyObject_GetItem(queue.ptr(), PyList_GET_ITEM(got, i)));
            if (!item.is_valid()) throw nb::python_error();
            out.append(item);
        }
        return out;
    }

private:
    bool done() {
        if (n_ < 0) n_ = PyList_GET_SIZE(queue_.ptr());
        return i_ >= n_;
    }

    // j = i + randrange(n - i), then queue[i], queue[j] = queue[j], queue[i] unless j == i.
    void swap_with_pick(int64_t i) {
        const int64_t bound = n_ - i;
        if (bound >= (int64_t{1} << 32)) {
            i_ = n_;  // (an exception ends a generator)
            throw std::overflow_error("LazyShuffle: 2^32 requests or more");
        }
        auto* r = reinterpret_cast<RandomObject*>(rng_.ptr());
        if (r->index < 0 || r->index > static_cast<int>(mt::kWords))
            throw std::logic_error("LazyShuffle: the generator's index is past its block");
        const int64_t j = i + mt::below(r->state, r->index, static_cast<uint32_t>(bound));
        if (j == i) return;
        PyObject* list = queue_.ptr();
        if (j >= PyList_GET_SIZE(list)) {  // the list shrank since the first read
            i_ = n_;
            throw nb::index_error("list index out of range");
        }
        PyObject* a = PyList_GET_ITEM(list, i);
        PyList_SET_ITEM(list, i, PyList_GET_ITEM(list, j));  // a swap: no reference changes
        PyList_SET_ITEM(list, j, a);
    }

    nb::list queue_;
    nb::object rng_;
    int64_t n_ = -1;  // the list's length at the first read (-1: not read yet)
    int64_t i_ = 0;   // the next position
};

// random.Random.shuffle(queue) (Lib/random.py: for i = n-1 down to 1, j = _randbelow(i + 1),
// then queue[i] and queue[j] swap), SGLang compat's random round, drawing on `rng`'s own state
// in place as LazyShuffle does (shuffle.cpp's `shuffle` moves the state through getstate()
// instead: 625 ints each way a round).
void shuffle_in_place(nb::list queue, nb::handle rng) {
    PyTypeObject* type = random_type();
    if (type == nullptr)
        throw std::runtime_error("shuffle_in_place: _random.Random's layout is not CPython 3.11's");
    if (Py_TYPE(rng.ptr()) != type)  // exactly: a subclass may draw otherwise
        throw nb::type_error("shuffle_in_place: the generator must be exactly a random.Random");
    PyObject* list = queue.ptr();
    const Py_ssize_t n = PyList_GET_SIZE(list);
    if (n > (Py_ssize_t{1} << 32)) throw std::overflow_error("shuffle_in_place: 2^32 items or more");
    auto* r = reinterpret_cast<RandomObject*>(rng.ptr());
    if (r->index < 0 || r->index > static_cast<int>(mt::kWords))
        throw std::logic_error("shuffle_in_place: the generator's index is past its block");
    for (Py_ssize_t i = n; i-- > 1;) {
        const auto j =
            static_cast<Py_ssize_t>(mt::below(r->state, r->index, static_cast<uint32_t>(i + 1)));
        PyObject* a = PyList_GET_ITEM(list, i);
        PyList_SET_ITEM(list, i, PyList_GET_ITEM(list, j));  // a swap: no reference changes
        PyList_SET_ITEM(list, j, a);
    }
}

}  // namespace

void bind_lazy_shuffle(nb::module_& m) {
    m.def("random_layout_ok", [] { return random_type() != nullptr; },
          "whether _random.Random's C struct is CPython 3.11's (LazyShuffle's draws need it)");
    nb::class_<LazyShuffle>(m, "LazyShuffle")
        .def(nb::init<nb::list, nb::object>(), "queue"_a, "rng"_a)
        .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
        .def("__next__", &LazyShuffle::next)
        .def("head", &LazyShuffle::head, "queue"_a, "seen"_a, "k"_a);
    m.def("shuffle_in_place", &shuffle_in_place, "queue"_a, "rng"_a,
          "random.Random.shuffle(queue) drawing on rng's own state (exactly a random.Random)");
}

}  // namespace radixsched
