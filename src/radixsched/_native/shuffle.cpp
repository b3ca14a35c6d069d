// `random.Random.shuffle` (CPython 3.11, Lib/random.py) on a Python list, from and back to the
// generator state `Random.getstate()` holds, bit for bit:
//
// - the shuffle: for i = n-1 down to 1, j = _randbelow(i + 1), then x[i] and x[j] swap;
// - _randbelow and the generator: CPython's, in mt19937.hpp; the generator state is getstate()'s
//   625 ints, the 624 words then the index of the next word to temper. std::mt19937 is the same
//   generator, but its state moves only as text, which costs more than the shuffle of a
//   1,000-request queue.
#include "shuffle.hpp"

#include "mt19937.hpp"

#include <nanobind/nanobind.h>

#include <array>
#include <cstdint>
#include <stdexcept>

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

// MT19937 over CPython's state layout.
class Mt19937 {
public:
    static constexpr size_t kWords = mt::kWords;
    static constexpr size_t kStateInts = kWords + 1;  // the words, then the index

    explicit Mt19937(const nb::tuple& state) {
        if (nb::len(state) != kStateInts)
            throw std::invalid_argument("shuffle: the state must be Random.getstate()[1]");
        for (size_t i = 0; i < kWords; ++i) mt_[i] = nb::cast<uint32_t>(state[i]);
        index_ = nb::cast<size_t>(state[kWords]);
        if (index_ > kWords) throw std::invalid_argument("shuffle: state index past 624");
    }

    nb::tuple state() const {
        PyObject* t = PyTuple_New(kStateInts);
        if (t == nullptr) throw nb::python_error();
        nb::tuple out = nb::steal<nb::tuple>(t);
        for (size_t i = 0; i < kWords; ++i)
            PyTuple_SET_ITEM(t, i, PyLong_FromUnsignedLong(mt_[i]));
        PyTuple_SET_ITEM(t, kWords, PyLong_FromSize_t(index_));
        for (size_t i = 0; i < kStateInts; ++i)
            if (PyTuple_GET_ITEM(t, i) == nullptr) throw nb::python_error();
        return out;
    }

    uint32_t below(uint32_t bound) { return mt::below(mt_.data(), index_, bound); }

private:
    std::array<uint32_t, kWords> mt_{};
    size_t index_ = kWords;
};

nb::tuple shuffle(nb::list items, const nb::tuple& state) {
    const size_t n = nb::len(items);
    if (n >= (uint64_t{1} << 32)) throw std::invalid_argument("shuffle: 2^32 items or more");
    Mt19937 gen(state);
    PyObject* list = items.ptr();
    for (size_t i = n; i-- > 1;) {  // i = n-1 down to 1
        const uint32_t pick = gen.below(static_cast<uint32_t>(i + 1));
        if (pick > i) throw std::logic_error("shuffle: a draw past its bound");  // never
        const auto j = static_cast<Py_ssize_t>(pick);
        PyObject* a = PyList_GET_ITEM(list, i);
        PyList_SET_ITEM(list, i, PyList_GET_ITEM(list, j));  // a swap: no reference changes
        PyList_SET_ITEM(list, j, a);
    }
    return gen.state();
}

}  // namespace

void bind_shuffle(nb::module_& m) {
    m.def("shuffle", &shuffle, "items"_a, "state"_a,
          "random.Random.shuffle(items) on the generator state `state` (getstate()[1]); "
          "returns the state after it (shuffle.cpp)");
}

}  // namespace radixsched
