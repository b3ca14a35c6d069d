// The radix tree's hot match calls for Python (Tree.match_prefix / Tree.walk_node): tokens are
// read through the buffer protocol and the matched slots are copied into one new numpy array
// as the walk compares tokens, so that a match costs one native call and no intermediate copies.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "radix.hpp"

namespace radixsched {

// Tree::walk over `tokens` (any 1-d sequence of ints; int32 C-contiguous arrays are read in
// place, anything else is converted as numpy.ascontiguousarray(tokens, dtype=int32) would):
// (slots: int64 array, matched length, last node, 0) as an instance of `result`, a tuple type
// (MatchResult: its fields in order), made as tuple.__new__(result, fields) makes it.
nanobind::object match_prefix(Tree& tree, nanobind::handle tokens, int32_t ns,
                              nanobind::handle result);

// The same walk (same clock tick, same touches and splits) without the slots: (node, length).
nanobind::object walk_node(Tree& tree, nanobind::handle tokens, int32_t ns);

}  // namespace radixsched
