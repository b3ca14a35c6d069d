// A run's finished requests read outside the event loop, in one native pass each:
//
// - pack_times(seqs, proto): each list of Python floats as an array('d') of the same floats
//   (sim/workloads/deferred.py's packed_times: a finished request's token times, 8 bytes a
//   token), each array made as `proto * len(seq)` (proto: array('d', [0.0])) and written
//   through its buffer; None, and nothing kept, where a sequence is not exactly a list or an
//   item not exactly a float (the caller converts them as `array('d', seq)` does).
// - request_columns(reqs, abort, ...): results/reqarrays.py's RequestArrays.of, its columns
//   read in one pass over the requests (the same values, bit for bit: a float is its double, an
//   int its int64, a missing time NaN with its mask False); False, with the columns partly
//   written and nothing appended, where a time is not exactly a float or None, or a counter not
//   exactly an int in int64's range (the caller reads them as numpy converts them).
#pragma once

namespace nanobind {
class module_;
}

namespace radixsched {

void bind_finished(nanobind::module_& m);

}  // namespace radixsched
