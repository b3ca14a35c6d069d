// The simulator's open loop between two arrivals (radixsched/sim/deploy/open_loop.py's
// _run_lean, its inner loop), natively: see loop.cpp.
#pragma once

namespace nanobind {
class module_;
}

namespace radixsched {

void bind_loop(nanobind::module_& m);

}  // namespace radixsched
