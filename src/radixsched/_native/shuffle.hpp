// SGLang compat's random policy shuffles the whole waiting list every round with Python's
// `random.Random.shuffle`; here the same shuffle runs natively on the same generator state.
#pragma once

namespace nanobind {
class module_;
}

namespace radixsched {

void bind_shuffle(nanobind::module_& m);

}  // namespace radixsched
