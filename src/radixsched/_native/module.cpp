// The Python binding of the native core (radixsched._native._core). Errors cross as Python
// exceptions: IntegrityFailure -> radixsched.cache.base.IntegrityError, invalid_argument ->
// ValueError, runtime_error -> RuntimeError; a Python exception raised by a listener passes
// through unchanged.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adder.hpp"
#include "arrive.hpp"
#include "chunks.hpp"
#include "compat_fill.hpp"
#include "compat_match.hpp"
#include "decode.hpp"
#include "dfs_order.hpp"
#include "bulk.hpp"
#include "dedup_bind.hpp"
#include "kv.hpp"
#include "lazy_shuffle.hpp"
#include "loop.hpp"
#include "matcher.hpp"
#include "optimal.hpp"
#include "order.hpp"
#include "prefill.hpp"
#include "prompts.hpp"
#include "trace_lines.hpp"
#include "shuffle.hpp"
#include "pool.hpp"
#include "radix.hpp"
#include "radix_match.hpp"
#include "round.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using radixsched::IntegrityFailure;
using radixsched::Node;
using radixsched::NodePtr;
using radixsched::Pool;
using radixsched::Tree;

namespace {

template <class T>
using Array = nb::ndarray<nb::numpy, T, nb::ndim<1>>;
using Tokens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Slots = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using SlotsOut = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using AnySlots = nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>;  // any shape

// A numpy array that owns `v` (the capsule frees it with the array).
template <class T>
Array<T> to_numpy(std::vector<T> v) {
    auto holder = std::make_unique<std::vector<T>>(std::move(v));
    T* data = holder->data();
    const size_t n = holder->size();
    nb::capsule owner(holder.get(),
                      [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
    holder.release();  // the capsule owns it now
    return Array<T>(data, {n}, owner);
}

template <class T, class A>
std::vector<T> from_array(const A& a) {
    const T* p = a.data();
    return std::vector<T>(p, p + a.shape(0));
}

// The interned namespaces (radixsched.native keeps the list; id 0 is the default, None).
// One reference is held for the life of the process, never released: Python objects must not
// be touched after interpreter shutdown, when statics are destroyed.
PyObject* g_namespaces = nullptr;

nb::object namespace_of(int32_t ns) {
    if (ns == 0 || g_namespaces == nullptr) return nb::none();
    return nb::borrow(PyList_GetItem(g_namespaces, ns));
}

// The Python form of a child key: the first page's bytes, or (namespace, bytes) under the root.
nb::object child_key_obj(const std::string& ck, bool top, int32_t ns) {
    if (top && ns != 0) {
        const std::string page = ck.substr(sizeof(int32_t));
        return nb::make_tuple(namespace_of(ns), nb::bytes(page.data(), page.size()));
    }
    return nb::bytes(ck.data(), ck.size());
}

nb::object handle(Node& n) { return nb::cast(n.shared_from_this()); }

nb::object subtree_key(const Node& n) {
    const Node* cur = &n;
    while (!cur->top && cur->parent != nullptr) cur = cur->parent;
    if (!cur->top) return nb::none();
    return child_key_obj(cur->child_key, true, cur->ns);
}

nb::object dict_of_children(const Node& n) {
    nb::dict d;
    for (const NodePtr& c : Tree::children_in_order(n))
        d[child_key_obj(c->child_key, c->top, c->ns)] = nb::cast(c);
    return d;
}

void bind_node(nb::module_& m) {
    nb::class_<Node>(m, "Node")
        .def_prop_ro("parent",
                     [](Node& n) -> nb::object {
                         return n.parent ? handle(*n.parent) : nb::none();
                     })
        .def_prop_rw(
            "key",
            [](const Node& n) {
                const int32_t* k = n.key.data();
                return nb::cast(to_numpy(std::vector<int32_t>(k, k + n.key.size())));
            },
            [](Node& n, Tokens a) { n.key.assign(a.data(), a.data() + a.shape(0)); })
        .def_prop_rw(
            "value", [](const Node& n) { return nb::cast(to_numpy(n.value)); },
            [](Node& n, Slots a) { n.value = from_array<int64_t>(a); })
        .def_prop_ro("value_block", [](const Node& n) { return n.value.block_size(); })
        .def_prop_ro("key_block", [](const Node& n) { return n.key.block_size(); })
        .def_rw("lock_ref", &Node::lock_ref)
        .def_rw("last_access_time", &Node::last_access_time)
        .def_rw("creation_time", &Node::creation_time)
        .def_rw("hit_count", &Node::hit_count)
        .def_rw("priority", &Node::priority)
        .def_ro("id", &Node::id)
        .def_ro("slot", &Node::slot)
        .def_prop_ro("namespace", [](const Node& n) { return namespace_of(n.ns); })
        .def_prop_ro("child_key",
                     [](const Node& n) { return child_key_obj(n.child_key, n.top, n.ns); })
        .def_prop_ro("subtree_key", &subtree_key)
        .def_prop_ro("children", &dict_of_children)
        .def("__len__", [](const Node& n) { return n.key.size(); })
        .def("__repr__", [](const Node& n) {
            return "NativeNode(id=" + std::to_string(n.id) + ", len=" +
                   std::to_string(n.key.size()) + ", lock=" + std::to_string(n.lock_ref) + ")";
        });
}

// A Tree that holds the Python objects its hooks call. They are visible to Python's garbage
// collector (tp_traverse / tp_clear below): a listener that holds the cache that holds this
// tree is a cycle the collector can break.
struct PyTree : Tree {
    using Tree::Tree;
    nb::object on_child, on_split, on_evict, host;
    // The native matcher, when one listens (it then takes the listener's hooks).
    std::unique_ptr<radixsched::Matcher> matcher;

    void clear_hooks() {
        matcher.reset();
        events = radixsched::Events{};
        on_child = on_split = on_evict = host = nb::object();
    }

    radixsched::Matcher& the_matcher() {
        if (!matcher) throw std::runtime_error("no native matcher listens to this tree");
        return *matcher;
    }
};

nb::object memo_tuple(const radixsched::Memo* m) {
    if (m == nullptr) return nb::none();
    return nb::make_tuple(m->n, m->node, m->offset, m->full);
}

void matcher_on(PyTree& t) {
    nb::object host = t.host;
    auto host_hook = std::move(t.events.host_evict);
    t.clear_hooks();
    t.host = host;
    t.events.host_evict = std::move(host_hook);
    t.matcher = std::make_unique<radixsched::Matcher>(t);
}

// A request's fill as NativeMatcher.track takes it (its prompt while it has no output, else
// `fill_ids()`), kept in `fill` (as `as_tokens` gives it unless it is a C-contiguous int32
// array already) and viewed by `tok`; its fields read as getattr reads them (compat::Attr).
void fill_into(radixsched::compat::Names& a, nb::handle r, nb::handle as_tokens,
               nb::object& fill, Tokens& tok) {
    fill = nb::len(a.output_ids.get(r)) == 0 ? a.prompt_ids.get(r)
                                             : nb::object(r.attr("fill_ids")());
    if (!nb::try_cast<Tokens>(fill, tok, false)) {
        fill = as_tokens(fill);
        tok = nb::cast<Tokens>(fill, false);
    }
}

// namespace_id(r.namespace), r.namespace being None exactly when both its parts are (asked of
// Python only then); `none_ns` keeps namespace_id(None), asked once.
int32_t ns_id_of(radixsched::compat::Names& a, nb::handle r, nb::handle namespace_id,
                 nb::object& none_ns) {
    const bool plain_ns = a.extra_key.get(r).is_none() && a.cache_salt.get(r).is_none();
    if (plain_ns && !none_ns.is_valid()) none_ns = namespace_id(nb::none());
    return nb::cast<int32_t>(plain_ns ? none_ns : namespace_id(r.attr("namespace")));
}

// NativeMatcher.track of each of `reqs` in order (its keys off), in one call: each request's
// fill (its prompt while it has no output, else `fill_ids()`), as `as_tokens` gives it
// unless it is a C-contiguous int32 array already, kept in `fills` under id(r); r moved to the
// end of `reqs_of`; then tracked under namespace_id(r.namespace) and its stamps. Returns each
// memo's matched length. `namespace_id` is asked once for the default namespace. The
// request's fields are read as getattr reads them (compat::Attr: a slot's member directly).
nb::list track_many(PyTree& t, nb::handle reqs, nb::handle fills, nb::handle reqs_of,
                    nb::handle as_tokens, nb::handle namespace_id) {
    radixsched::Matcher& m = t.the_matcher();
    if (!PyDict_CheckExact(fills.ptr()) || !PyDict_CheckExact(reqs_of.ptr()))
        throw std::invalid_argument("track_many: fills and reqs_of must be dicts");
    radixsched::compat::Names& a = radixsched::compat::names();
    nb::list out;
    nb::object none_ns;  // namespace_id(None), asked once
    for (nb::handle r : reqs) {
        const nb::object k = nb::steal(PyLong_FromVoidPtr(r.ptr()));
        nb::object fill;
        Tokens tok;
        fill_into(a, r, as_tokens, fill, tok);
        if (PyDict_SetItem(fills.ptr(), k.ptr(), fill.ptr()) < 0) throw nb::python_error();
        const int has = PyDict_Contains(reqs_of.ptr(), k.ptr());
        if (has < 0 || (has == 1 && PyDict_DelItem(reqs_of.ptr(), k.ptr()) < 0) ||
            PyDict_SetItem(reqs_of.ptr(), k.ptr(), r.ptr()) < 0)
            throw nb::python_error();
        const int32_t ns = ns_id_of(a, r, namespace_id, none_ns);
        const auto entry = nb::cast<double>(a.queue_entry_time.get(r));
        const auto arrival = nb::cast<double>(a.arrival_time.get(r));
        nb::object rid = a.rid.get(r);
        auto rep = m.has_dedup() ? radixsched::rep_inputs(entry, arrival, rid)
                                 : radixsched::RepInputs{};
        out.append(m.track(nb::cast<int64_t>(k), tok.data(), tok.shape(0), ns, std::move(rep)).n);
    }
    return out;
}

// [t.match_len(as_tokens(r.fill_ids()), namespace_id(r.namespace)) for r in reqs] in one call
// (the door's read-only match of a batch without a matcher: no side effects), each fill and
// namespace read as track_many reads them (fill_into, ns_id_of).
nb::list match_lens(PyTree& t, nb::handle reqs, nb::handle as_tokens, nb::handle namespace_id) {
    radixsched::compat::Names& a = radixsched::compat::names();
    nb::list out;
    nb::object none_ns;  // namespace_id(None), asked once
    for (nb::handle r : reqs) {
        nb::object fill;
        Tokens tok;
        fill_into(a, r, as_tokens, fill, tok);
        const int32_t ns = ns_id_of(a, r, namespace_id, none_ns);
        out.append(t.match_len(tok.data(), tok.shape(0), ns));
    }
    return out;
}

void bind_matcher(nb::class_<PyTree>& c) {
    c.def("matcher_on", &matcher_on)
        .def("track",
             [](PyTree& t, int64_t k, Tokens tok, int32_t ns, double entry, double arrival,
                nb::handle rid) {
                 radixsched::Matcher& m = t.the_matcher();  // the dedup's inputs, when it is on
                 auto rep = m.has_dedup() ? radixsched::rep_inputs(entry, arrival, rid)
                                          : radixsched::RepInputs{};
                 return memo_tuple(&m.track(k, tok.data(), tok.shape(0), ns, std::move(rep)));
             },
             "k"_a, "tokens"_a, "ns"_a, "entry"_a = 0.0, "arrival"_a = 0.0,
             "rid"_a = nb::none())
        .def("track_many", &track_many, "reqs"_a, "fills"_a, "reqs_of"_a, "as_tokens"_a,
             "namespace_id"_a)
        .def("match_lens", &match_lens, "reqs"_a, "as_tokens"_a, "namespace_id"_a)
        .def("untrack", [](PyTree& t, int64_t k) { t.the_matcher().untrack(k); })
        .def("refresh", [](PyTree& t) { return t.the_matcher().refresh(); })
        .def("memo", [](PyTree& t, int64_t k) { return memo_tuple(t.the_matcher().memo(k)); })
        .def("is_dirty", [](PyTree& t, int64_t k) { return t.the_matcher().is_dirty(k); })
        .def("any_dirty", [](PyTree& t) { return t.the_matcher().any_dirty(); })
        .def("dirty_keys", [](PyTree& t) { return t.the_matcher().dirty_keys(); })
        .def("matcher_reset", [](PyTree& t) { t.the_matcher().on_reset(); });
}

int tree_traverse(PyObject* self, visitproc visit, void* arg) {
    Py_VISIT(Py_TYPE(self));
    if (!nb::inst_ready(self)) return 0;
    PyTree* t = nb::inst_ptr<PyTree>(self);
    Py_VISIT(t->on_child.ptr());
    Py_VISIT(t->on_split.ptr());
    Py_VISIT(t->on_evict.ptr());
    Py_VISIT(t->host.ptr());
    return 0;
}

int tree_clear(PyObject* self) {
    nb::inst_ptr<PyTree>(self)->clear_hooks();
    return 0;
}

PyType_Slot tree_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(tree_traverse)},
                            {Py_tp_clear, reinterpret_cast<void*>(tree_clear)},
                            {0, nullptr}};

void set_listener(PyTree& t, nb::object listener) {
    nb::object host = t.host;
    auto host_hook = std::move(t.events.host_evict);
    t.clear_hooks();
    t.host = host;
    t.events.host_evict = std::move(host_hook);
    if (listener.is_none()) return;
    t.on_child = listener.attr("on_child");
    t.on_split = listener.attr("on_split");
    t.on_evict = listener.attr("on_evict");
    PyTree* tp = &t;
    t.events.on_child = [tp](Node& parent, const std::string& ck) {
        const bool top = &parent == tp->root().get();
        int32_t ns = 0;
        if (top && ck.size() > static_cast<size_t>(tp->page_size()) * sizeof(int32_t))
            std::memcpy(&ns, ck.data(), sizeof(int32_t));
        tp->on_child(handle(parent), child_key_obj(ck, top, ns));
    };
    t.events.on_split = [tp](Node& upper, Node& lower) {
        tp->on_split(handle(upper), handle(lower));
    };
    t.events.on_evict = [tp](Node& leaf, int64_t keep) { tp->on_evict(handle(leaf), keep); };
}

void set_host_evict(PyTree& t, nb::object fn) {
    t.host = nb::object();
    t.events.host_evict = nullptr;
    if (fn.is_none()) return;
    t.host = fn;
    PyTree* tp = &t;
    t.events.host_evict = [tp](const std::vector<int32_t>& path, int32_t ns, int64_t n) {
        tp->host(to_numpy(path), ns, n);
    };
}

nb::list segments(std::vector<std::vector<int64_t>> segs) {
    nb::list out;
    for (auto& s : segs) out.append(to_numpy(std::move(s)));
    return out;
}

nb::object prefix_slots(PyTree& t, Node& node, int64_t length, nb::object out) {
    if (out.is_none()) {
        std::vector<int64_t> v(static_cast<size_t>(length));
        t.prefix_slots(node, length, v.data());
        return nb::cast(to_numpy(std::move(v)));
    }
    auto arr = nb::cast<SlotsOut>(out);
    if (static_cast<int64_t>(arr.shape(0)) != length)
        throw std::invalid_argument("prefix_slots: out holds " + std::to_string(arr.shape(0)) +
                                    " slots for " + std::to_string(length) + " tokens");
    t.prefix_slots(node, length, arr.data());
    return out;
}

nb::list dfs_order(PyTree& t, nb::handle ends) {
    std::vector<std::pair<Node*, int64_t>> v;
    for (nb::handle item : ends) {
        nb::handle node = item[0];
        Node* p = node.is_none() ? nullptr : nb::cast<Node*>(node);
        v.emplace_back(p, nb::cast<int64_t>(item[1]));
    }
    nb::list out;
    for (int64_t i : t.dfs_weight_order_at(v)) out.append(i);
    return out;
}

// The KV accounting around the tree (kv.hpp): the accelerated KV manager's hot calls.
void bind_tree_kv(nb::class_<PyTree>& c) {
    c.def(
         "alloc_into",
         [](PyTree& t, Pool& pool, SlotsOut out) {
             return radixsched::alloc_evicting(t, pool, out.data(),
                                               static_cast<int64_t>(out.shape(0)));
         },
         "pool"_a, "out"_a.noconvert())
        .def(
            "evict_free",
            [](PyTree& t, Pool& pool, int64_t n) { return radixsched::evict_free(t, pool, n); },
            "pool"_a, "num_tokens"_a)
        .def(
            "checkpoint",
            [](PyTree& t, Pool& pool, Tokens tok, int64_t start, int32_t ns, SlotsOut row,
               int64_t lo, int64_t aligned, int64_t priority, int64_t inserted_len,
               Node* lock) -> nb::object {
                const radixsched::Checkpoint c{
                    tok.data(), static_cast<int64_t>(tok.shape(0)), start, ns, row.data(),
                    static_cast<int64_t>(row.shape(0)), lo, aligned, priority, inserted_len,
                    lock};
                NodePtr node = radixsched::checkpoint(t, pool, c);
                return node ? nb::cast(node) : nb::none();
            },
            "pool"_a, "tokens"_a, "start"_a, "ns"_a, "row"_a.noconvert(), "lo"_a, "aligned"_a,
            "priority"_a, "inserted_len"_a, "lock"_a.none());
}

std::invalid_argument negative_alloc(int64_t n, const Pool& p) {  // TokenAllocator's message
    return std::invalid_argument("alloc(" + std::to_string(n) +
                                 "): must be a non-negative multiple of page_size (" +
                                 std::to_string(p.page_size()) + ")");
}

void pool_free(Pool& p, AnySlots slots, bool checked) {
    const auto n = static_cast<int64_t>(slots.size());
    if (slots.ndim() != 1 && n != 0)  // TokenAllocator's message for a non-row
        throw std::invalid_argument("free: " + std::to_string(n) +
                                    " slots is not a whole number of pages (p=" +
                                    std::to_string(p.page_size()) + ")");
    p.free(slots.data(), n, checked);
}

std::vector<std::vector<int64_t>> segments_of(nb::handle freed) {
    std::vector<std::vector<int64_t>> segs;
    for (nb::handle seg : freed) segs.push_back(from_array<int64_t>(nb::cast<Slots>(seg)));
    return segs;
}

// check_conservation's count, all a counting pool can check: free + cache + requests == total
// (IntegrityFailure otherwise). `request_slots`: one array, or a sequence of them.
void pool_conserved(const Pool& p, nb::handle cache_slots, nb::handle request_slots) {
    const int64_t cache = cache_slots.is_none() ? 0 : static_cast<int64_t>(nb::len(cache_slots));
    int64_t req = 0;
    if (nb::hasattr(request_slots, "dtype"))
        req = static_cast<int64_t>(nb::len(request_slots));
    else
        for (nb::handle r : request_slots) req += static_cast<int64_t>(nb::len(r));
    const int64_t free = p.available_size() + p.reserved_size();
    if (free + cache + req != p.total_size())
        throw radixsched::IntegrityFailure(
            "KV slot conservation violated: free " + std::to_string(free) + " + cache " +
            std::to_string(cache) + " + requests " + std::to_string(req) + " != total " +
            std::to_string(p.total_size()));
}

// The KV slot pool (pool.hpp), with TokenAllocator's Python face.
void bind_pool(nb::module_& m) {
    nb::class_<Pool>(m, "Pool")
        .def(nb::init<int64_t, int64_t, bool>(), "size"_a, "page_size"_a = 1, "counting"_a = false)
        .def_prop_ro("page_size", &Pool::page_size)
        .def_prop_ro("counting", &Pool::counting)
        .def_prop_ro("num_pages", &Pool::num_pages)
        .def_prop_ro("total_size", &Pool::total_size)
        .def_prop_ro("pool_size", &Pool::pool_size)
        .def("available_size", &Pool::available_size)
        .def("reserved_size", &Pool::reserved_size)
        .def("reset", &Pool::reset)
        .def("alloc",
             [](Pool& p, int64_t n) -> nb::object {
                 if (n < 0) throw negative_alloc(n, p);
                 std::vector<int64_t> out(static_cast<size_t>(n));
                 if (!p.alloc_into(out.data(), n)) return nb::none();
                 return nb::cast(to_numpy(std::move(out)));
             })
        .def("alloc_into",
             [](Pool& p, SlotsOut out) {
                 return p.alloc_into(out.data(), static_cast<int64_t>(out.shape(0)));
             },
             "out"_a.noconvert())
        .def("free", &pool_free, "slots"_a, nb::kw_only(), "checked"_a = true)
        .def(  // anything else numpy reads as integers (a list): converted first
            "free",
            [](Pool& p, nb::handle slots, bool checked) {
                nb::object a = nb::module_::import_("numpy").attr("ascontiguousarray")(
                    slots, "dtype"_a = "int64");
                pool_free(p, nb::cast<AnySlots>(a), checked);
            },
            "slots"_a, nb::kw_only(), "checked"_a = true)
        .def("recycle_into",
             [](Pool& p, nb::handle freed, SlotsOut out) {
                 return p.recycle_into(segments_of(freed), out.data(),
                                       static_cast<int64_t>(out.shape(0)));
             },
             "freed"_a, "out"_a.noconvert())
        .def("recycle",
             [](Pool& p, nb::handle freed, int64_t n) -> nb::object {
                 if (n < 0) throw negative_alloc(n, p);
                 std::vector<std::vector<int64_t>> segs;
                 if (nb::isinstance<Slots>(freed))
                     segs.push_back(from_array<int64_t>(nb::cast<Slots>(freed)));
                 else
                     segs = segments_of(freed);
                 std::vector<int64_t> out(static_cast<size_t>(n));
                 if (!p.recycle_into(segs, out.data(), n)) return nb::none();
                 return nb::cast(to_numpy(std::move(out)));
             })
        .def("reserve", &Pool::reserve)
        .def("claim", [](Pool& p, int64_t n) { return to_numpy(p.claim(n)); })
        .def("free_slots", [](const Pool& p) { return to_numpy(p.free_slots()); })
        .def(
            "check_integrity",
            [](const Pool& p, nb::object cache_slots, nb::object request_slots) {
                p.check_free_list();
                if (p.counting()) {  // no slots to tell apart: free + cache + requests == total
                    pool_conserved(p, cache_slots, request_slots);
                    return;
                }
                nb::module_::import_("radixsched.cache.allocator")
                    .attr("check_conservation")(to_numpy(p.free_slots()), cache_slots,
                                                request_slots, p.page_size(), p.pool_size(),
                                                p.total_size());
            },
            nb::kw_only(), "cache_slots"_a = nb::none(), "request_slots"_a = nb::tuple())
        .def("__repr__", [](const Pool& p) {
            return "NativePool(total=" + std::to_string(p.total_size()) + ", page_size=" +
                   std::to_string(p.page_size()) + ", available=" +
                   std::to_string(p.available_size()) + ")";
        });
}

void bind_tree(nb::module_& m) {
    nb::class_<PyTree> tree(m, "Tree", nb::type_slots(tree_slots));
    bind_matcher(tree);
    radixsched::bind_dedup(tree);
    tree.def(
            "__init__",
            [](PyTree* t, int64_t page, const std::string& policy, int64_t slru, bool disabled,
               bool compat, bool counting) {
                new (t) PyTree(page, radixsched::strategy_from_name(policy), slru, disabled,
                             compat, counting);
            },
            "page_size"_a, "policy"_a, "slru_threshold"_a, "disabled"_a, "compat_sglang"_a,
            "counting"_a = false)
        .def_prop_ro("root", [](PyTree& t) { return t.root(); })
        .def_prop_ro("counting", &Tree::counting)
        .def_prop_ro("clock", &Tree::clock)
        .def_rw("heap_persistent", &Tree::heap_persistent)
        .def("set_listener", &set_listener, "listener"_a.none())
        .def("set_host_evict", &set_host_evict, "fn"_a.none())
        .def("walk",
             [](PyTree& t, Tokens tok, int32_t ns, bool collect) {
                 std::vector<int64_t> values;
                 auto r = t.walk(tok.data(), tok.shape(0), ns, collect ? &values : nullptr);
                 return nb::make_tuple(r.node, r.length, to_numpy(std::move(values)));
             })
        .def("match_prefix",
             [](PyTree& t, nb::handle tok, int32_t ns, nb::handle result) {
                 return radixsched::match_prefix(t, tok, ns, result);
             })
        .def("match_key", [](PyTree& t, nb::handle key) { return radixsched::match_key(t, key); })
        .def("touch_keys", [](PyTree& t, nb::handle keys) { radixsched::touch_keys(t, keys); })
        .def("walk_node",
             [](PyTree& t, nb::handle tok, int32_t ns) { return radixsched::walk_node(t, tok, ns); })
        .def("match_len",
             [](PyTree& t, Tokens tok, int32_t ns) { return t.match_len(tok.data(), tok.shape(0), ns); })
        .def("match_end",
             [](PyTree& t, Tokens tok, int32_t ns, Node* start, int64_t depth) {
                 auto r = t.match_end(tok.data(), tok.shape(0), ns, start, depth);
                 return nb::make_tuple(r.length, r.node, r.offset);
             },
             "tokens"_a, "ns"_a, "start"_a.none(), "depth"_a)
        .def("touch_at", &Tree::touch_at)
        .def("prefix_slots", &prefix_slots, "node"_a, "length"_a, "out"_a.none())
        .def("insert",
             [](PyTree& t, Tokens tok, int32_t ns, Slots values, int64_t priority,
                int64_t inserted_len, Node* start, int64_t depth, int64_t base) {
                 auto r = t.insert(tok.data(), tok.shape(0), ns, values.data(), values.shape(0),
                                   priority, inserted_len, start, depth, base);
                 return nb::make_tuple(r.length, r.node);
             },
             "tokens"_a, "ns"_a, "values"_a, "priority"_a, "inserted_len"_a, "start"_a.none(),
             "depth"_a, "base"_a)
        .def("inc_lock_ref", &Tree::inc_lock_ref)
        .def("dec_lock_ref", &Tree::dec_lock_ref)
        .def("move_lock", &Tree::move_lock, "old"_a.none(), "node"_a)
        .def("evict", [](PyTree& t, int64_t n) { return segments(t.evict(n)); })
        .def("evict_flat", [](PyTree& t, int64_t n) { return to_numpy(t.evict_flat(n)); })
        .def("reset", [](PyTree& t) { return to_numpy(t.reset()); })
        .def("evictable_size", &Tree::evictable_size)
        .def("protected_size", &Tree::protected_size)
        .def("num_evictable_leaves", &Tree::num_evictable_leaves)
        .def("nodes", &Tree::nodes)
        .def("all_values", [](const PyTree& t) { return to_numpy(t.all_values()); })
        .def("dfs_weight_order_at", &dfs_order)
        .def("check_integrity", &Tree::check_integrity)
        .def("add_evictable_size", &Tree::add_evictable_size)
        .def("leaf_set", &Tree::leaf_set)
        .def("leaf_member", &Tree::leaf_member);
    bind_tree_kv(tree);
}

}  // namespace

NB_MODULE(_core, m) {
    m.doc() = "radixsched's native scheduling core (see radixsched.native)";
    // The radixsched program freezes its heap before it exits (cli/main.py: the shutdown then
    // skips walking every object for cycles), so trees, pools and orders still alive are not
    // collected at teardown by design: nanobind's count of such instances is no leak.
    nb::set_leak_warnings(false);
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const IntegrityFailure& e) {
            nb::object cls = nb::module_::import_("radixsched.cache.base").attr("IntegrityError");
            PyErr_SetString(cls.ptr(), e.what());
        }
    });
    m.def("set_match_types", &radixsched::set_match_types);
    m.def("set_namespaces", [](nb::list table) {
        if (g_namespaces != nullptr) throw std::runtime_error("namespaces already set");
        g_namespaces = table.inc_ref().ptr();
    });
    bind_node(m);
    bind_pool(m);
    bind_tree(m);
    radixsched::bind_order(m);
    bind_decode(m);
    bind_prefill(m);
    radixsched::bind_chunks(m);
    radixsched::bind_prompts(m);
    radixsched::bind_trace_lines(m);
    radixsched::bind_bulk(m);
    radixsched::bind_optimal(m);
    radixsched::bind_shuffle(m);
    radixsched::bind_lazy_shuffle(m);
    radixsched::bind_loop(m);
    radixsched::bind_arrive(m);
    radixsched::bind_adder(m, [](nb::handle h) {  // a Python Tree's native tree and matcher
        auto& t = nb::cast<PyTree&>(h);
        return std::pair<Tree*, radixsched::Matcher*>(&t, t.matcher.get());
    });
    radixsched::bind_round(m, [](nb::handle h) {  // the queue's round, the same resolver
        auto& t = nb::cast<PyTree&>(h);
        return std::pair<Tree*, radixsched::Matcher*>(&t, t.matcher.get());
    });
    radixsched::bind_dfs_order(m, [](nb::handle h) {  // dfs-weight's kept order, the same
        auto& t = nb::cast<PyTree&>(h);
        return std::pair<Tree*, radixsched::Matcher*>(&t, t.matcher.get());
    });
    radixsched::bind_compat_match(m, [](nb::handle h) -> Tree* { return &nb::cast<PyTree&>(h); });
    radixsched::bind_compat_round(m, [](nb::handle h) {  // SGLang's compat round, the same
        auto& t = nb::cast<PyTree&>(h);
        return std::pair<Tree*, radixsched::Matcher*>(&t, t.matcher.get());
    });
}
