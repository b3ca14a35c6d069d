// See prefill.hpp. Each piece names the reference it follows (radixsched/scheduler.py's run,
// account, _count_tokens, _emit; sim/cost/runner.py's forward), in the reference's order: the
// floats are the same because the operations and their order are.
#include "prefill.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "adder.hpp"
#include "chunks.hpp"
#include "kv.hpp"
#include "pool.hpp"
#include "py_attr.hpp"
#include "round.hpp"
#include "stand_in_py.hpp"
#include "stepcost.hpp"
#include "vclock.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

using py::get;
using py::get_int;
using py::len_of;
using py::set;
using py::set_int;

// Interned names, created once and never released (no Python object is touched at exit).
struct Names {
    PyObject *req, *prefix_len, *new_token_ids, *produces_token, *host_load_len, *sampling,
        *stop_token_ids, *scripted_output, *rid, *max_new_tokens, *output_ids, *times,
        *token_times, *first_token, *computed_prefill_tokens, *kv_len, *stats, *chunked_req,
        *processed_tokens, *clock, *finish_prefill, *busy_s, *running_x_s,
        *peak_kv_usage, *prefill_steps, *prefill_tokens_computed, *extend_end, *prompt_ids,
        *host_hit_len, *extend_len, *times_first_scheduled, *cached_tokens,
        *host_cached_tokens, *cached_prompt_tokens, *host_cached_prompt_tokens, *prompt_tokens,
        *ignore_eos, *batch_is_full, *note_tried, *take, *native_step;
};

const Names& names() {
    static const Names n = [] {
        auto i = [](const char* s) { return PyUnicode_InternFromString(s); };
        return Names{i("req"), i("prefix_len"), i("new_token_ids"), i("produces_token"),
                     i("host_load_len"), i("sampling"), i("stop_token_ids"),
                     i("scripted_output"), i("rid"), i("max_new_tokens"), i("output_ids"),
                     i("times"), i("token_times"), i("first_token"),
                     i("computed_prefill_tokens"), i("kv_len"), i("stats"), i("chunked_req"),
                     i("processed_tokens"), i("clock"), i("_finish_prefill"),
                     i("busy_s"), i("running_x_s"), i("peak_kv_usage"), i("prefill_steps"),
                     i("prefill_tokens_computed"), i("extend_end"), i("prompt_ids"),
                     i("host_hit_len"), i("extend_len"), i("first_scheduled"),
                     i("cached_tokens"), i("host_cached_tokens"), i("cached_prompt_tokens"),
                     i("host_cached_prompt_tokens"), i("prompt_tokens"), i("ignore_eos"),
                     i("batch_is_full"), i("note_tried"), i("take"), i("_native_step")};
    }();
    return n;
}

bool truthy(nb::handle h) {
    const int t = PyObject_IsTrue(h.ptr());
    if (t < 0) throw nb::python_error();
    return t != 0;
}

void append(nb::handle list, nb::handle v) {
    if (PyList_Check(list.ptr())) {
        if (PyList_Append(list.ptr(), v.ptr()) < 0) throw nb::python_error();
    } else {
        list.attr("append")(v);
    }
}

void add_int(nb::handle o, PyObject* name, int64_t v) { set_int(o, name, get_int(o, name) + v); }

// CostModel._dense_step_s of an extend-only step that loads nothing back from the host tier,
// its efficiency factor and fixed seconds (_efficiency_factor, _fixed_s) computed here.
struct PrefillCost {
    PrefillCost(double lin, double attn, double flops, double weight, double kv, double bytes,
                double eff_tokens, double overhead, double sched_step, double sched_req,
                double sched_prefill, nb::object allreduce)
        : rates{lin, attn, flops, weight, kv, bytes}, eff_tokens(eff_tokens),
          overhead(overhead), sched_step(sched_step), sched_req(sched_req),
          sched_prefill(sched_prefill), allreduce(std::move(allreduce)) {}

    DenseRates rates;
    double eff_tokens, overhead, sched_step, sched_req, sched_prefill;
    nb::object allreduce;  // CostModel.allreduce_s, or None where it is 0.0 (tp == 1)
    // allreduce(tokens) by tokens, asked of Python once per value (a pure function of the
    // cost model's constants, which the rates above were read from once too); at most
    // kAllreduceMemo values kept (a step's tokens repeat: whole chunks, budgets).
    mutable std::unordered_map<int64_t, double> allreduce_memo;
    static constexpr size_t kAllreduceMemo = 1 << 16;

    double allreduce_s(int64_t tokens) const {
        if (allreduce.is_none()) return 0.0;
        const auto it = allreduce_memo.find(tokens);
        if (it != allreduce_memo.end()) return it->second;
        const double v = nb::cast<double>(allreduce(tokens));
        if (allreduce_memo.size() < kAllreduceMemo) allreduce_memo.emplace(tokens, v);
        return v;
    }

    double step(int64_t tokens, int64_t pairs, int64_t kv_tokens, int64_t entries,
                int64_t extends) const {
        const double factor = 1.0 + eff_tokens / double(std::max<int64_t>(tokens, 1));
        const double sched = sched_step + sched_req * double(entries) +
                             sched_prefill * double(extends);
        const double allred = allreduce_s(tokens);
        const double host = 0.0;  // 0 tokens * bytes / pcie_bw, with pcie_bw > 0
        const double fixed = overhead + sched + allred + host;
        return rates.step(double(tokens), double(pairs), double(kv_tokens), factor, fixed);
    }
};

struct Item {
    nb::object req;
    int64_t num_new;
    bool produces;
    int64_t max_new;  // of a producing request
    uint64_t token;   // its stand-in next token
    int64_t end = 0;     // extend_run's: the request's extend_end
    int64_t prompt = 0;  // extend_run's: len(prompt_ids)
};

// _extend_sums without host loads: new tokens, attention pairs, KV tokens.
struct Sums {
    int64_t tokens = 0, pairs = 0, kv = 0;

    // False when a sum would leave int64 (Python's ints would not: the reference runs).
    bool add(int64_t n, int64_t p) {
        int64_t cross, tri, pairs_n, kv_n;
        if (n < 0 || p < 0 || __builtin_mul_overflow(n, p, &cross) ||
            __builtin_mul_overflow(n, n + 1, &tri) ||
            __builtin_add_overflow(cross, tri / 2, &pairs_n) ||
            __builtin_add_overflow(p, n, &kv_n))
            return false;
        return !__builtin_add_overflow(tokens, n, &tokens) &&
               !__builtin_add_overflow(pairs, pairs_n, &pairs) &&
               !__builtin_add_overflow(kv, kv_n, &kv);
    }
};

// A producing item's max_new_tokens and stand-in token; false where the reference's scalar
// path runs (stop ids or a script).
bool stand_in_of(Item& it, int64_t prefix, nb::handle hashes, uint64_t vocab) {
    const Names& n = names();
    const nb::object s = get(it.req, n.sampling);
    if (truthy(get(s, n.stop_token_ids)) || !get(it.req, n.scripted_output).is_none())
        return false;
    it.max_new = get_int(s, n.max_new_tokens);
    const nb::object rid = get(it.req, n.rid);
    const nb::object h = nb::steal(memo_item(hashes.ptr(), rid.ptr()));
    if (!h.is_valid()) throw nb::python_error();
    it.token = stand_in(nb::cast<uint64_t>(h), uint64_t(prefix + it.num_new), vocab);
    return true;
}

// The entries as items with their shape; false where the reference must run: an entry loads
// from the host tier, a producing request has stop ids or a script (CostModelRunner.forward's
// scalar path: tokens at prefix_len + num_new), or a sum leaves int64. Changes nothing.
bool scan(nb::handle entries, nb::handle hashes, uint64_t vocab, std::vector<Item>& items,
          Sums& shape) {
    const Names& n = names();
    for (nb::handle e : entries) {
        if (get_int(e, n.host_load_len) != 0) return false;
        Item it{get(e, n.req), len_of(get(e, n.new_token_ids)),
                truthy(get(e, n.produces_token)), 0, 0};
        const int64_t prefix = get_int(e, n.prefix_len);
        if (!shape.add(it.num_new, prefix)) return false;
        if (it.produces && !stand_in_of(it, prefix, hashes, vocab)) return false;
        items.push_back(std::move(it));
    }
    return !items.empty();
}

// extend_run's scan: the entries _extend_entries would build from the round's admissions
// (those extending: prefix_len the admission's, end the request's extend_end, new tokens
// fill[prefix_len:end], producing at the fill's end) as scan() reads them; false where scan()
// would be, or a request has host hits (its entry would load them). Changes nothing.
bool scan_admissions(nb::handle admissions, nb::handle hashes, uint64_t vocab,
                     std::vector<Item>& items, Sums& shape) {
    const Names& n = names();
    for (nb::handle a : admissions) {
        if (get_int(a, n.extend_len) == 0) continue;
        nb::object req = get(a, n.req);
        if (get_int(req, n.host_hit_len) != 0) return false;
        const int64_t prefix = get_int(a, n.prefix_len), end = get_int(req, n.extend_end);
        const int64_t prompt = len_of(get(req, n.prompt_ids));
        const int64_t fill = prompt + len_of(get(req, n.output_ids));
        if (prefix < 0 || end < 0) return false;
        // len(fill[prefix:end]) for non-negative bounds
        const int64_t num_new = std::max<int64_t>(0, std::min(end, fill) - std::min(prefix, fill));
        Item it{std::move(req), num_new, end == fill, 0, 0, end, prompt};
        if (!shape.add(it.num_new, prefix)) return false;
        if (it.produces && !stand_in_of(it, prefix, hashes, vocab)) return false;
        items.push_back(std::move(it));
    }
    return !items.empty();
}

// Scheduler.run's extend-only path over one native object per scheduler: the slot pool and
// the tree's evictable count (kv_usage), the capacity, and the KV manager's checkpoint.
class PrefillRun {
public:
    PrefillRun(nb::object pool, nb::object evictable, int64_t capacity, nb::object checkpoint)
        : pool_obj_(std::move(pool)), pool_(nb::cast<Pool*>(pool_obj_)),
          evictable_(std::move(evictable)), capacity_(capacity),
          checkpoint_(std::move(checkpoint)) {
        if (capacity_ <= 0) throw std::invalid_argument("PrefillRun: capacity must be > 0");
        names();
    }

    // (duration, prefill tokens, new tokens [(req, [token])], finished, joined) of the step
    // over `entries` started at `t0` (the clock's now), or None: the reference runs.
    nb::object run(nb::handle entries, const PrefillCost& cost, nb::handle hashes,
                   uint64_t vocab, nb::handle sched, double t0) {
        if (vocab == 0) throw std::invalid_argument("PrefillRun: an empty vocabulary");
        std::vector<Item> items;
        Sums shape;
        if (!scan(entries, hashes, vocab, items, shape)) return nb::none();
        const Names& n = names();
        const auto [d, now] = forward(cost, shape, int64_t(items.size()), sched, t0);
        for (const Item& it : items) add_int(it.req, n.computed_prefill_tokens, it.num_new);
        auto [tokens, finished, joined] = emit(items, sched, now);
        return nb::make_tuple(nb::float_(d), shape.tokens, tokens, finished, joined);
    }

    // _extend_entries (NativeScheduler's: KV.extend_batch) over the round's admissions and run()
    // of the extend-only batch that makes, in one call and without building the entries: each
    // extending request first scheduled at `t0` (the clock's now: its prompt statistics), its
    // slots up to extend_end through `kv` (the scheduler's _core.KV), in admission order, the
    // statistics summed in; then the step as run() runs it. (duration, prefill tokens, new
    // tokens, finished, joined, entries), or None before anything changes: a request has host
    // hits to load, or run() would decline (Python builds the entries then). `charges` (a
    // list, or None): each extending request and the tokens it computed appended in batch
    // order, what a charging policy's tenants pay (NativeScheduler._charge_prefill).
    nb::object extend_run(nb::handle kv, nb::handle admissions, const PrefillCost& cost,
                          nb::handle hashes, uint64_t vocab, nb::handle sched, double t0,
                          nb::handle charges = nb::none()) {
        if (vocab == 0) throw std::invalid_argument("PrefillRun: an empty vocabulary");
        std::vector<Item> items;
        Sums shape;
        if (!scan_admissions(admissions, hashes, vocab, items, shape)) return nb::none();
        const Names& n = names();
        const nb::object start = nb::float_(t0);
        int64_t cached_sum = 0, host_sum = 0, prompt_sum = 0;
        for (const Item& it : items) {  // Scheduler._extend, first schedules only
            const nb::object times = get(it.req, n.times);
            if (get(times, n.times_first_scheduled).is_none()) {
                set(times, n.times_first_scheduled, start);
                const int64_t cached = get_int(it.req, n.prefix_len);  // + host hits (none)
                const int64_t prompt = it.prompt;  // len(prompt_ids): scan_admissions read it
                set_int(it.req, n.cached_tokens, cached);
                set_int(it.req, n.host_cached_tokens, 0);
                cached_sum += std::min(cached, prompt);
                prompt_sum += prompt;  // host_sum += min(0, prompt): 0
            }
            kv_extend_slots(kv, it.req, it.end);  // KVManager.extend_entry
        }
        const nb::object stats = get(sched, n.stats);
        add_int(stats, n.cached_prompt_tokens, cached_sum);
        add_int(stats, n.host_cached_prompt_tokens, host_sum);
        add_int(stats, n.prompt_tokens, prompt_sum);
        const auto [d, now] = forward(cost, shape, int64_t(items.size()), sched, t0);
        for (const Item& it : items) add_int(it.req, n.computed_prefill_tokens, it.num_new);
        if (!charges.is_none())
            for (const Item& it : items) append(charges, nb::make_tuple(it.req, it.num_new));
        auto [tokens, finished, joined] = emit(items, sched, now);
        return nb::make_tuple(nb::float_(d), shape.tokens, tokens, finished, joined,
                              int64_t(items.size()));
    }

    // native/step.py's admission and _batch in one call, for a step with no EOS ids (the
    // caller checks, and that admission.covers holds):
    // with `order` (else no admission: the continued chunk spent the round), the round on the
    // native adder `adder` (admit: Adder.round from these budgets, nothing new chunked yet,
    // its admissions appended to `can_run`), the failed request noted (queue.note_tried) and
    // sched.batch_is_full set; then, where an admission extends, the queue's take of the
    // admitted positions (NativeWaitingQueue.take: its native call, queue_take, made here where
    // `take_fixed` and `native_take` are both set, else the queue's own take), the new
    // chunked request set (asserting none is), sched._native_step() and, where that offers
    // one, extend_run over `can_run` at the clock's now. The scheduler's and the queue's
    // values (`running`: its batch is not empty, `has_chunked_req`, `batch_is_full`, `pool`,
    // `waiting`: queue.reqs, `deferred`, `clock`, the take's `take_fixed`, `native_take`,
    // `moved`, `tried`, `added`) are read by the caller: an attribute of theirs costs C++ a
    // generic lookup. Returns None where no admission extends (the caller's decode round:
    // nothing taken), `can_run` where no native step runs the batch (everything up to
    // extend_run done: the caller builds its entries and runs it), else extend_run's tuple
    // (`charges`: as extend_run's).
    nb::object step(nb::handle sched, nb::handle adder, nb::handle tree, nb::handle kv,
                    nb::handle queue, nb::handle order, double ratio, double total_offset,
                    double current_offset, int64_t rem_input, std::optional<int64_t> rem_chunk,
                    bool exclusive, int64_t slots, nb::list can_run, bool running,
                    bool has_chunked, bool full, Pool& pool, nb::list waiting,
                    nb::handle deferred, nb::handle clock, nb::handle take_fixed,
                    nb::handle native_take, nb::dict moved, nb::dict tried, nb::list added,
                    nb::handle charges = nb::none()) {
        const Names& n = names();
        nb::object positions, chunked = nb::none();
        if (order.is_none()) {
            positions = nb::list();
        } else {
            const RoundIn in{ratio, total_offset, current_offset, rem_input,
                             rem_chunk.has_value(), rem_chunk.value_or(0),
                             false,  // nothing new chunked yet
                             exclusive, slots, running, has_chunked, full};
            RoundOut r = adder_round(adder, in, tree, pool, order, waiting, deferred, can_run);
            if (!r.failed.is_none()) queue.attr(nb::handle(n.note_tried))(r.failed);
            set(sched, n.batch_is_full, r.batch_is_full ? Py_True : Py_False);
            positions = std::move(r.positions);
            chunked = std::move(r.chunked);
        }
        bool extends = false;  // _batch: an admission extends
        for (nb::handle a : can_run)
            if (get_int(a, n.extend_len) != 0) {
                extends = true;
                break;
            }
        if (!extends) return nb::none();
        if (take_fixed.is_none() || native_take.is_none()) {  // the queue's own take
            queue.attr(nb::handle(n.take))(positions);
        } else {  // its native call, made here
            const nb::tuple f = nb::cast<nb::tuple>(take_fixed);
            if (f.size() != 5) throw std::invalid_argument("take: five fixed arguments");
            queue_take(waiting, positions, f[0], f[1], f[2], std::move(moved), std::move(tried),
                       std::move(added), f[3], f[4]);
        }
        if (!chunked.is_none()) {
            if (!get(sched, n.chunked_req).is_none()) {
                PyErr_SetString(PyExc_AssertionError, "only one chunked request at a time");
                throw nb::python_error();
            }
            set(sched, n.chunked_req, chunked);
        }
        PyObject* got_native = PyObject_CallMethodNoArgs(sched.ptr(), n.native_step);
        if (got_native == nullptr) throw nb::python_error();
        const nb::object native = nb::steal(got_native);
        if (native.is_none()) return std::move(can_run);
        const nb::tuple got = nb::cast<nb::tuple>(native);
        if (got.size() != 3) throw std::invalid_argument("_native_step: (cost, hashes, vocab)");
        const double t0 = nb::cast<double>(call_now(clock));
        nb::object res = extend_run(kv, can_run, nb::cast<const PrefillCost&>(got[0]), got[1],
                                    nb::cast<uint64_t>(got[2]), sched, t0, charges);
        return res.is_none() ? nb::object(std::move(can_run)) : res;
    }

    // NativeScheduler.step's run of middle chunks (native/scheduler.py's _plan_continuation,
    // ChunkPlan.is_middle and _run_chunk; chunks.hpp plans each): the chunked request `req`'s
    // previous chunk checkpointed (`kv`: the scheduler's _core.KV), its continuation planned
    // over the budgets (page, max_prefill_tokens, chunk_size; the running batch's decode
    // tokens (full, discounted) and the new-token ratio: constant while only middle chunks
    // run), and, a middle chunk, its slots allocated and its step run as run() runs a batch of
    // that chunk alone (it produces no token), again while the clock is before `horizon`
    // (None: one chunk). Returns (done, seconds, the last chunk's tokens, chunks run): done,
    // the step is over (the horizon reached, or the next continuation is not a middle chunk:
    // its extend_end back at prefix_len, the next step plans it); not done, the continuation
    // from here is checkpointed and Python plans it (nothing ran and it is not a middle
    // chunk, or this call cannot run it: host hits to load, a sum past int64, a float
    // math.floor rejects). `charges` (a list, or None): (req, tokens) appended for each chunk
    // run, in order, what a charging policy's tenant pays.
    nb::tuple chunks(nb::handle kv, nb::handle req, const PrefillCost& cost, nb::handle sched,
                     nb::handle horizon, int64_t page, int64_t max_prefill_tokens,
                     int64_t chunk_size, int64_t full, int64_t discounted, double ratio,
                     nb::handle charges = nb::none()) {
        const Names& n = names();
        const ChunkBudget budget{page, max_prefill_tokens, chunk_size,
                                 running_offset(full, discounted, ratio)};
        const nb::object clock = get(sched, n.clock);
        double seconds = 0.0;
        int64_t tokens = 0, steps = 0;
        const auto result = [&](bool done) {
            return nb::make_tuple(done, nb::float_(seconds), tokens, steps);
        };
        for (;;) {
            const nb::object now = call_now(clock);
            if (steps > 0 && (horizon.is_none() || !less(now, horizon) ||
                              !truthy(get(sched, n.chunked_req))))
                return result(true);
            const int64_t ended = get_int(req, n.extend_end);
            if (ended > get_int(req, n.prefix_len)) kv_checkpoint(kv, req, ended);
            const int64_t prefix = get_int(req, n.prefix_len);
            const int64_t fill =
                len_of(get(req, n.prompt_ids)) + len_of(get(req, n.output_ids));
            const ChunkStep plan = plan_chunk(budget, kv_room(kv), prefix, fill);
            if (plan.kind != ChunkKind::Middle) {
                if (steps == 0 || plan.kind == ChunkKind::Python) return result(false);
                set_int(req, n.extend_end, prefix);  // the next step plans it again
                return result(true);
            }
            Sums shape;
            if (get_int(req, n.host_hit_len) != 0 || !shape.add(plan.len, prefix))
                return result(false);
            set_int(req, n.extend_end, prefix + plan.len);  // add_chunked_req
            kv_extend_slots(kv, req, prefix + plan.len);    // extend_entry
            const double d = forward(cost, shape, 1, sched, nb::cast<double>(now)).first;
            add_int(req, n.computed_prefill_tokens, shape.tokens);
            if (!charges.is_none()) append(charges, nb::make_tuple(req, shape.tokens));
            seconds += d;  // out.duration_s += d
            tokens = shape.tokens;
            ++steps;
        }
    }

    // NativeScheduler's continuation of the chunked request `req` (native/step.py, after its
    // checkpoint): what _plan_continuation's fresh adder (the budgets as _native_chunks gives
    // them, clip the clip_max_new_tokens, `limit` its chunked_req_limit) and its
    // add_chunked_req do, and budget_state() after.
    // None before anything changes where Python plans it (a middle chunk, or a value it would
    // raise on); else req.extend_end set as add_chunked_req sets it, and (tokens extended, 0 for
    // a stall; still chunked; total_offset, current_offset, rem_input_tokens,
    // rem_chunk_tokens after; budget_state() is OTHER).
    nb::object continuation(nb::handle kv, nb::handle req, int64_t page,
                            int64_t max_prefill_tokens, int64_t chunk_size, int64_t clip,
                            int64_t full, int64_t discounted, double ratio,
                            std::optional<int64_t> limit) {
        const Names& n = names();
        const int64_t prefix = get_int(req, n.prefix_len);
        const int64_t outs = len_of(get(req, n.output_ids));
        const int64_t fill = len_of(get(req, n.prompt_ids)) + outs;
        const nb::object s = get(req, n.sampling);
        // admission_reservation: min(remaining_new_tokens, clip) * (1.0 or the ratio)
        const int64_t remaining = std::max<int64_t>(get_int(s, n.max_new_tokens) - outs, 0);
        const double resv = static_cast<double>(std::min(remaining, clip)) *
                            (truthy(get(s, n.ignore_eos)) ? 1.0 : ratio);
        const ChunkBudget budget{page, max_prefill_tokens, chunk_size,
                                 running_offset(full, discounted, ratio)};
        const Continuation c = plan_continuation(budget, kv_room(kv), prefix, fill, resv, limit);
        if (c.kind != ChunkKind::Other) return nb::none();
        if (c.len > 0) set_int(req, n.extend_end, prefix + c.len);
        const Budget& a = c.after;
        return nb::make_tuple(c.len, c.truncated, a.total_offset, a.current_offset,
                              a.rem_input_tokens, a.rem_chunk_tokens, c.other);
    }

    // native/step.py's continuation in one call: the chunked request `req`'s last chunk
    // checkpointed (where extend_end > prefix_len), then continuation() (no limit) and, where
    // it plans the chunk, its admission built as `admission(req, prefix_len, tokens,
    // truncated)` where it extends (else None: a stall). None where continuation() declines
    // (the checkpoint done); else (the admission or None, then continuation()'s tuple past its
    // token count).
    nb::object continue_chunk(nb::handle kv, nb::handle req, int64_t page,
                              int64_t max_prefill_tokens, int64_t chunk_size, int64_t clip,
                              int64_t full, int64_t discounted, double ratio,
                              nb::handle admission) {
        const Names& n = names();
        const int64_t ended = get_int(req, n.extend_end);
        if (ended > get_int(req, n.prefix_len)) kv_checkpoint(kv, req, ended);
        const nb::object got = continuation(kv, req, page, max_prefill_tokens, chunk_size, clip,
                                            full, discounted, ratio, std::nullopt);
        if (got.is_none()) return got;
        const nb::tuple t = nb::borrow<nb::tuple>(got);
        nb::object a = nb::none();
        if (nb::cast<int64_t>(t[0]) > 0) {
            if (!admission_rec_.valid() || !admission_cls_.is(admission)) {
                admission_rec_ = Record(admission, {"req", "prefix_len", "extend_len", "chunked"});
                admission_cls_ = nb::borrow(admission);
            }
            a = admission_rec_.make({req, get(req, n.prefix_len), t[0], t[1]});
        }
        return nb::make_tuple(a, t[1], t[2], t[3], t[4], t[5], t[6]);
    }

private:
    Record admission_rec_;  // of admission_cls_ (continue_chunk's admissions)
    nb::object admission_cls_;

    // A step of `size` entries of `shape` started at `t0`, as Scheduler.run times and counts
    // it: its duration and the clock's new time (a Python float).
    std::pair<double, nb::object> forward(const PrefillCost& cost, const Sums& shape,
                                          int64_t size, nb::handle sched, double t0) {
        const Names& n = names();
        const double d = cost.step(shape.tokens, shape.pairs, shape.kv, size, size);
        const nb::object stats = get(sched, n.stats);
        account(stats, size, d);
        nb::object now = nb::float_(t0 + d);  // VirtualClock.advance(d): _t + d
        vclock::jump_to(get(sched, n.clock), now);
        add_int(stats, n.prefill_steps, 1);  // _count_tokens (nothing loaded back)
        add_int(sched, n.processed_tokens, shape.tokens);
        add_int(stats, n.prefill_tokens_computed, shape.tokens);
        return {d, std::move(now)};
    }

    static nb::object call_now(nb::handle clock) { return vclock::now(clock); }  // clock.now()

    static bool less(nb::handle a, nb::handle b) {  // a < b, as Python compares them
        const int lt = PyObject_RichCompareBool(a.ptr(), b.ptr(), Py_LT);
        if (lt < 0) throw nb::python_error();
        return lt != 0;
    }

    // Scheduler.account(size, [d]): after the forward, before anything is checkpointed.
    void account(nb::handle st, int64_t size, double d) {
        const Names& n = names();
        set(st, n.busy_s, nb::float_(nb::cast<double>(get(st, n.busy_s)) + d));
        set(st, n.running_x_s,
            nb::float_(nb::cast<double>(get(st, n.running_x_s)) + double(size) * d));
        const int64_t room = pool_->available_size() + nb::cast<int64_t>(evictable_());
        const double usage = double(capacity_ - room) / double(capacity_);  // kv_usage
        if (usage > nb::cast<double>(get(st, n.peak_kv_usage)))  // max(peak, usage)
            set(st, n.peak_kv_usage, nb::float_(usage));
    }

    // Scheduler.run's loop over the producing entries: the chunked request let go, _emit
    // (the token, its time, the first-token time), then a request at max_new_tokens finishes
    // through the scheduler (check_finish and role.prefilled: _finish_prefill) and the others
    // are checkpointed and join the running batch.
    std::tuple<nb::list, nb::list, nb::list> emit(const std::vector<Item>& items,
                                                  nb::handle sched, nb::handle now) {
        const Names& n = names();
        nb::list tokens, finished, joined;
        nb::object chunked = get(sched, n.chunked_req);
        for (const Item& it : items) {
            if (!it.produces) continue;  // a middle chunk: checkpointed at the next step
            const nb::handle r = it.req;
            if (chunked.is(r)) {
                set(sched, n.chunked_req, Py_None);
                chunked = nb::none();
            }
            const nb::object tok = nb::steal(PyLong_FromUnsignedLongLong(it.token));
            if (!tok.is_valid()) throw nb::python_error();
            const nb::object outs = get(r, n.output_ids), times = get(r, n.times);
            append(outs, tok);
            append(get(times, n.token_times), now);
            if (get(times, n.first_token).is_none()) set(times, n.first_token, now);
            nb::list one;
            one.append(tok);
            tokens.append(nb::make_tuple(r, one));
            if (len_of(outs) >= it.max_new && finishes(sched, r)) {
                finished.append(r);
            } else {
                checkpoint_(r, get(r, n.kv_len));
                joined.append(r);
            }
        }
        return {tokens, finished, joined};
    }

    static bool finishes(nb::handle sched, nb::handle r) {
        PyObject* v = PyObject_CallMethodOneArg(sched.ptr(), names().finish_prefill, r.ptr());
        if (v == nullptr) throw nb::python_error();
        return truthy(nb::steal(v));
    }

    nb::object pool_obj_;  // kept alive: pool_ points into it
    Pool* pool_;
    nb::object evictable_;  // the tree's evictable_size
    int64_t capacity_;
    nb::object checkpoint_;  // NativeKVManager.checkpoint (kv.cpp)
};

}  // namespace
}  // namespace radixsched

void bind_prefill(nb::module_& m) {
    using radixsched::PrefillCost;
    using radixsched::PrefillRun;
    nb::class_<PrefillCost>(m, "PrefillCost")
        .def(nb::init<double, double, double, double, double, double, double, double, double,
                      double, double, nb::object>(),
             "lin"_a, "attn"_a, "flops"_a, "weight"_a, "kv"_a, "bytes"_a, "eff_tokens"_a,
             "overhead"_a, "sched_step"_a, "sched_req"_a, "sched_prefill"_a,
             "allreduce"_a.none())
        .def("step", &PrefillCost::step, "tokens"_a, "pairs"_a, "kv_tokens"_a, "entries"_a,
             "extends"_a);
    // py_attr.hpp's get and set as the native steps use them (for its tests): `name` interned.
    m.def("_get_attr", [](nb::handle o, nb::str name) {
        PyObject* n = Py_NewRef(name.ptr());
        PyUnicode_InternInPlace(&n);
        const nb::object key = nb::steal(n);
        return radixsched::py::get(o, key.ptr());
    });
    m.def("_set_attr", [](nb::handle o, nb::str name, nb::handle v) {
        PyObject* n = Py_NewRef(name.ptr());
        PyUnicode_InternInPlace(&n);
        const nb::object key = nb::steal(n);
        radixsched::py::set(o, key.ptr(), v);
    });
    nb::class_<PrefillRun>(m, "PrefillRun")
        .def(nb::init<nb::object, nb::object, int64_t, nb::object>(), "pool"_a, "evictable"_a,
             "capacity"_a, "checkpoint"_a)
        .def("run", &PrefillRun::run, "entries"_a, "cost"_a, "hashes"_a, "vocab"_a, "sched"_a,
             "t0"_a)
        .def("extend_run", &PrefillRun::extend_run, "kv"_a, "admissions"_a, "cost"_a,
             "hashes"_a, "vocab"_a, "sched"_a, "t0"_a, "charges"_a.none() = nb::none())
        .def("step", &PrefillRun::step, "sched"_a, "adder"_a, "tree"_a, "kv"_a, "queue"_a,
             "order"_a.none(), "ratio"_a, "total_offset"_a, "current_offset"_a,
             "rem_input_tokens"_a, "rem_chunk_tokens"_a.none(), "exclusive_chunking"_a,
             "slots"_a, "can_run"_a, "running"_a, "has_chunked_req"_a, "batch_is_full"_a,
             "pool"_a, "waiting"_a, "deferred"_a, "clock"_a, "take_fixed"_a.none(),
             "native_take"_a.none(), "moved"_a, "tried"_a, "added"_a,
             "charges"_a.none() = nb::none())
        .def("continuation", &PrefillRun::continuation, "kv"_a, "req"_a, "page"_a,
             "max_prefill_tokens"_a, "chunk_size"_a, "clip"_a, "full"_a, "discounted"_a,
             "ratio"_a, "limit"_a = nb::none())
        .def("continue_chunk", &PrefillRun::continue_chunk, "kv"_a, "req"_a, "page"_a,
             "max_prefill_tokens"_a, "chunk_size"_a, "clip"_a, "full"_a, "discounted"_a,
             "ratio"_a, "admission"_a)
        .def("chunks", &PrefillRun::chunks, "kv"_a, "req"_a, "cost"_a, "sched"_a,
             "horizon"_a.none(), "page"_a, "max_prefill_tokens"_a, "chunk_size"_a, "full"_a,
             "discounted"_a, "ratio"_a, "charges"_a.none() = nb::none());
}
