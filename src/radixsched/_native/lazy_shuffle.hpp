// The plain random policy's order (policies.py's `random_order`) natively: the same lazy
// front-to-back Fisher-Yates on the waiting list, drawing from the Python generator's own
// state in place (lazy_shuffle.cpp).
#pragma once

namespace nanobind {
class module_;
}

namespace radixsched {

void bind_lazy_shuffle(nanobind::module_& m);

}  // namespace radixsched
