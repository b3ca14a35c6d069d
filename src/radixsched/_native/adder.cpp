// See adder.hpp. The admission loop here is Scheduler._admit / _try_admit /
// _recomputes_in_flight with NativeScheduler.match_for_admission and PrefillAdder.add_one_req
// (radixsched/scheduler.py, native/scheduler.py, adder.py) for the common case the caller checked
// (native/admit.py's covers): no prefill gate, an enabled cache, no host tier, hits in whole
// pages; SGLang compat's rounds too (its budgets, `cfg.compat`, and no in-flight guard: the
// caller clears `guard`), and priority preemption (`preempt`: PrefillAdder.preempt_to_schedule,
// called back where the batch is full). It makes the same tree calls in the same order (touch,
// walk, lock, unlock) and sets the same request fields.
#include "adder.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kv.hpp"
#include "py_attr.hpp"
#include "matcher.hpp"
#include "pool.hpp"
#include "radix.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {

Verdict budget_state(const Budget& b, int64_t room) {
    const double r = static_cast<double>(room);
    if (!(r - b.total_offset > 0 && r - b.current_offset > 0)) return Verdict::NoToken;
    if (b.rem_input_tokens <= 0) return Verdict::Other;
    if (b.has_chunk && b.rem_chunk_tokens <= 0) return Verdict::Other;
    return Verdict::Continue;
}

double reservation(const AdderConfig& c, int64_t remaining_new_tokens, bool ignore_eos) {
    const double ratio = ignore_eos ? 1.0 : c.new_token_ratio;
    return static_cast<double>(std::min(remaining_new_tokens, c.clip_max_new_tokens)) * ratio;
}

Shape select(const Budget& b, const AdderConfig& c, int64_t room, int64_t cand, int64_t prefix_len,
             double max_new_check, bool has_chunked_req) {
    const int64_t p = c.page;
    const int64_t input_tokens = ceil_page(cand, p);
    int64_t rem_chunk = b.rem_chunk_tokens;
    if (b.has_chunk && !c.compat && b.n_admitted > 0)
        rem_chunk = std::min(rem_chunk, b.rem_input_tokens);
    const bool will_chunk = b.has_chunk && input_tokens > rem_chunk;
    // SGLang checks the whole request's tokens even where it chunks (compat).
    const int64_t first = (will_chunk && !c.compat) ? floor_page(rem_chunk, p) : cand;
    const double total_tokens =
        (static_cast<double>(first) + max_new_check) + static_cast<double>(p);
    if (!(total_tokens < static_cast<double>(room) - b.total_offset))
        return {false, Verdict::NoToken, 0, false};
    if (!b.has_chunk) {
        if (b.n_admitted > 0 && input_tokens >= b.rem_input_tokens)
            return {false, Verdict::Other, 0, false};
        return {true, Verdict::Continue, cand, false};
    }
    if (!will_chunk) return {true, Verdict::Continue, cand, false};
    if ((has_chunked_req && c.exclusive_chunking) || b.has_new_chunked)
        return {false, Verdict::Other, 0, false};  // one chunked request at a time
    const int64_t chunk = floor_page(prefix_len + floor_page(rem_chunk, p), p) - prefix_len;
    if (chunk <= 0) return {false, Verdict::Other, 0, false};
    return {true, Verdict::Continue, chunk, true};
}

void charge(Budget& b, int64_t page, int64_t prefix_len, int64_t extend_len, double reservation) {
    const int64_t paged = ceil_page(extend_len, page);
    const int64_t immediate = paged + page;
    b.total_offset += static_cast<double>(immediate) + reservation;
    b.current_offset += static_cast<double>(immediate);
    b.rem_input_tokens -= paged;
    if (b.has_chunk) b.rem_chunk_tokens -= paged;
    b.log_hit_tokens += prefix_len;
    b.log_input_tokens += extend_len;
}

int64_t common_prefix(const int32_t* a, int64_t na, const int32_t* b, int64_t nb_) {
    const int64_t n = std::min(na, nb_);
    // Whole blocks that memcmp (vectorized) finds equal are skipped, then the first mismatch
    // is searched from the first block that differs (or the tail): the same length as a scan
    // from the start. Shared prompts agree for thousands of tokens (the in-flight guard).
    constexpr int64_t kBlock = 128;
    int64_t i = 0;
    while (n - i >= kBlock && std::memcmp(a + i, b + i, kBlock * sizeof(int32_t)) == 0)
        i += kBlock;
    return std::mismatch(a + i, a + n, b + i).first - a;
}

namespace {

TreeOf g_tree_of = nullptr;

using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Interned attribute names, created once and never released (like module.cpp's namespaces).
struct Names {
    PyObject *rid, *sampling, *max_new_tokens, *ignore_eos, *output_ids, *prompt_ids, *fill_ids,
        *extra_key, *cache_salt, *prefix_len, *kv_len, *cache_protected_len, *last_node,
        *kv_row, *kv_buf, *host_hit_len, *num_matched, *extend_end, *lock_node, *req,
        *extend_len, *seen, *positions;
};
Names* g_names = nullptr;

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

void init_names() {
    if (g_names != nullptr) return;
    static Names n{intern("rid"), intern("sampling"), intern("max_new_tokens"),
                   intern("ignore_eos"), intern("output_ids"), intern("prompt_ids"),
                   intern("fill_ids"), intern("extra_key"), intern("cache_salt"),
                   intern("prefix_len"), intern("kv_len"), intern("cache_protected_len"),
                   intern("last_node"), intern("kv_row"), intern("kv_buf"),
                   intern("host_hit_len"), intern("num_matched_prefix_tokens"),
                   intern("extend_end"), intern("lock_node"), intern("req"),
                   intern("extend_len"), intern("_seen"), intern("_positions")};
    g_names = &n;
}

using py::get;
using py::len_of;

nb::handle zero() {  // Python's 0 (a small int: the interpreter's own, never released)
    static PyObject* const z = PyLong_FromLong(0);
    return z;
}
using py::set;
using py::set_int;

// A request (or an admitted member) as the loop reads it; tokens and namespace on demand.
struct Seen {
    nb::object req;
    nb::object tokens;  // fill_ids(), kept alive while read
    nb::object node;    // the match's node as a Python object (borrow)
    int32_t ns = -1;
    int64_t prefix_len = 0, extend_len = 0;
    bool chunked = false;  // admitted as this round's new chunked request
    Tokens arr;            // `tokens` as an array, once read (a member is read per candidate)
    bool has_arr = false;

    const Tokens& fill() {
        if (!has_arr) {
            if (!tokens.is_valid()) tokens = req.attr(nb::handle(g_names->fill_ids))();
            arr = nb::cast<Tokens>(tokens);
            has_arr = true;
        }
        return arr;
    }
};

// Whether a[0, n) and b[0, n) hold the same tokens: their last few compared first (token
// sequences that part somewhere differ all along past that point, so a pair that parts inside
// the span, two prompts behind one shared first block as a rule, is told at once), then the
// rest. The same answer as one memcmp of the span. (Not for a walk's node compares, which
// mostly agree: there the tail's two cold lines, read first, only delay the sequential scan.)
bool same_tokens(const int32_t* a, const int32_t* b, int64_t n) {
    constexpr int64_t kTail = 16;
    const int64_t tail = n < kTail ? n : kTail;
    if (tail <= 0) return true;
    if (std::memcmp(a + n - tail, b + n - tail, static_cast<size_t>(tail) * sizeof(int32_t)) != 0)
        return false;
    return std::memcmp(a, b, static_cast<size_t>(n - tail) * sizeof(int32_t)) == 0;
}

// Whether common_prefix(a[:na], b[:nb]) >= k, comparing only the tokens in [from, k) (the
// caller knows those before `from` equal): the common prefix reaches k exactly when k is
// within both and the first k tokens agree.
bool shares_at_least(const int32_t* a, int64_t na, const int32_t* b, int64_t nb_, int64_t from,
                     int64_t k) {
    if (k <= 0) return true;
    if (k > std::min(na, nb_)) return false;
    from = std::clamp<int64_t>(from, 0, k);
    return same_tokens(a + from, b + from, k - from);  // (its tail first: see there)
}

// RoundOrder.position(i) (radixsched/queue.py): read in place when the order is exactly a
// RoundOrder (its positions produced so far, `_seen`, then the rest drawn from its iterator,
// `_positions`, one at a time as position() draws them); any other order's own method.
class Positions {
public:
    Positions(nb::handle order, nb::handle round_order) {
        if (round_order.is_valid() && order.type().is(round_order)) {
            seen_ = get(order, g_names->seen);
            it_ = get(order, g_names->positions);
            if (!PyList_CheckExact(seen_.ptr())) throw std::invalid_argument("RoundOrder._seen");
        } else {
            method_ = order.attr("position");
        }
    }

    nb::object at(int64_t i) {
        if (method_.is_valid()) return method_(i);
        while (PyList_GET_SIZE(seen_.ptr()) <= i) {
            PyObject* nxt = PyIter_Next(it_.ptr());  // next(positions, None)
            if (nxt == nullptr) {
                if (PyErr_Occurred() != nullptr) throw nb::python_error();
                return nb::none();
            }
            nb::object got = nb::steal(nxt);
            if (got.is_none()) return got;
            if (PyList_Append(seen_.ptr(), got.ptr()) != 0) throw nb::python_error();
        }
        return nb::borrow(PyList_GET_ITEM(seen_.ptr(), i));
    }

private:
    nb::object seen_, it_, method_;
};

class NativeAdder {
public:
    AdderConfig cfg;
    Budget b;
    bool guard = false;      // the in-flight recompute guard is on
    int64_t threshold = 1;   // max(in_batch_prefix_deprioritize_threshold, 1)
    int64_t slots = 0;       // request slots this round
    bool running = false;    // the running batch is not empty
    bool has_chunked_req = false;
    bool batch_is_full = false;
    nb::object empty_slots;  // request.EMPTY_SLOTS
    nb::object ns_of;        // namespace id of a request (radixsched.native.namespace_id)
    nb::object admission;    // adder.Admission: an admitted request's record
    nb::object round_order;  // queue.RoundOrder: an order read in place (Positions)
    // Priority preemption (None: off): preempt(req, admitted, total_offset) runs
    // PrefillAdder.preempt_to_schedule for `req` with this round's admissions so far and the
    // live budget, and returns (preempted, total_offset, running: the running batch not empty).
    nb::object preempt;

    const Record& admission_record() {  // adder.Admission(req, prefix_len, extend_len, chunked)
        if (!admission_rec.valid() || !admission_cls.is(admission)) {
            admission_rec = Record(admission, {"req", "prefix_len", "extend_len", "chunked"});
            admission_cls = admission;
        }
        return admission_rec;
    }
    std::vector<Seen> members;  // can_run_list, for the guard
    Record admission_rec;       // of admission_cls, the admission when it was built
    nb::object admission_cls;

    // A round's start: the Python adder's budgets, and the scheduler's state.
    void begin(double ratio, double total_offset, double current_offset, int64_t rem_input,
               nb::object rem_chunk, int64_t n_admitted, bool has_new_chunked, bool exclusive,
               int64_t slots_, bool running_, bool has_chunked, bool full) {
        const bool has_chunk = !rem_chunk.is_none();
        start(RoundIn{ratio, total_offset, current_offset, rem_input, has_chunk,
                      has_chunk ? nb::cast<int64_t>(rem_chunk) : 0, has_new_chunked, exclusive,
                      slots_, running_, has_chunked, full},
              n_admitted);
    }

    void start(const RoundIn& in, int64_t n_admitted) {
        cfg.new_token_ratio = in.ratio;
        cfg.exclusive_chunking = in.exclusive;
        b = Budget{};
        b.total_offset = in.total_offset;
        b.current_offset = in.current_offset;
        b.rem_input_tokens = in.rem_input;
        b.has_chunk = in.has_chunk;
        b.rem_chunk_tokens = in.has_chunk ? in.rem_chunk : 0;
        b.n_admitted = n_admitted;
        b.has_new_chunked = in.has_new_chunked;
        slots = in.slots;
        running = in.running;
        has_chunked_req = in.has_chunked_req;
        batch_is_full = in.batch_is_full;
        members.clear();
    }

    // The budgets for the Python adder: (total_offset, current_offset, rem_input_tokens,
    // rem_chunk_tokens, log_hit_tokens, log_input_tokens, batch_is_full).
    nb::tuple budgets() const {
        return nb::make_tuple(
            b.total_offset, b.current_offset, b.rem_input_tokens,
            b.has_chunk ? nb::object(nb::int_(b.rem_chunk_tokens)) : nb::none(),
            b.log_hit_tokens, b.log_input_tokens, batch_is_full);
    }

    void add_member(nb::object req, int64_t prefix_len, int64_t extend_len) {
        members.push_back(Seen{std::move(req), nb::object(), nb::object(), -1, prefix_len, extend_len});
    }

    nb::tuple admit(nb::handle tree_h, Pool& pool, nb::handle order, nb::list waiting,
                    nb::handle deferred, nb::list can_run);

private:
    bool preempt_for(Seen& s, size_t first_new);
    int32_t ns(Seen& s);
    bool recomputes(Tree& tree, Seen& s);
    bool try_admit(Tree& tree, Matcher* matcher, Pool& pool, Seen& s, Verdict& verdict);
    NodePtr borrow(Tree& tree, Matcher* matcher, Seen& s, int64_t fill_len);
};

int32_t NativeAdder::ns(Seen& s) {
    if (s.ns < 0) {
        const bool plain = get(s.req, g_names->extra_key).is_none() &&
                           get(s.req, g_names->cache_salt).is_none();
        s.ns = plain ? 0 : nb::cast<int32_t>(ns_of(s.req));
    }
    return s.ns;
}

// Scheduler._recomputes_in_flight.
bool NativeAdder::recomputes(Tree& tree, Seen& s) {
    if (members.empty()) return false;
    const Tokens& fill_arr = s.fill();
    const int32_t* fill = fill_arr.data();
    const int64_t n = static_cast<int64_t>(fill_arr.shape(0));
    const int64_t cap = std::max<int64_t>(n - 1, 0);
    const int32_t my_ns = ns(s);
    int64_t cached = -1;
    for (Seen& a : members) {
        if (ns(a) != my_ns) continue;
        const int64_t end = std::min(cap, a.prefix_len + a.extend_len);
        if (end - a.prefix_len < threshold) continue;
        const Tokens& other = a.fill();
        // shared = common_prefix(fill[:min(end, n)], other[:min(end, len(other))]), compared
        // only as far as the two tests below need: shared - prefix_len >= threshold, then
        // shared - start >= threshold (start >= prefix_len: the tokens before agree already).
        const int64_t na = std::min(end, n), nb_ = std::min<int64_t>(end, other.shape(0));
        const int64_t least = a.prefix_len + threshold;
        if (!shares_at_least(fill, na, other.data(), nb_, 0, least)) continue;
        if (cached < 0) cached = tree.match_len(fill, cap, my_ns);
        const int64_t start = std::max(cached, a.prefix_len);
        if (end - start >= threshold &&
            shares_at_least(fill, na, other.data(), nb_, least, start + threshold))
            return true;
    }
    return false;
}

// NativeScheduler.match_for_admission + KVManager.borrow: the admission's match, from the matcher's
// memo when it is current (NativeWaitingQueue.admission_end), else a walk (match_node).
NodePtr NativeAdder::borrow(Tree& tree, Matcher* matcher, Seen& s, int64_t fill_len) {
    const int64_t cap_key = std::max<int64_t>(fill_len - 1, 0);
    const auto k = static_cast<int64_t>(reinterpret_cast<intptr_t>(s.req.ptr()));  // id(req)
    const Memo* m = (matcher != nullptr && !matcher->is_dirty(k)) ? matcher->memo(k) : nullptr;
    NodePtr last;
    int64_t length = 0;
    if (m != nullptr) {
        NodePtr node = m->node;
        int64_t offset = m->full ? node->size() : m->offset;
        const int64_t cap = floor_page(cap_key, tree.page_size());
        int64_t extra = m->n - cap;  // the whole fill is cached: step back to the cap
        while (extra > 0) {
            if (offset > extra) {
                offset -= extra;
                extra = 0;
            } else {
                extra -= offset;
                if (node->parent == nullptr) throw IntegrityFailure("admission: memo above root");
                node = node->parent->shared_from_this();
                offset = node->size();
            }
        }
        length = std::min(m->n, cap);
        last = tree.touch_at(*node, offset);
    } else if (cap_key == 0) {
        last = tree.root();
    } else {
        const Tokens& fill = s.fill();
        const WalkResult w = tree.walk(fill.data(), cap_key, ns(s), nullptr);
        last = w.node;
        length = w.length;
    }
    const Names& n = *g_names;
    nb::int_ len(length);
    s.node = nb::cast(last);  // one wrapper for last_node and, admitted, lock_node
    set(s.req, n.prefix_len, len);
    set(s.req, n.kv_len, len);
    set(s.req, n.cache_protected_len, len);
    set(s.req, n.last_node, s.node);
    set(s.req, n.kv_row, empty_slots);
    set(s.req, n.kv_buf, empty_slots);
    set(s.req, n.host_hit_len, zero());
    const int64_t matched = std::min(length, cap_key);
    set(s.req, n.num_matched, matched == length ? nb::object(len) : nb::object(nb::int_(matched)));
    s.prefix_len = length;
    return last;
}

// Scheduler._try_admit with PrefillAdder.add_one_req; `verdict`: the adder's on the round.
bool NativeAdder::try_admit(Tree& tree, Matcher* matcher, Pool& pool, Seen& s, Verdict& verdict) {
    const Names& n = *g_names;
    nb::object sampling = get(s.req, n.sampling);
    const int64_t max_new = nb::cast<int64_t>(get(sampling, n.max_new_tokens));
    const int64_t out_len = len_of(get(s.req, n.output_ids));
    const int64_t fill_len = len_of(get(s.req, n.prompt_ids)) + out_len;
    NodePtr last = borrow(tree, matcher, s, fill_len);
    bool ok = false;
    if (cfg.prefill_max_requests >= 0 && b.n_admitted >= cfg.prefill_max_requests) {
        verdict = Verdict::Other;
    } else {
        const int64_t remaining = std::max<int64_t>(max_new - out_len, 0);
        // admission_reservation and add_one_req's max_new_check: SGLang's (compat) reserves the
        // whole clipped max_new_tokens and checks the clipped remaining ones (an int there).
        double resv = 0.0, check = 0.0;
        if (cfg.compat) {
            resv = static_cast<double>(std::min(max_new, cfg.clip_max_new_tokens));
            check = static_cast<double>(std::min(remaining, cfg.clip_max_new_tokens));
        } else {
            resv = reservation(cfg, remaining, nb::cast<bool>(get(sampling, n.ignore_eos)));
            check = resv;
        }
        tree.inc_lock_ref(*last);  // the request's own prefix is not evictable during the checks
        const Shape sh = select(b, cfg, pool.available_size() + tree.evictable_size(),
                                fill_len - s.prefix_len, s.prefix_len, check, has_chunked_req);
        if (sh.ok) {
            set_int(s.req, n.extend_end, s.prefix_len + sh.extend_len);
            set(s.req, n.lock_node, s.node);
            tree.inc_lock_ref(*last);
            b.n_admitted += 1;
            b.has_new_chunked = b.has_new_chunked || sh.chunked;
            charge(b, cfg.page, s.prefix_len, sh.extend_len, sh.chunked ? 0.0 : resv);
            s.extend_len = sh.extend_len;
            ok = true;
        }
        tree.dec_lock_ref(*last);
        verdict = ok ? budget_state(b, pool.available_size() + tree.evictable_size()) : sh.verdict;
    }
    if (!ok) {  // the match was only borrowed for the checks
        set(s.req, n.kv_len, zero());
        set(s.req, n.cache_protected_len, zero());
    }
    return ok;
}

// PrefillAdder.preempt_to_schedule through the Python callback: it reads the round's admitted
// requests (members from `first_new`; the continued chunk is in the Python adder's list
// already) and the total budget, and may release running requests (the pool and the tree are
// read live here, so their memory counts at once).
bool NativeAdder::preempt_for(Seen& s, size_t first_new) {
    nb::list admitted;
    for (size_t j = first_new; j < members.size(); ++j) admitted.append(members.at(j).req);
    nb::tuple got = nb::cast<nb::tuple>(preempt(s.req, admitted, b.total_offset));
    b.total_offset = nb::cast<double>(got[1]);
    running = nb::cast<bool>(got[2]);
    return nb::cast<bool>(got[0]);
}

// Scheduler._admit: the round's order read as the reference reads it (`order.position(i)` only
// once the loop's checks pass: an order may draw random numbers and permute the list lazily).
// The admitted requests then take their prefixes (KVManager.take_prefix: once the round's
// admissions are done, a later admission's touch may split the node a prefix ends at, its path
// keeping its slots) and join `can_run` (the Python adder's can_run_list) as Admission records,
// in admission order. Returns (the admitted positions, the new chunked request or None, the
// request tried and not admitted or None).
nb::tuple NativeAdder::admit(nb::handle tree_h, Pool& pool, nb::handle order, nb::list waiting,
                             nb::handle deferred, nb::list can_run) {
    auto [tree, matcher] = g_tree_of(tree_h);
    const bool any_deferred = len_of(deferred) > 0;
    Positions position(order, round_order);
    nb::list positions;
    nb::object failed = nb::none();
    const size_t first_new = members.size();  // members before it: the continued chunk
    const bool preemption = preempt.is_valid() && !preempt.is_none();
    for (int64_t i = 0;; ++i) {
        if (budget_state(b, pool.available_size() + tree->evictable_size()) == Verdict::Other ||
            (batch_is_full && !preemption))
            break;
        nb::object pos = position.at(i);
        if (pos.is_none()) break;
        nb::object req = nb::steal(PyObject_GetItem(waiting.ptr(), pos.ptr()));
        if (!req.is_valid()) throw nb::python_error();
        Seen s{req, nb::object(), nb::object(), -1, 0, 0};
        if (any_deferred) {
            const int got = PySequence_Contains(deferred.ptr(), get(s.req, g_names->rid).ptr());
            if (got < 0) throw nb::python_error();
            if (got == 1) continue;
        }
        if (guard && recomputes(*tree, s)) continue;
        if (b.n_admitted >= slots) batch_is_full = true;
        // A full batch admits only over running requests preempted for it (priority).
        if (batch_is_full && (!preemption || !preempt_for(s, first_new))) break;
        Verdict verdict = Verdict::Continue;
        const bool chunked_before = b.has_new_chunked;
        if (try_admit(*tree, matcher, pool, s, verdict)) {
            s.chunked = b.has_new_chunked && !chunked_before;
            positions.append(pos);
            members.push_back(std::move(s));
        } else {
            failed = s.req;
        }
        if (verdict != Verdict::Continue) {
            if (verdict == Verdict::NoToken) batch_is_full = b.n_admitted > 0 || running;
            break;
        }
    }
    nb::object new_chunked = nb::none();
    for (size_t j = first_new; j < members.size(); ++j) {
        const Seen& s = members[j];
        take_prefix(*tree, pool, s.req);
        nb::object prefix = nb::int_(s.prefix_len), extend = nb::int_(s.extend_len);
        can_run.append(admission_record().make(
            {s.req, prefix, extend, s.chunked ? Py_True : Py_False}));
        if (s.chunked) new_chunked = s.req;
    }
    members.clear();  // no request outlives its round here
    return nb::make_tuple(positions, new_chunked, failed);
}

// Adder.round: begin, the round's admissions so far (the continued chunk) as members, admit.
RoundOut round(NativeAdder& a, const RoundIn& in, nb::handle tree, Pool& pool, nb::handle order,
               nb::list waiting, nb::handle deferred, nb::list can_run) {
    a.start(in, int64_t(nb::len(can_run)));
    const Names& n = *g_names;
    for (nb::handle m : can_run)
        a.add_member(get(m, n.req), py::get_int(m, n.prefix_len), py::get_int(m, n.extend_len));
    nb::tuple r = a.admit(tree, pool, order, waiting, deferred, can_run);
    return RoundOut{nb::borrow<nb::list>(r[0]), r[1], r[2], a.b, a.batch_is_full};
}

// The config and the budgets as properties (the tests set them and compare with PrefillAdder).
void bind_budget(nb::class_<NativeAdder>& c) {
    c.def_prop_rw(
            "page", [](NativeAdder& a) { return a.cfg.page; },
            [](NativeAdder& a, int64_t v) {
                if (v <= 0) throw std::invalid_argument("page must be positive");
                a.cfg.page = v;
            })
        .def_prop_rw(
            "clip_max_new_tokens", [](NativeAdder& a) { return a.cfg.clip_max_new_tokens; },
            [](NativeAdder& a, int64_t v) { a.cfg.clip_max_new_tokens = v; })
        .def_prop_rw(
            "new_token_ratio", [](NativeAdder& a) { return a.cfg.new_token_ratio; },
            [](NativeAdder& a, double v) { a.cfg.new_token_ratio = v; })
        .def_prop_rw(
            "prefill_max_requests", [](NativeAdder& a) { return a.cfg.prefill_max_requests; },
            [](NativeAdder& a, int64_t v) { a.cfg.prefill_max_requests = v; })
        .def_prop_rw(
            "exclusive_chunking", [](NativeAdder& a) { return a.cfg.exclusive_chunking; },
            [](NativeAdder& a, bool v) { a.cfg.exclusive_chunking = v; })
        .def_prop_rw(
            "compat", [](NativeAdder& a) { return a.cfg.compat; },
            [](NativeAdder& a, bool v) { a.cfg.compat = v; })
        .def_prop_rw(
            "total_offset", [](NativeAdder& a) { return a.b.total_offset; },
            [](NativeAdder& a, double v) { a.b.total_offset = v; })
        .def_prop_rw(
            "current_offset", [](NativeAdder& a) { return a.b.current_offset; },
            [](NativeAdder& a, double v) { a.b.current_offset = v; })
        .def_prop_rw(
            "rem_input_tokens", [](NativeAdder& a) { return a.b.rem_input_tokens; },
            [](NativeAdder& a, int64_t v) { a.b.rem_input_tokens = v; })
        .def_prop_rw(
            "rem_chunk_tokens",
            [](NativeAdder& a) -> nb::object {
                return a.b.has_chunk ? nb::object(nb::int_(a.b.rem_chunk_tokens)) : nb::none();
            },
            [](NativeAdder& a, nb::object v) {
                a.b.has_chunk = !v.is_none();
                a.b.rem_chunk_tokens = a.b.has_chunk ? nb::cast<int64_t>(v) : 0;
            },
            nb::arg("v").none())
        .def_prop_rw(
            "n_admitted", [](NativeAdder& a) { return a.b.n_admitted; },
            [](NativeAdder& a, int64_t v) { a.b.n_admitted = v; })
        .def_prop_rw(
            "has_new_chunked", [](NativeAdder& a) { return a.b.has_new_chunked; },
            [](NativeAdder& a, bool v) { a.b.has_new_chunked = v; })
        .def_prop_ro("log_hit_tokens", [](NativeAdder& a) { return a.b.log_hit_tokens; })
        .def_prop_ro("log_input_tokens", [](NativeAdder& a) { return a.b.log_input_tokens; });
}

}  // namespace

RoundOut adder_round(nb::handle adder, const RoundIn& in, nb::handle tree, Pool& pool,
                     nb::handle order, nb::list waiting, nb::handle deferred, nb::list can_run) {
    return round(nb::cast<NativeAdder&>(adder), in, tree, pool, order, std::move(waiting),
                 deferred, std::move(can_run));
}

void bind_adder(nb::module_& m, TreeOf tree_of) {
    g_tree_of = tree_of;
    init_names();
    bind_kv(m, tree_of);  // the KV moves of an admission's requests (kv.cpp), same resolver
    nb::class_<NativeAdder> c(m, "Adder");
    bind_budget(c);
    c.def(nb::init<>())
        .def_rw("guard", &NativeAdder::guard)
        .def_rw("threshold", &NativeAdder::threshold)
        .def_rw("slots", &NativeAdder::slots)
        .def_rw("running", &NativeAdder::running)
        .def_rw("has_chunked_req", &NativeAdder::has_chunked_req)
        .def_rw("batch_is_full", &NativeAdder::batch_is_full)
        .def_rw("empty_slots", &NativeAdder::empty_slots)
        .def_rw("ns_of", &NativeAdder::ns_of)
        .def_rw("admission", &NativeAdder::admission)
        .def_rw("round_order", &NativeAdder::round_order)
        .def_rw("preempt", &NativeAdder::preempt, nb::arg("preempt").none())
        .def("begin", &NativeAdder::begin, "new_token_ratio"_a, "total_offset"_a,
             "current_offset"_a, "rem_input_tokens"_a, "rem_chunk_tokens"_a.none(),
             "n_admitted"_a, "has_new_chunked"_a, "exclusive_chunking"_a, "slots"_a,
             "running"_a, "has_chunked_req"_a, "batch_is_full"_a)
        .def("budgets", &NativeAdder::budgets)
        .def("add_member", &NativeAdder::add_member, "req"_a, "prefix_len"_a, "extend_len"_a)
        .def("budget_state",
             [](NativeAdder& a, int64_t room) { return static_cast<int>(budget_state(a.b, room)); })
        .def("select",
             [](NativeAdder& a, int64_t room, int64_t cand, int64_t prefix_len,
                double max_new_check, bool has_chunked_req) {
                 const Shape s = select(a.b, a.cfg, room, cand, prefix_len, max_new_check,
                                        has_chunked_req);
                 return nb::make_tuple(s.ok, static_cast<int>(s.verdict), s.extend_len,
                                       s.chunked);
             })
        .def("reservation",
             [](NativeAdder& a, int64_t remaining, bool ignore_eos) {
                 return reservation(a.cfg, remaining, ignore_eos);
             })
        .def("charge",
             [](NativeAdder& a, int64_t prefix_len, int64_t extend_len, double resv) {
                 charge(a.b, a.cfg.page, prefix_len, extend_len, resv);
             })
        .def("admit", &NativeAdder::admit, "tree"_a, "pool"_a, "order"_a, "waiting"_a,
             "deferred"_a, "can_run"_a)
        // A round begun and admitted in one call (native/step.py): begin(ratio, total_offset,
        // current_offset, rem_input, rem_chunk, len(can_run), has_new_chunked, exclusive,
        // slots, running, has_chunked_req, batch_is_full), each of `can_run`'s admissions so
        // far (the continued chunk) added as a member, then admit(...); returns admit's
        // (positions, chunked, failed) and budgets() after it.
        .def("round",
             [](NativeAdder& a, double ratio, double total_offset, double current_offset,
                int64_t rem_input, nb::object rem_chunk, bool has_new_chunked, bool exclusive,
                int64_t slots, bool running, bool has_chunked, bool full, nb::handle tree,
                Pool& pool, nb::handle order, nb::list waiting, nb::handle deferred,
                nb::list can_run) {
                 const bool has_chunk = !rem_chunk.is_none();
                 const RoundIn in{ratio, total_offset, current_offset, rem_input, has_chunk,
                                  has_chunk ? nb::cast<int64_t>(rem_chunk) : 0, has_new_chunked,
                                  exclusive, slots, running, has_chunked, full};
                 RoundOut r = round(a, in, tree, pool, order, waiting, deferred, can_run);
                 return nb::make_tuple(r.positions, r.chunked, r.failed, a.budgets());
             },
             "new_token_ratio"_a, "total_offset"_a, "current_offset"_a, "rem_input_tokens"_a,
             "rem_chunk_tokens"_a.none(), "has_new_chunked"_a, "exclusive_chunking"_a,
             "slots"_a, "running"_a, "has_chunked_req"_a, "batch_is_full"_a, "tree"_a,
             "pool"_a, "order"_a, "waiting"_a, "deferred"_a, "can_run"_a);
    m.def("common_prefix", [](Tokens a, Tokens b) {
        return common_prefix(a.data(), a.shape(0), b.data(), b.shape(0));
    });
    // The guard's bounded test (tests: common_prefix(a, b) >= k, `from` a known-equal start).
    m.def("shares_at_least", [](Tokens a, Tokens b, int64_t from, int64_t k) {
        if (from < 0 || std::min<int64_t>(from, k) > common_prefix(a.data(), a.shape(0), b.data(),
                                                                   b.shape(0)))
            throw std::invalid_argument("shares_at_least: `from` past the common prefix");
        return shares_at_least(a.data(), a.shape(0), b.data(), b.shape(0), from, k);
    });
}

}  // namespace radixsched
