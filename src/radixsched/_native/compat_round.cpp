// See compat_round.hpp. Bit for bit the reference round: a walk's effects are a touch's where
// the walk ends (Tree::touch_at: the same tick, path touched and split); the fields set are
// compat_match.cpp's (the same per-request code); a kept record (CompatKeys) holds what the
// request's fill gave at its track, and the matcher's contract (a tracked request's fill does
// not change until it is tracked again) keeps it current; the dedup decides in list order as
// the reference's groups do (a group's first member is the first candidate of it in list
// order, wherever the dedup runs); and the sort is stable over keys whose comparisons are
// Python's: a bool, an int, and a double that is an exact copy of a float or of an int within
// 2**53 (no NaN), compared element by element, so std::stable_sort gives list.sort's order.
#include "compat_round.hpp"

#include <nanobind/stl/shared_ptr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "compat_fill.hpp"
#include "id_map.hpp"
#include "matcher.hpp"
#include "py_attr.hpp"
#include "radix.hpp"
#include "radix_match.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

enum Order : int { kNone = 0, kSpf = 1, kDfs = 2 };

// One request of the round: what its match left, for the dedup and the order.
struct Entry {
    nb::object req;
    int64_t work = 0;       // prefill_work: max(1, fill_len - num_matched_prefix_tokens)
    NodePtr node;           // where its match ends (held: a later walk may split it)
    int64_t node_len = 0;   // len(node) just after its walk
};

// What the round reads of each tracked request's fill, kept from its track (see
// compat_round.hpp): its length, namespace and first `width` tokens.
class CompatKeys {
public:
    struct Rec {
        int64_t fill_len = 0;
        nb::object ns;  // Req.namespace: None or (extra_key, cache_salt)
        std::vector<int32_t> head;  // the fill's first min(width, fill_len) tokens
        uint64_t hash = 0;  // compat::head_hash(head, width) where the fill has width tokens
    };
    explicit CompatKeys(int64_t width) : width_(std::max<int64_t>(width, 0)) {}
    void put(int64_t k, nb::handle fill, nb::object ns) {
        const TokenView t(fill);
        Rec& r = recs_.try_emplace(k);
        r.fill_len = t.size();
        r.ns = std::move(ns);
        r.head.assign(t.data(), t.data() + std::min(width_, t.size()));
        r.hash = r.fill_len >= width_ ? compat::head_hash(r.head.data(), width_) : 0;
    }
    void drop(int64_t k) { recs_.erase(k); }
    const Rec* find(int64_t k) const { return recs_.find(k); }
    int64_t width() const { return width_; }
    size_t size() const { return recs_.size(); }

private:
    int64_t width_;
    IdMap<Rec> recs_;
};

int64_t id_of(nb::handle r) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(r.ptr())); }

// A tracked request's node matching from its memo (the match is current: the walk would end
// there): Tree::touch_at where it ends does what the walk does to the tree (the same tick, the
// same nodes touched, the same split) and gives the node the walk gives; the request's fields
// set as compat::match_node sets them (ints, the node's own object), each left as it is where
// it holds that value already (a request waiting round after round mostly keeps its match).
// `matched`: min(memo.n, fill_len - 1). The match's node and length are given as its walk's
// (its Python objects, not read by the round, are not made).
compat::NodeMatch match_memo(compat::Names& k, Tree& tree, const Memo& memo, nb::handle req,
                             int64_t matched) {
    const int64_t n = memo.n;  // read before the touch: its split re-points the memo
    compat::NodeMatch m{WalkResult{nullptr, n}, nb::object(), nb::object(), matched};
    m.walk.node = tree.touch_at(*memo.node, memo.full ? memo.node->size() : memo.offset);
    k.prefix_len.set_int(req, n);
    static PyTypeObject* const node_type = reinterpret_cast<PyTypeObject*>(nb::type<Node>().ptr());
    PyObject* last = k.last_node.peek(req);  // a Node's own object: the same node
    const bool same = last != nullptr && Py_TYPE(last) == node_type &&
                      nb::inst_ptr<Node>(nb::handle(last)) == m.walk.node.get();
    if (!same) k.last_node.set(req, nb::cast(m.walk.node));
    k.host_hit_len.set_int(req, 0);
    k.num_matched.set_int(req, matched);
    return m;
}

// The round's state through its matching: the tree (and its matcher, null when none
// listens), the dedup's groups, and the duplicates' rids.
struct Matching {
    Tree& tree;
    Matcher* matcher;
    const CompatKeys* keys;  // null: none kept (every fill read from its request)
    bool disabled;
    nb::handle namespace_id;
    bool dedup;
    int64_t check;
    int64_t threshold;
    int order;
    compat::DedupGroups groups;
    nb::list dup;
    std::vector<int32_t> joined;
};

// One request matched (from its memo when it is tracked and current, else by its walk) and,
// with the dedup on, judged.
Entry match_one(Matching& s, nb::object req) {
    compat::Names& k = compat::names();
    Matcher::Tracked t;  // (memo null: not tracked, or no matcher reads it)
    const int64_t key = id_of(req);
    if (s.matcher != nullptr && !s.disabled) {
        if (s.matcher->any_dirty()) s.matcher->refresh();  // (a touch's split re-points memos)
        t = s.matcher->tracked(key);
    }
    const Memo* memo = t.memo;
    // Kept keys, when on, hold a record of every tracked request, made from the fill it was
    // tracked with (NativeMatcher.track puts both): its fill_len is the matcher's.
    const bool kept = memo != nullptr && s.keys != nullptr;
    std::optional<TokenView> prompt;
    compat::Fill f;
    compat::NodeMatch m;
    if (memo != nullptr) {
        if (kept || s.order != kSpf) {  // the fill it was tracked with (unchanged since)
            f.n = t.fill_len;
        } else {  // spf's key reads fill_len
            nb::object outs = k.output_ids.get(req);
            f.n = py::len_of(k.prompt_ids.get(req)) + py::len_of(outs);
        }
        m = match_memo(k, s.tree, *memo, req, std::min(memo->n, f.n - 1));
    } else {
        prompt.emplace(k.prompt_ids.get(req));  // its buffer holds the array
        f = compat::fill_of(*prompt, req, s.joined);
        m = compat::match_node(s.tree, req, f, s.disabled, s.namespace_id);
    }
    if (s.dedup && m.walk.length <= s.check) {  // a candidate
        bool dup = s.threshold <= 0;
        const CompatKeys::Rec* rec = dup || !kept ? nullptr : s.keys->find(key);
        if (!dup && rec != nullptr) {
            dup = rec->fill_len >= s.threshold &&
                  s.groups.duplicate_at(rec->ns, rec->head.data(), rec->hash);
        } else if (!dup) {
            if (!prompt) {
                prompt.emplace(k.prompt_ids.get(req));
                f = compat::fill_of(*prompt, req, s.joined);
            }
            dup = s.groups.duplicate(req, f);
        }
        if (dup) s.dup.append(k.rid.get(req));
    }
    const int64_t node_len = m.walk.node->size();
    return Entry{std::move(req), std::max<int64_t>(1, f.n - m.matched), std::move(m.walk.node),
                 node_len};
}

// Steps 1 and 2 (see compat_round.hpp): every request matched, in list order; the duplicates'
// rids appended to `s.dup`.
std::vector<Entry> match_and_dedup(Matching& s, nb::list reqs) {
    if (s.matcher != nullptr && s.matcher->any_dirty()) s.matcher->refresh();
    std::vector<Entry> out;
    out.reserve(nb::len(reqs));
    if (s.dedup && s.threshold > 0) s.groups.reserve(nb::len(reqs));
    for (size_t i = 0; i < nb::len(reqs); ++i)  // as `for r in reqs` reads a list
        out.push_back(match_one(s, reqs[i]));
    return out;
}

// A queue_entry_time as the double Python compares it as; false where it is not one exactly.
bool exact_time(nb::handle t, double& out) {
    PyObject* p = t.ptr();
    if (PyFloat_CheckExact(p)) {
        out = PyFloat_AS_DOUBLE(p);
        return !std::isnan(out);
    }
    if (!PyLong_CheckExact(p)) return false;
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    constexpr long long kExact = 1LL << 53;
    if (overflow != 0 || v > kExact || v < -kExact) return false;
    out = static_cast<double>(v);
    return true;
}

// spf_sglang's stable sort: the permutation, or false (see compat_round.hpp).
bool spf_order(const std::vector<Entry>& entries, nb::handle deferred,
               std::vector<int64_t>& perm) {
    struct Key {
        bool deferred;
        int64_t work;
        double entry;
    };
    compat::Names& k = compat::names();
    const bool any = PySet_GET_SIZE(deferred.ptr()) > 0;
    std::vector<Key> keys;
    keys.reserve(entries.size());
    for (const Entry& e : entries) {
        Key key{false, e.work, 0.0};
        if (any) {  // `r.rid in rnd.deferred`, as the frozenset answers it
            const int in = PySet_Contains(deferred.ptr(), k.rid.get(e.req).ptr());
            if (in < 0) throw nb::python_error();
            key.deferred = in == 1;
        }
        if (!exact_time(k.queue_entry_time.get(e.req), key.entry)) return false;
        keys.push_back(key);
    }
    perm.resize(keys.size());
    std::iota(perm.begin(), perm.end(), int64_t{0});
    std::stable_sort(perm.begin(), perm.end(), [&keys](int64_t a, int64_t b) {
        const Key &x = keys[static_cast<size_t>(a)], &y = keys[static_cast<size_t>(b)];
        if (x.deferred != y.deferred) return x.deferred < y.deferred;
        if (x.work != y.work) return x.work < y.work;
        return x.entry < y.entry;
    });
    return true;
}

// `reqs[:] = [entries[i].req for i in perm]` (the list is the one the round read): an item
// already in its place (the same object) is left there, the others set.
void reorder(nb::list reqs, const std::vector<Entry>& entries, const std::vector<int64_t>& perm) {
    const auto n = static_cast<size_t>(PyList_GET_SIZE(reqs.ptr()));
    if (n != entries.size() || perm.size() != n)
        throw std::runtime_error("compat_round: the waiting list changed during its round");
    for (size_t i = 0; i < n; ++i) {
        const nb::object& r = entries.at(static_cast<size_t>(perm[i])).req;
        if (PyList_GET_ITEM(reqs.ptr(), static_cast<Py_ssize_t>(i)) == r.ptr()) continue;
        PyList_SetItem(reqs.ptr(), static_cast<Py_ssize_t>(i), nb::object(r).release().ptr());
    }
}

nb::tuple compat_round(Tree& tree, Matcher* matcher, nb::list reqs, nb::handle keys,
                       bool disabled, nb::handle namespace_id, bool dedup, int64_t check,
                       int64_t threshold, int order) {
    if (order != kNone && order != kSpf && order != kDfs)
        throw nb::value_error("compat_round: order is 0 (none), 1 (spf) or 2 (dfs-weight)");
    const CompatKeys* kept = keys.is_none() ? nullptr : nb::cast<const CompatKeys*>(keys);
    if (kept != nullptr && threshold > 0 && kept->width() != threshold)
        throw nb::value_error("compat_round: the kept keys' width is not the threshold");
    Matching s{tree,      matcher, kept,  disabled, namespace_id, dedup, check,
               threshold, order,   compat::DedupGroups(threshold), nb::list(), {}};
    const std::vector<Entry> entries = match_and_dedup(s, reqs);
    nb::list& dup = s.dup;
    nb::object deferred = nb::steal(PyFrozenSet_New(dup.ptr()));
    if (!deferred.is_valid()) throw nb::python_error();
    std::vector<int64_t> perm;
    if (order == kSpf) {
        if (!spf_order(entries, deferred, perm)) return nb::make_tuple(deferred, false);
    } else if (order == kDfs) {
        std::vector<std::pair<Node*, int64_t>> ends;
        ends.reserve(entries.size());
        for (const Entry& e : entries) ends.emplace_back(e.node.get(), e.node_len);
        perm = tree.dfs_weight_order_at(ends);
    } else {
        return nb::make_tuple(deferred, true);
    }
    reorder(reqs, entries, perm);
    return nb::make_tuple(deferred, true);
}

}  // namespace

void bind_compat_round(nb::module_& m, std::pair<Tree*, Matcher*> (*tree_of)(nb::handle)) {
    static auto* resolve = tree_of;
    nb::class_<CompatKeys>(m, "CompatKeys",
                           "What compat_round reads of each tracked request's fill.")
        .def(nb::init<int64_t>(), "width"_a)
        .def("put", &CompatKeys::put, "k"_a, "fill"_a, "ns"_a.none())
        .def("drop", &CompatKeys::drop, "k"_a)
        .def("__len__", &CompatKeys::size);
    m.def(
        "compat_round",
        [](nb::handle tree, nb::list reqs, nb::handle keys, bool disabled,
           nb::handle namespace_id, bool dedup, int64_t check, int64_t threshold, int order) {
            auto [t, matcher] = resolve(tree);
            return compat_round(*t, matcher, std::move(reqs), keys, disabled, namespace_id,
                                dedup, check, threshold, order);
        },
        "tree"_a, "reqs"_a, "keys"_a.none(), "disabled"_a, "namespace_id"_a, "dedup"_a,
        "check"_a, "threshold"_a, "order"_a,
        "SGLang's compat round of spf or dfs-weight in one call (see compat_round.hpp).");
}

}  // namespace radixsched
