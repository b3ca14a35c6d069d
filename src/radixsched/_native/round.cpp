// See round.hpp. Bit for bit what native/queue.py's Python round did: the same fields set to the
// same values, the same frozenset operations for the deferred rids, the same keys (Python
// tuples, built as policies.lpm builds them) handed to the same StableOrder update.
#include "round.hpp"

#include <nanobind/stl/pair.h>

#include <algorithm>
#include <cstdint>
#include <climits>
#include <cstring>
#include <iterator>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "compat_fill.hpp"  // Attr
#include "dedup.hpp"
#include "dedup_bind.hpp"
#include "dfs_order.hpp"
#include "matcher.hpp"
#include "order.hpp"
#include "radix.hpp"
#include "radix_match.hpp"  // TokenView

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {

namespace {

TreeOf g_tree_of = nullptr;

PyObject* intern(const char* s) {
    // One reference per name for the life of the process, never released.
    PyObject* o = PyUnicode_InternFromString(s);
    if (o == nullptr) throw nb::python_error();
    return o;
}

struct Names {
    PyObject* matched = intern("num_matched_prefix_tokens");
    PyObject* rid = intern("rid");
    PyObject* entry = intern("queue_entry_time");
    PyObject* arrival = intern("arrival_time");
    PyObject* difference = intern("difference");
    PyObject* union_ = intern("union");
    PyObject* fill_ids = intern("fill_ids");
    PyObject* fill_len = intern("fill_len");
};

const Names& names() {
    static const Names n;
    return n;
}

// The keys' reads of a request, as getattr reads them (a __slots__ member: in place, without the
// lookup; compat::Attr).
struct KeyAttrs {
    compat::Attr rid{"rid"}, matched{"num_matched_prefix_tokens"}, entry{"queue_entry_time"},
        arrival{"arrival_time"}, prompt_ids{"prompt_ids"}, output_ids{"output_ids"};
};

KeyAttrs& key_attrs() {
    static KeyAttrs k;
    return k;
}

// -r.num_matched_prefix_tokens, as Python negates it (the keys' first match term).
nb::object neg_matched(KeyAttrs& k, PyObject* r) {
    PyObject* neg = PyNumber_Negative(k.matched.get(r).ptr());
    if (neg == nullptr) throw nb::python_error();
    return nb::steal(neg);
}

void check(int rc) {
    if (rc < 0) throw nb::python_error();
}

// r.rid in deferred (the keys' deferral term; the rid read first, as the tuple reads it).
bool is_deferred(KeyAttrs& k, PyObject* r, nb::handle deferred) {
    nb::object rid = k.rid.get(r);
    const int dep = PySequence_Contains(deferred.ptr(), rid.ptr());
    check(dep);
    return dep != 0;
}

nb::object attr(PyObject* o, PyObject* name) {
    PyObject* v = PyObject_GetAttr(o, name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

int64_t id_of(PyObject* r) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(r)); }

// reqs_of[k] (NativeMatcher.reqs: the tracked requests by id), KeyError when absent.
nb::object tracked(nb::handle reqs_of, int64_t k) {
    nb::object key = nb::int_(k);
    PyObject* r = PyDict_GetItemWithError(reqs_of.ptr(), key.ptr());  // borrowed
    if (r == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key.ptr());
        throw nb::python_error();
    }
    return nb::borrow(r);
}

std::vector<nb::object> values_of(nb::handle dict) {
    std::vector<nb::object> out;
    Py_ssize_t pos = 0;
    PyObject *key = nullptr, *value = nullptr;
    while (PyDict_Next(dict.ptr(), &pos, &key, &value)) out.push_back(nb::borrow(value));
    return out;
}

void set_matched(const Matcher& m, PyObject* r) {  // min(memo n, fill_len - 1)
    key_attrs().matched.set_int(nb::handle(r), m.prefill_match(id_of(r)));
}

// The queue's _sync_matches: re-match the dirty requests (those whose match moved join
// `moved`), then set the matched length of every request whose key inputs may have changed
// (`matched`: moved, tried and the arrivals; else the whole list); `tried` is emptied.
void sync(Matcher& m, nb::handle reqs_of, nb::list queue, nb::list added, nb::dict moved,
          nb::dict tried, bool matched) {
    for (int64_t k : m.refresh()) {
        nb::object r = tracked(reqs_of, k);
        check(PyDict_SetItem(moved.ptr(), nb::int_(k).ptr(), r.ptr()));
    }
    if (!matched) {
        for (nb::handle r : queue) set_matched(m, r.ptr());
    } else {
        for (const nb::object& r : values_of(moved)) set_matched(m, r.ptr());
        for (const nb::object& r : values_of(tried)) set_matched(m, r.ptr());
        for (nb::handle r : added) set_matched(m, r.ptr());
    }
    PyDict_Clear(tried.ptr());
}

nb::object call_method(nb::handle o, PyObject* name, nb::handle arg) {
    PyObject* v = PyObject_CallMethodOneArg(o.ptr(), name, arg.ptr());
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

// The dedup's verdict: the deferred rids (the last verdict `deferred` changed as the round
// changed it; a new set only where it changed, as sets are copied whole) and the grouped
// requests whose status flipped (`afresh`: every deferred one).
std::pair<nb::object, nb::list> verdict(Matcher& m, nb::handle reqs_of, bool afresh,
                                        nb::object deferred) {
    DedupOutcome got = m.dedup().decide(afresh);
    nb::list left, entered;
    for (const std::string& rid : got.left) left.append(str_of(rid));
    for (const std::string* rid : got.entered) entered.append(str_of(*rid));
    if (afresh) {
        PyObject* s = PyFrozenSet_New(entered.ptr());
        if (s == nullptr) throw nb::python_error();
        deferred = nb::steal(s);
    } else {
        if (nb::len(left) != 0) deferred = call_method(deferred, names().difference, left);
        if (nb::len(entered) != 0) deferred = call_method(deferred, names().union_, entered);
    }
    nb::list flipped;
    for (int64_t k : got.flipped) flipped.append(tracked(reqs_of, k));
    return {deferred, flipped};
}

// lpm's key with nobody overdue, (1, rid in deferred, -matched, entry, arrival), as the atoms
// StableOrder.update makes of that tuple (the same reads, in the same order), without the tuple.
Atoms lpm_key(PyObject* r, nb::handle deferred, nb::handle /*plain*/) {
    KeyAttrs& k = key_attrs();
    static PyObject* const one = PyLong_FromLong(1);  // a small int: never released
    const bool dep = is_deferred(k, r, deferred);
    nb::object matched = neg_matched(k, r);
    Atoms key;
    key.reserve(6);  // and the tie number
    key.push_back(Atom::of(one));
    key.push_back(Atom::of(dep ? Py_True : Py_False));
    key.push_back(Atom::of(matched));
    key.push_back(Atom::of(k.entry.get(r)));
    key.push_back(Atom::of(k.arrival.get(r)));
    return key;
}

// Whether `r` is among `items` (identity): a scan of a few, a hash set's lookup past them.
class Among {
public:
    explicit Among(PyObject* const* items, size_t n) : items_(items), n_(n) {
        if (n_ > kScan) set_.insert(items, items + n);
    }
    bool has(PyObject* r) const {
        if (n_ > kScan) return set_.count(r) != 0;
        for (size_t i = 0; i < n_; ++i)
            if (items_[i] == r) return true;
        return false;
    }

private:
    static constexpr size_t kScan = 16;
    PyObject* const* items_;
    size_t n_;
    std::unordered_set<PyObject*> set_;
};

// The list's item pointers (contiguous: a list's items array).
PyObject* const* items_of(PyObject* list) { return reinterpret_cast<PyListObject*>(list)->ob_item; }

// Whether `a`'s items [0, n) are `b`'s items [at, at + n) (the same objects): one memcmp of the
// pointer arrays.
bool same_items(PyObject* a, PyObject* b, Py_ssize_t at, Py_ssize_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(PyObject*);
    return n == 0 || std::memcmp(items_of(a), items_of(b) + at, bytes) == 0;
}

// Whether the list is a kept order's members followed by the arrivals (the queue's _in_sync;
// identity, as the lists' == compares requests: Req has no __eq__).
bool in_sync(nb::list queue, nb::list members_list, nb::list added) {
    PyObject* q = queue.ptr();
    PyObject* members = members_list.ptr();
    const Py_ssize_t n = PyList_GET_SIZE(members), na = PyList_GET_SIZE(added.ptr());
    if (PyList_GET_SIZE(q) != n + na) return false;
    return same_items(members, q, 0, n) && same_items(added.ptr(), q, n, na);
}

// The changed members of a kept order's round, as the queue's _order lists them: flipped,
// then moved (each list's requests are distinct: flipped by key, moved a dict's values), each
// once, the arrivals not among them.
std::vector<PyObject*> changed_of(nb::list added, nb::list flipped, nb::dict moved) {
    const auto na = static_cast<size_t>(PyList_GET_SIZE(added.ptr()));
    const auto nf = static_cast<size_t>(PyList_GET_SIZE(flipped.ptr()));
    const Among fresh(items_of(added.ptr()), na);
    const Among first(items_of(flipped.ptr()), nf);
    std::vector<PyObject*> changed;
    for (size_t i = 0; i < nf; ++i)
        if (!fresh.has(items_of(flipped.ptr())[i])) changed.push_back(items_of(flipped.ptr())[i]);
    Py_ssize_t pos = 0;
    PyObject *key = nullptr, *value = nullptr;
    while (PyDict_Next(moved.ptr(), &pos, &key, &value))
        if (!fresh.has(value) && !first.has(value)) changed.push_back(value);
    return changed;
}

// r.fill_len; for a request exactly of the request type `plain` (its fill_len Req's own
// property), what that property returns, len(prompt_ids) + len(output_ids), without its frame.
nb::object fill_len_of(PyObject* r, nb::handle plain) {
    const Names& n = names();
    KeyAttrs& k = key_attrs();
    if (plain.is_none() || reinterpret_cast<PyObject*>(Py_TYPE(r)) != plain.ptr())
        return attr(r, n.fill_len);
    const Py_ssize_t prompt = PyObject_Size(k.prompt_ids.get(r).ptr());
    if (prompt < 0) throw nb::python_error();
    const Py_ssize_t outs = PyObject_Size(k.output_ids.get(r).ptr());
    if (outs < 0) throw nb::python_error();
    return nb::int_(prompt + outs);
}

// shortest-prefill-first's key, (rid in deferred, prefill_work, entry, arrival) with
// prefill_work = max(1, fill_len - matched), as the atoms StableOrder.update makes of that tuple
// (the same reads, in the same order: rid, fill_len, matched, entry, arrival), without it.
Atoms spf_key(PyObject* r, nb::handle deferred, nb::handle plain) {
    KeyAttrs& k = key_attrs();
    static PyObject* const one = PyLong_FromLong(1);  // a small int: never released
    const bool dep = is_deferred(k, r, deferred);
    nb::object fill = fill_len_of(r, plain);
    PyObject* diff = PyNumber_Subtract(fill.ptr(), k.matched.get(r).ptr());
    if (diff == nullptr) throw nb::python_error();
    nb::object work = nb::steal(diff);
    const int more = PyObject_RichCompareBool(work.ptr(), one, Py_GT);  // max(1, work)
    check(more);
    Atoms key;
    key.reserve(5);  // and the tie number
    key.push_back(Atom::of(dep ? Py_True : Py_False));
    key.push_back(Atom::of(more != 0 ? work : nb::handle(one)));
    key.push_back(Atom::of(k.entry.get(r)));
    key.push_back(Atom::of(k.arrival.get(r)));
    return key;
}

// fair's key within one tenant, (-matched, entry, arrival) (FairEngine._key), as atoms.
Atoms fair_key(PyObject* r, nb::handle /*deferred*/, nb::handle /*plain*/) {
    KeyAttrs& k = key_attrs();
    nb::object matched = neg_matched(k, r);
    Atoms key;
    key.reserve(4);  // and the tie number
    key.push_back(Atom::of(matched));
    key.push_back(Atom::of(k.entry.get(r)));
    key.push_back(Atom::of(k.arrival.get(r)));
    return key;
}

// queue_round's `key` (native/queue.py: KEPT_KEYS, FAIR_KEY).
constexpr int kLpmKey = 0, kSpfKey = 1, kFairKey = 2;

using KeyOf = Atoms (*)(PyObject*, nb::handle, nb::handle);

// KeyedEngine.advance for lpm's or spf's key (`key_of`), from the queue's _order: the changed
// members re-keyed and the arrivals placed. False (nothing done): the Python round orders (out
// of sync, or so many moving that it rebuilds).
bool advance_keyed(StableOrder& order, nb::list queue, nb::list added, nb::list flipped,
                   nb::dict moved, nb::handle deferred, KeyOf key_of, nb::handle plain) {
    if (!in_sync(queue, order.reqs, added)) return false;
    const std::vector<PyObject*> changed = changed_of(added, flipped, moved);
    const auto na = static_cast<size_t>(PyList_GET_SIZE(added.ptr()));
    const size_t moving = changed.size() + na;
    const auto total = static_cast<size_t>(PyList_GET_SIZE(queue.ptr()));
    if (worth_rebuilding(moving, total)) return false;
    StableOrder::Keyed rekey, news;
    rekey.reserve(changed.size());
    for (PyObject* r : changed) rekey.emplace_back(nb::borrow(r), key_of(r, deferred, plain));
    news.reserve(na);
    for (size_t i = 0; i < na; ++i) {
        PyObject* r = PyList_GET_ITEM(added.ptr(), static_cast<Py_ssize_t>(i));
        news.emplace_back(nb::borrow(r), key_of(r, deferred, plain));
    }
    order.update_atoms(std::move(rekey), std::move(news), queue);
    return true;
}

// The queue's _order for dfs-weight's engine (DfsWeightEngine), which the queue runs only
// while in sync (it passes the order then): in sync, its advance, else (or where the advance
// declines) its rebuild. Always done.
void advance_dfs(DfsWeightOrder& order, nb::list queue, nb::list added, nb::list flipped,
                 nb::dict moved, nb::handle deferred) {
    if (in_sync(queue, order.reqs(), added)) {
        PyObject* const* news = items_of(added.ptr());
        const std::vector<PyObject*> arrivals(news, news + PyList_GET_SIZE(added.ptr()));
        if (order.advance_items(changed_of(added, flipped, moved), arrivals, deferred, queue))
            return;
    }
    order.rebuild(queue, deferred);
}

Matcher& matcher_of(nb::handle tree) {
    Matcher* m = g_tree_of(tree).second;
    if (m == nullptr) throw std::runtime_error("no native matcher listens to this tree");
    return *m;
}

// tree.queue_round(reqs_of, queue, added, moved, tried, matched, dedup, deferred, order, key):
// the sync, then (`dedup`) the dedup's verdict, then (`order`: a key policy's StableOrder, keyed
// by lpm's key (`key` 0), spf's (1) or fair's within its one tenant (2); dfs-weight's
// DfsWeightOrder (always advanced or
// rebuilt); or None) the order's advance (`plain`: the request type whose fill_len spf's key
// reads natively, or None). Returns
// (deferred, flipped, whether the order was advanced); moved keeps what the Python round's
// _order reads when it was not.
nb::tuple queue_round(nb::handle tree, nb::handle reqs_of, nb::list queue, nb::list added,
                      nb::dict moved, nb::dict tried, bool matched, bool dedup,
                      nb::object deferred, nb::handle order, int key, nb::handle plain) {
    Matcher& m = matcher_of(tree);
    sync(m, reqs_of, queue, added, moved, tried, matched);
    nb::list flipped;
    if (dedup) std::tie(deferred, flipped) = verdict(m, reqs_of, !matched, deferred);
    bool done = false;
    if (!order.is_none() && nb::isinstance<StableOrder>(order)) {
        KeyOf key_of = key == kLpmKey ? lpm_key : key == kSpfKey ? spf_key : fair_key;
        if (key != kLpmKey && key != kSpfKey && key != kFairKey)
            throw nb::value_error("queue_round: an unknown key");
        done = advance_keyed(nb::cast<StableOrder&>(order), queue, added, flipped, moved, deferred,
                             key_of, plain);
    } else if (!order.is_none()) {  // a DfsWeightOrder (else a TypeError)
        advance_dfs(nb::cast<DfsWeightOrder&>(order), queue, added, flipped, moved, deferred);
        done = true;
    }
    return nb::make_tuple(deferred, flipped, done);
}

// tree.touch_memos(reqs): touch the tree where each request's memo ends, last to first (the
// queue's waiting-prefix refresh); each memo is read just before its touch (a touch may split
// the node another memo ends in, which re-points that memo).
void touch_memos(nb::handle tree, nb::list reqs) {
    auto [t, m] = g_tree_of(tree);
    if (m == nullptr) throw std::runtime_error("no native matcher listens to this tree");
    for (Py_ssize_t i = PyList_GET_SIZE(reqs.ptr()) - 1; i >= 0; --i) {
        PyObject* r = PyList_GET_ITEM(reqs.ptr(), i);
        const Memo* memo = m->memo(id_of(r));
        if (memo == nullptr) throw nb::key_error("touch_memos: a request is not tracked");
        t->touch_at(*memo->node, memo->full ? memo->node->size() : memo->offset);
    }
}

// `r`'s fill as Req.fill_ids makes it, without the call, where `r` is exactly of the request
// type `plain` (its fill_ids Req's own) and its outputs an exact list of exact ints in int32's
// range: the prompt (the int32 array Req.__post_init__ makes of it) read in place while there
// is no output, else the prompt and then the outputs (np.asarray(output_ids, dtype=np.int32))
// joined into `joined`. False (nothing read but the outputs): call fill_ids.
bool read_fill(PyObject* r, nb::handle plain, nb::object& held, std::optional<TokenView>& prompt,
               std::vector<int32_t>& joined, const int32_t*& data, int64_t& len) {
    if (plain.is_none() || reinterpret_cast<PyObject*>(Py_TYPE(r)) != plain.ptr()) return false;
    compat::Names& a = compat::names();  // (getattr's reads: a __slots__ member in place)
    nb::object outs = a.output_ids.get(r);
    if (!PyList_CheckExact(outs.ptr())) return false;
    const Py_ssize_t no = PyList_GET_SIZE(outs.ptr());
    for (Py_ssize_t i = 0; i < no; ++i) {  // (checked before the prompt is read)
        PyObject* v = PyList_GET_ITEM(outs.ptr(), i);
        int overflow = 0;
        const long long x = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
        if (!PyLong_CheckExact(v) || overflow != 0 || x < INT32_MIN || x > INT32_MAX) return false;
    }
    held = a.prompt_ids.get(r);  // (read in place while held)
    prompt.emplace(held);
    data = prompt->data();
    len = prompt->size();
    if (no == 0) return true;
    joined.clear();
    joined.reserve(static_cast<size_t>(len + no));  // (kept for the next fill: one copy each)
    joined.insert(joined.end(), data, data + len);
    for (Py_ssize_t i = 0; i < no; ++i)
        joined.push_back(static_cast<int32_t>(PyLong_AsLongLong(PyList_GET_ITEM(outs.ptr(), i))));
    data = joined.data();
    len = static_cast<int64_t>(joined.size());
    return true;
}

// Walk (touch) the tree along `r`'s fill: WaitingQueue.refresh's touch_prefixes of
// CacheKey(r.fill_ids(), r.namespace), without the key (the fill read here where read_fill
// can, else fill_ids called): an empty fill is not walked, and the namespace's id is asked
// (`ns_of(r)`) only for a non-empty fill outside the default namespace (no extra key, no salt),
// as touch_keys asks it.
void touch_fill(Tree& t, PyObject* r, nb::handle ns_of, nb::handle plain,
                std::vector<int32_t>& joined) {
    const int32_t* data = nullptr;
    int64_t len = 0;
    nb::object tokens;  // the fill's array, held while its tokens are read in place
    std::optional<TokenView> tok;
    if (!read_fill(r, plain, tokens, tok, joined, data, len)) {
        PyObject* got = PyObject_CallMethodNoArgs(r, names().fill_ids);
        if (got == nullptr) throw nb::python_error();
        tokens = nb::steal(got);
        const Py_ssize_t n = PyObject_Size(tokens.ptr());
        if (n < 0) throw nb::python_error();
        if (n == 0) return;
        tok.emplace(tokens);
        data = tok->data();
        len = tok->size();
    }
    if (len == 0) return;
    int32_t ns = 0;
    compat::Names& a = compat::names();
    if (!a.extra_key.get(r).is_none() || !a.cache_salt.get(r).is_none())
        ns = nb::cast<int32_t>(ns_of(nb::handle(r)));
    t.walk_into(data, len, ns, nullptr);
}

// Cache hints for touch_fill's reads of `r`, a few requests ahead, in two steps (each some
// requests' work before the reads it prepares): `stage` 0 asks for the lines of an instance
// of `plain` (a type) at r, reading nothing (not even r's type); 1 (those lines in cache by
// then) for its prompt array's and its outputs list's, where r is one (another request's fill
// may be a call). (The prompt's tokens are asked for where they are read: TokenView,
// covers_copy.)
void prefetch_fill(PyObject* r, nb::handle plain, int stage) {
    if (stage == 0) {
        const char* at = reinterpret_cast<const char*>(r);
        const Py_ssize_t size = reinterpret_cast<PyTypeObject*>(plain.ptr())->tp_basicsize;
        for (Py_ssize_t i = 0; i < size; i += 64) __builtin_prefetch(at + i);
        __builtin_prefetch(at + size - 1);
        return;
    }
    if (reinterpret_cast<PyObject*>(Py_TYPE(r)) != plain.ptr()) return;
    compat::Names& a = compat::names();
    if (PyObject* prompt = a.prompt_ids.peek(r)) {
        __builtin_prefetch(prompt);
        __builtin_prefetch(reinterpret_cast<const char*>(prompt) + 64);
    }
    if (PyObject* outs = a.output_ids.peek(r)) __builtin_prefetch(outs);
}

// tree.touch_fills(ahead, head, ns_of, plain): the reference refresh's touches, last to first
// of `ahead` (the requests ahead of the queue), then of `head` (the order's head); each fill read
// just before its walk (`plain`: the request type whose fills are joined here, or None). A
// disabled tree walks nothing and reads nothing (touch_keys returns before drawing a key).
void touch_fills(nb::handle tree, nb::handle ahead, nb::handle head, nb::handle ns_of,
                 nb::handle plain) {
    Tree& t = *g_tree_of(tree).first;
    if (t.disabled()) return;
    std::vector<int32_t> joined;
    const bool hints = !plain.is_none() && PyType_Check(plain.ptr());  // (prefetch_fill's)
    for (nb::handle seq : {ahead, head}) {
        nb::object items = nb::steal(PySequence_Fast(seq.ptr(), "touch_fills: a sequence"));
        if (!items.is_valid()) throw nb::python_error();
        constexpr Py_ssize_t kAhead[2] = {6, 4};  // each stage's distance (prefetch_fill)
        for (Py_ssize_t i = PySequence_Fast_GET_SIZE(items.ptr()) - 1; i >= 0; --i) {
            for (int stage = 0; stage < 2 && hints; ++stage) {
                if (i >= kAhead[stage])
                    prefetch_fill(PySequence_Fast_GET_ITEM(items.ptr(), i - kAhead[stage]),
                                  plain, stage);
            }
            touch_fill(t, PySequence_Fast_GET_ITEM(items.ptr(), i), ns_of, plain, joined);
        }
    }
}

// into.update(r.tenant_key for r in seq[start:]) (native/orders.py FairEngine's observation):
// each tenant added in order, as set.update adds them; one that is the object added just before
// (in the set already: adding it again changes nothing) is skipped.
void add_tenants(nb::handle into, nb::handle seq, Py_ssize_t start) {
    static compat::Attr tenant{"tenant_key"};  // (held for the life of the process)
    if (!PySet_Check(into.ptr())) throw nb::type_error("add_tenants: a set");
    if (start < 0) throw nb::value_error("add_tenants: a negative start");
    nb::object items = nb::steal(PySequence_Fast(seq.ptr(), "add_tenants: a sequence"));
    if (!items.is_valid()) throw nb::python_error();
    nb::object last;  // the tenant just added (held: compared by identity)
    for (Py_ssize_t i = start; i < PySequence_Fast_GET_SIZE(items.ptr()); ++i) {
        PyObject* r = PySequence_Fast_GET_ITEM(items.ptr(), i);
        PyObject* member = tenant.peek(r);  // a plain member's object, read in place
        nb::object t = member != nullptr ? nb::borrow(member) : tenant.get(r);  // (else getattr)
        if (t.ptr() == last.ptr()) continue;
        check(PySet_Add(into.ptr(), t.ptr()));
        last = std::move(t);
    }
}

// dict(Counter(r.tenant_key for r in seq)) (the native scheduler's decode charge): each
// tenant's number of requests, the tenants in order of first appearance, as Counter counts
// them. A run of requests holding the same tenant object is counted as one dict update.
nb::dict tenant_counts(nb::handle seq) {
    static compat::Attr tenant{"tenant_key"};  // (held for the life of the process)
    nb::object items = nb::steal(PySequence_Fast(seq.ptr(), "tenant_counts: a sequence"));
    if (!items.is_valid()) throw nb::python_error();
    nb::dict counts;
    nb::object last;  // the tenant of the current run (held: compared by identity)
    Py_ssize_t run = 0;
    auto flush = [&] {  // counts[last] = counts.get(last, 0) + run
        if (run == 0) return;
        PyObject* had = PyDict_GetItemWithError(counts.ptr(), last.ptr());  // borrowed
        if (had == nullptr && PyErr_Occurred()) throw nb::python_error();
        const Py_ssize_t before = had == nullptr ? 0 : PyLong_AsSsize_t(had);
        nb::object total = nb::steal(PyLong_FromSsize_t(before + run));
        check(PyDict_SetItem(counts.ptr(), last.ptr(), total.ptr()));
    };
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items.ptr()); ++i) {
        PyObject* r = PySequence_Fast_GET_ITEM(items.ptr(), i);
        PyObject* member = tenant.peek(r);  // a plain member's object, read in place
        nb::object t = member != nullptr ? nb::borrow(member) : tenant.get(r);  // (else getattr)
        if (t.ptr() == last.ptr()) {
            ++run;
            continue;
        }
        flush();
        last = std::move(t);
        run = 1;
    }
    flush();
    return counts;
}

// queue.sort(key=attrgetter("sampling.max_new_tokens"), reverse=True) (SGLang compat's lof
// round): the stable sort by descending max_new_tokens (equal keys keep their order), done here
// where `queue` is a list and each request holds, in its plain `sampling` member, an instance
// of exactly `params` (SamplingParams: generic attribute reads, no property of that name, so a
// read runs no Python code) whose max_new_tokens is an exact int within int64 (compared as
// Python compares ints). False, the list untouched, otherwise: the caller sorts. A round's list
// is the last round's order with the arrivals behind it, so its sorted head is found, the rest
// stably sorted and merged behind it (std::merge takes the head's element first among equal
// keys: the stable order).
bool sort_lof(nb::handle queue, nb::handle params) {
    static compat::Attr sampling{"sampling"};  // (held for the life of the process)
    static PyObject* const max_new = PyUnicode_InternFromString("max_new_tokens");
    PyObject* list = queue.ptr();
    if (!PyList_CheckExact(list) || !PyType_Check(params.ptr())) return false;
    const Py_ssize_t n = PyList_GET_SIZE(list);
    std::vector<int64_t> keys(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* s = sampling.peek(PyList_GET_ITEM(list, i));
        if (s == nullptr || Py_TYPE(s) != reinterpret_cast<PyTypeObject*>(params.ptr()))
            return false;
        nb::object v = nb::steal(PyObject_GetAttr(s, max_new));
        if (!v.is_valid()) throw nb::python_error();
        if (!PyLong_CheckExact(v.ptr())) return false;
        int overflow = 0;
        const long long k = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
        if (overflow != 0) return false;
        if (k == -1 && PyErr_Occurred()) throw nb::python_error();
        keys[static_cast<size_t>(i)] = k;
    }
    size_t head = 1;
    while (head < keys.size() && keys[head - 1] >= keys[head]) ++head;
    if (head >= keys.size()) return true;  // sorted already
    std::vector<size_t> at(keys.size());
    std::iota(at.begin(), at.end(), size_t{0});
    const auto later = [&](size_t a, size_t b) { return keys[a] > keys[b]; };
    const auto mid = at.begin() + static_cast<std::ptrdiff_t>(head);
    std::stable_sort(mid, at.end(), later);
    std::vector<size_t> order;
    order.reserve(keys.size());
    std::merge(at.begin(), mid, mid, at.end(), std::back_inserter(order), later);
    std::vector<PyObject*> items(keys.size());
    for (size_t i = 0; i < items.size(); ++i)
        items[i] = PyList_GET_ITEM(list, static_cast<Py_ssize_t>(order[i]));
    // The same objects in their new places: no reference changes hands.
    for (size_t i = 0; i < items.size(); ++i)
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), items[i]);
    return true;
}

// del list[i]: in range of an exact list, the items after it moved down in one memmove; else
// (a negative index, past the end, a subclass) as Python's del does it.
void list_del(PyObject* list, Py_ssize_t i) {
    const Py_ssize_t n = PyList_GET_SIZE(list);
    if (i < 0 || i >= n || !PyList_CheckExact(list)) {
        check(PySequence_DelItem(list, i));
        return;
    }
    PyObject** items = reinterpret_cast<PyListObject*>(list)->ob_item;
    PyObject* gone = items[i];
    std::memmove(items + i, items + i + 1, static_cast<size_t>(n - i - 1) * sizeof(PyObject*));
    Py_SET_SIZE(reinterpret_cast<PyVarObject*>(list), n - 1);
    Py_DECREF(gone);  // last: the list is consistent should a finalizer read it
}

// dict.pop(key, None).
void pop_key(nb::handle dict, PyObject* key) {
    PyObject* v = PyDict_GetItemWithError(dict.ptr(), key);  // borrowed
    if (v == nullptr) {
        if (PyErr_Occurred()) throw nb::python_error();
        return;
    }
    check(PyDict_DelItem(dict.ptr(), key));
}

}  // namespace

// queue_take(queue, positions, tree, fills, reqs_of, moved, tried, added, order, remove):
// NativeWaitingQueue.take in one call, its effects in its order. First WaitingQueue.take: the
// requests at `positions` (list indexing: IndexError as there), then each position deleted,
// highest first. Then per taken request, in taken order, _untrack: (`tree`, not None: the
// queue's matcher, whose compat keys are off) the matcher's untrack and its `fills` and
// `reqs_of` entries dropped; its `moved` and `tried` entries dropped; then its first identity
// in `added` deleted, or else the kept order's removal: `order.remove(r)` (StableEngine's
// remove; a StableOrder's or a DfsWeightOrder's natively) or `remove(r)` (another engine's),
// neither when both None.
nb::list queue_take(nb::list queue, nb::handle positions, nb::handle tree, nb::handle fills,
                    nb::handle reqs_of, nb::dict moved, nb::dict tried, nb::list added,
                    nb::handle order, nb::handle remove) {
    std::vector<Py_ssize_t> at;
    nb::list taken;
    for (nb::handle p : positions) {
        const Py_ssize_t i = PyNumber_AsSsize_t(p.ptr(), PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) throw nb::python_error();
        PyObject* r = PySequence_GetItem(queue.ptr(), i);  // new reference
        if (r == nullptr) throw nb::python_error();
        taken.append(nb::steal(r));
        at.push_back(i);
    }
    std::sort(at.begin(), at.end(), [](Py_ssize_t a, Py_ssize_t b) { return a > b; });
    for (Py_ssize_t i : at) list_del(queue.ptr(), i);
    Matcher* m = tree.is_none() ? nullptr : &matcher_of(tree);
    // A StableOrder's or a DfsWeightOrder's remove called here, another order's there.
    StableOrder* kept = nullptr;
    DfsWeightOrder* dfs = nullptr;
    if (!order.is_none() && nb::isinstance<StableOrder>(order))
        kept = &nb::cast<StableOrder&>(order);
    else if (!order.is_none() && nb::isinstance<DfsWeightOrder>(order))
        dfs = &nb::cast<DfsWeightOrder&>(order);
    for (nb::handle r : taken) {
        const int64_t k = id_of(r.ptr());
        nb::object key = nb::int_(k);
        if (m != nullptr) {
            m->untrack(k);
            pop_key(fills, key.ptr());
            pop_key(reqs_of, key.ptr());
        }
        pop_key(moved, key.ptr());
        pop_key(tried, key.ptr());
        bool arrival = false;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(added.ptr()); ++i) {
            if (PyList_GET_ITEM(added.ptr(), i) == r.ptr()) {
                list_del(added.ptr(), i);
                arrival = true;
                break;
            }
        }
        if (arrival) continue;
        if (kept != nullptr) {
            kept->remove(r, nb::none());
        } else if (dfs != nullptr) {
            dfs->remove(r);
        } else if (!order.is_none()) {
            order.attr("remove")(r);
        } else if (!remove.is_none()) {
            remove(r);
        }
    }
    return taken;
}

void bind_round(nb::module_& m, TreeOf tree_of) {
    g_tree_of = tree_of;
    m.def("queue_round", &queue_round, "tree"_a, "reqs_of"_a, "queue"_a, "added"_a, "moved"_a,
          "tried"_a, "matched"_a, "dedup"_a, "deferred"_a, "order"_a.none(), "key"_a = kLpmKey,
          "plain"_a = nb::none());
    m.def("dedup_verdict",
          [](nb::handle tree, nb::handle reqs_of, bool afresh, nb::object deferred) {
              auto [d, flipped] = verdict(matcher_of(tree), reqs_of, afresh, std::move(deferred));
              return nb::make_tuple(d, flipped);
          },
          "tree"_a, "reqs_of"_a, "afresh"_a, "deferred"_a);
    m.def("touch_memos", &touch_memos, "tree"_a, "reqs"_a);
    m.def("in_sync", &in_sync, "queue"_a, "members"_a, "added"_a);
    m.def("add_tenants", &add_tenants, "into"_a, "seq"_a, "start"_a = 0);
    m.def("tenant_counts", &tenant_counts, "seq"_a);
    m.def("sort_lof", &sort_lof, "queue"_a, "params"_a);
    m.def("touch_fills", &touch_fills, "tree"_a, "ahead"_a, "head"_a, "ns_of"_a,
          "plain"_a = nb::none());
    m.def("queue_take", &queue_take, "queue"_a, "positions"_a, "tree"_a.none(), "fills"_a.none(),
          "reqs_of"_a.none(), "moved"_a, "tried"_a, "added"_a, "order"_a.none(),
          "remove"_a.none());
}

}  // namespace radixsched
