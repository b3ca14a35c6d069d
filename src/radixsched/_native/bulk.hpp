// A run's requests made and read in bulk outside the event loop, in one native pass each:
//
// - clone_like(like, columns, fresh_lists): copies of `like`, an instance of a __slots__
//   class (object its only base, every member an object slot, no __dict__, no weak
//   references; else None), each slot the same object as like's but the columns' (`columns`:
//   slot name -> a list, the i-th copy takes each list's i-th item) and `fresh_lists` (slot
//   names: a new empty list each). sim/workloads/load.py makes a deferred trace's requests
//   with it (a copy is a tenth of the constructor's cost), from a request its constructor
//   made, after checking which slots the constructor fills per request.
// - copy_slots(like, objs, names): copies of `like` (as clone_like takes it), one an object
//   of `objs` (each of like's type exactly; else None), each with its object's `names` slots
//   (sim/workloads/deferred.py's build_copies: the drafts a batch is built from ahead).
// - pack_times(seqs, proto): each list of Python floats as an array('d') of the same floats
//   (sim/workloads/deferred.py's packed_times: a finished request's token times, 8 bytes a
//   token), each array made as `proto * len(seq)` (proto: array('d', [0.0])) and written
//   through its buffer; None, and nothing kept, where a sequence is not exactly a list or an
//   item not exactly a float (the caller converts them as `array('d', seq)` does).
// - compact_requests(reqs, shared, make, proto): sim/workloads/deferred.py's compact in one
//   pass, request by request: its token times as pack_times packs a list of floats (any other
//   sequence as array('d', seq) makes it: proto's type called), its prompt_ids and output_ids
//   each the stand-in `shared` holds for its length, made by make(length) where absent.
// - request_columns(reqs, abort, ...): results/reqarrays.py's RequestArrays.of, its columns
//   read in one pass over the requests (the same values, bit for bit: a float is its double, an
//   int its int64, a missing time NaN with its mask False); False, with the columns partly
//   written and nothing appended, where a time is not exactly a float or None, or a counter not
//   exactly an int in int64's range (the caller reads them as numpy converts them).
// - join_gaps(seqs, first, last, out): the gaps between consecutive times within each of
//   seqs[first:last] (lists of floats, or float64 buffers: array('d')), end to end into `out`
//   (results/requests.py's token_gaps, results/gapstats.py's batches: later - earlier, the
//   double subtraction numpy does); False where a sequence is neither, or shorter than two, or
//   the gaps do not fill `out`.
// - count_buckets(gaps, counts, shift), keep_buckets(gaps, keep, shift, out): the streamed
//   gap stats' passes over a batch (results/gapstats.py): each gap's bucket is its float64
//   bits as int64 shifted right by `shift`; the first adds one to counts[bucket] for each (False
//   where a bucket is negative or past counts), the second writes the gaps whose bucket `keep`
//   marks, in order, into `out` and returns their number.
#pragma once

namespace nanobind {
class module_;
}

namespace radixsched {

void bind_bulk(nanobind::module_& m);

}  // namespace radixsched
