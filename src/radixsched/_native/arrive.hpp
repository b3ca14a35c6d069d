// The simulator's arrivals past the scheduler's plain door and into the fast queue
// (radixsched/native/arrive.py's `arrive`, native/queue.py's `add_many`), natively: see arrive.cpp.
#pragma once

namespace nanobind {
class module_;
}

namespace radixsched {

void bind_arrive(nanobind::module_& m);

}  // namespace radixsched
