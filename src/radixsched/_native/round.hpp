// The waiting queue's round in one native call (native/queue.py's begin_round, its common case):
// the matcher's refresh, the matched lengths, the in-batch dedup's verdict and, for lpm's kept
// order in sync with the list, the order's advance. Everything else (another engine, an order
// out of sync, a re-key worth a rebuild) is left to the Python round, which then finds the
// queue's state exactly as its own sync and dedup would have left it.
#pragma once

#include <nanobind/nanobind.h>

#include "adder.hpp"  // TreeOf

namespace radixsched {

// On the tree class: queue_round(...) and dedup_verdict(...) (round.cpp documents them).
void bind_round(nanobind::module_& m, TreeOf tree_of);

// _core.queue_take (round.cpp documents it): NativeWaitingQueue.take in one call.
nanobind::list queue_take(nanobind::list queue, nanobind::handle positions,
                          nanobind::handle tree, nanobind::handle fills,
                          nanobind::handle reqs_of, nanobind::dict moved, nanobind::dict tried,
                          nanobind::list added, nanobind::handle order,
                          nanobind::handle remove);

}  // namespace radixsched
