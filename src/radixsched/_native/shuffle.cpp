// `random.Random.shuffle` (CPython 3.11, Lib/random.py) on a Python list, from and back to the
// generator state `Random.getstate()` holds, bit for bit:
//
// - the shuffle: for i = n-1 down to 1, j = _randbelow(i + 1), then x[i] and x[j] swap;
// - _randbelow(b) (`_randbelow_with_getrandbits`): k = b.bit_length(), then r = getrandbits(k)
//   until r < b; getrandbits(k) for 0 < k <= 32 is the generator's next 32-bit output shifted
//   right by 32 - k (Modules/_randommodule.c);
// - the generator is MT19937 (Matsumoto and Nishimura's recurrence and tempering, CPython's
//   genrand_uint32); its state is getstate()'s 625 ints, the 624 words then the index of the
//   next word to temper (624: the block is spent, the next draw regenerates it). std::mt19937
//   is the same generator, but its state moves only as text, which costs more than the
//   shuffle of a 1,000-request queue.
#include "shuffle.hpp"

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
    static constexpr size_t kWords = 624;
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

    uint32_t next() {
        if (index_ >= kWords) regenerate();
        uint32_t y = mt_[index_++];
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c5680U;
        y ^= (y << 15) & 0xefc60000U;
        return y ^ (y >> 18);
    }

private:
    static constexpr size_t kShift = 397;
    static uint32_t twist(uint32_t hi, uint32_t lo, uint32_t far) {
        const uint32_t y = (hi & 0x80000000U) | (lo & 0x7fffffffU);
        return far ^ (y >> 1) ^ ((y & 1U) != 0 ? 0x9908b0dfU : 0U);
    }
    void regenerate() {
        for (size_t k = 0; k < kWords; ++k)
            mt_[k] = twist(mt_[k], mt_[(k + 1) % kWords], mt_[(k + kShift) % kWords]);
        index_ = 0;
    }

    std::array<uint32_t, kWords> mt_{};
    size_t index_ = kWords;
};

// _randbelow(bound), bound in [2, 2^32].
uint64_t below(Mt19937& gen, uint64_t bound) {
    const int k = 64 - __builtin_clzll(bound);  // int.bit_length(), bound > 0
    uint64_t r = 0;
    do {
        r = static_cast<uint64_t>(gen.next()) >> (32 - k);
    } while (r >= bound);
    return r;
}

nb::tuple shuffle(nb::list items, const nb::tuple& state) {
    const size_t n = nb::len(items);
    if (n > (uint64_t{1} << 32)) throw std::invalid_argument("shuffle: more than 2^32 items");
    Mt19937 gen(state);
    PyObject* list = items.ptr();
    for (size_t i = n; i-- > 1;) {  // i = n-1 down to 1
        const uint64_t pick = below(gen, i + 1);
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
