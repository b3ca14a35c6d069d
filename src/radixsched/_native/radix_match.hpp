// The radix tree's hot match calls for Python (Tree.match_prefix / Tree.walk_node): tokens are
// read in place (a plain int32 array through numpy's C API, any other buffer through the buffer
// protocol) and the matched slots are copied into one new numpy array (made through numpy's C
// API) as the walk compares tokens, so that a match costs one native call and no intermediate
// copies.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <utility>

#include "radix.hpp"

namespace radixsched {

// Tokens read in place: an int32, 1-d, contiguous numpy array's data (the input's: valid while
// the caller holds it), or a held buffer over an int32, 1-d, C-contiguous array (the input
// itself, or its copy as numpy.ascontiguousarray(obj, dtype=int32) makes it; the buffer holds
// its array).
class TokenView {
public:
    explicit TokenView(nanobind::handle obj);
    ~TokenView() { PyBuffer_Release(&view_); }
    TokenView(const TokenView&) = delete;
    TokenView& operator=(const TokenView&) = delete;

    const int32_t* data() const { return data_; }
    int64_t size() const { return size_; }

private:
    bool take(nanobind::handle obj);

    Py_buffer view_{};  // obj == nullptr while nothing is held (PyBuffer_Release ignores it)
    nanobind::object copy_;
    const int32_t* data_ = nullptr;
    int64_t size_ = 0;
};

// numpy.empty(n, numpy.int64), made through numpy's C API: the array and its writable data
// (valid while the array lives).
std::pair<nanobind::object, int64_t*> new_slots(int64_t n);

// A node's slots (Node::value, int32 in the tree) as an int64 numpy array that owns a copy of
// them: the binding's `Node.value` (module.cpp's to_numpy(n.value) finds this overload by
// argument-dependent lookup).
nanobind::ndarray<nanobind::numpy, int64_t, nanobind::ndim<1>> to_numpy(const SlotVec& v);

// Tree::walk over `tokens` (any 1-d sequence of ints; int32 C-contiguous arrays are read in
// place, anything else is converted as numpy.ascontiguousarray(tokens, dtype=int32) would):
// (slots: int64 array, matched length, last node, 0) as an instance of `result`, a tuple type
// (MatchResult: its fields in order), made as tuple.__new__(result, fields) makes it.
nanobind::object match_prefix(Tree& tree, nanobind::handle tokens, int32_t ns,
                              nanobind::handle result);

// Where NativeRadixCache.match_prefix's result comes from: its tuple type (MatchResult), the
// empty slot array of a match that never walks, and the namespace -> id function.
void set_match_types(nanobind::handle result, nanobind::handle empty_slots,
                     nanobind::handle namespace_id);

// NativeRadixCache.match_prefix(key) in one native call: `key` is a (tokens, namespace) tuple
// (CacheKey). A disabled tree or an empty key: (empty slots, 0, root, 0), no clock tick; else
// match_prefix(tree, tokens, namespace_id(namespace) (0 for None), result type).
nanobind::object match_key(Tree& tree, nanobind::handle key);

// NativeRadixCache.touch_prefix of each key of `keys` (an iterable of CacheKeys), in order, in
// one native call: nothing on a disabled tree; an empty key skipped; else the walk of
// walk_node (its clock tick, touches and splits) in the key's namespace.
void touch_keys(Tree& tree, nanobind::handle keys);

// The same walk (same clock tick, same touches and splits) without the slots: (node, length).
nanobind::object walk_node(Tree& tree, nanobind::handle tokens, int32_t ns);

}  // namespace radixsched
