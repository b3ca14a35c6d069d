// A prefill step run natively (radixsched.native.scheduler's NativeScheduler.run): the step's time
// on the dense roofline (_core.PrefillCost: CostModel._dense_step_s over the extends' sums,
// sim/cost/roofline.py) and, in one call, what the reference Scheduler.run does with an
// extend-only batch (_core.PrefillRun: the statistics, the clock, each producing request's
// stand-in token and its checkpoint). Where the reference needs Python the call answers None
// before it changes anything, and the reference runs instead.
#pragma once

namespace nanobind {
class module_;
}

// The Python bindings (prefill.cpp): _core.PrefillCost and _core.PrefillRun.
void bind_prefill(nanobind::module_& m);
