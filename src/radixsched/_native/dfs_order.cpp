// See dfs_order.hpp. Bit for bit what native/orders.py's former Python DfsWeightEngine did: the
// same base (the deepest node on every member's path, the root when that path is the root
// alone), the same segments (Tree::dfs_weight_order_at over a child's members, the old ones
// in list order, then the arrivals), the same keys (ints, compared as Python compares them)
// handed to the same StableOrder calls, and the same fallbacks to a rebuild.
#include "dfs_order.hpp"

#include <nanobind/stl/shared_ptr.h>

#include <algorithm>
#include <stdexcept>

#include "matcher.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {

namespace {

TreeOf g_tree_of = nullptr;

void check(int rc) {
    if (rc < 0) throw nb::python_error();
}

int64_t id_of(PyObject* r) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(r)); }

Atom int_atom(int64_t v) {
    Atom a;
    a.kind = Atom::Int;
    a.i = v;
    return a;
}

// A list's items (borrowed: the list must not change while they are read).
std::vector<PyObject*> items_of(nb::handle list) {
    if (!PyList_Check(list.ptr())) throw nb::type_error("DfsWeightOrder: a list expected");
    const Py_ssize_t n = PyList_GET_SIZE(list.ptr());
    std::vector<PyObject*> out(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = PyList_GET_ITEM(list.ptr(), i);
    return out;
}

bool is_deferred(PyObject* r, nb::handle deferred) {  // r.rid in deferred
    static PyObject* const rid = [] {
        PyObject* s = PyUnicode_InternFromString("rid");  // held for the process's life
        if (s == nullptr) throw nb::python_error();
        return s;
    }();
    const Py_ssize_t n = PyObject_Size(deferred.ptr());
    if (n < 0) throw nb::python_error();
    if (n == 0) return false;  // nothing deferred: no lookup
    PyObject* v = PyObject_GetAttr(r, rid);
    if (v == nullptr) throw nb::python_error();
    nb::object held = nb::steal(v);
    const int dep = PySequence_Contains(deferred.ptr(), v);
    check(dep);
    return dep != 0;
}

}  // namespace

DfsWeightOrder::DfsWeightOrder(nb::object tree, TreeOf tree_of)
    : tree_obj_(std::move(tree)), tree_of_(tree_of) {
    base_ = this->tree().root();
}

Tree& DfsWeightOrder::tree() const { return *tree_of_(tree_obj_).first; }

DfsWeightOrder::End DfsWeightOrder::end(PyObject* r) const {
    const Matcher* m = tree_of_(tree_obj_).second;
    if (m == nullptr) throw std::runtime_error("no native matcher listens to this tree");
    const Memo* memo = m->memo(id_of(r));
    if (memo == nullptr) throw nb::key_error("DfsWeightOrder: a request is not tracked");
    Node* node = memo->node.get();
    return End{node, memo->full ? node->size() : memo->offset, memo->n};
}

// (whether r fits the base, the child of the base its match goes through: none when it ends
// at or above the base). A child's slot names it across splits (the upper part of a split
// takes its place).
DfsWeightOrder::Fit DfsWeightOrder::child_of_base(PyObject* r) const {
    Node* const start = end(r).node;
    const Node* root = tree().root().get();
    Node* node = start;
    const Node* below = nullptr;
    while (node != base_.get()) {
        if (node == root || node->parent == nullptr)  // not under the base: above it, or not
            return Fit{is_above_base(start), false, 0};
        below = node;
        node = node->parent;
    }
    return below == nullptr ? Fit{true, false, 0} : Fit{true, true, below->slot};
}

bool DfsWeightOrder::is_above_base(const Node* node) const {
    for (const Node* cur = base_.get(); cur != nullptr; cur = cur->parent)
        if (cur == node) return true;
    return false;
}

// The deepest node on every member's path (the base of a rebuild): the root when the common
// path is the root alone, or nothing (a detached member's path does not start at the root).
NodePtr DfsWeightOrder::lca(nb::handle queue) const {
    const NodePtr& root = tree().root();
    std::vector<Node*> common, path;
    bool first = true;
    for (PyObject* r : items_of(queue)) {
        path.clear();
        for (Node* node = end(r).node; node != nullptr; node = node->parent) path.push_back(node);
        std::reverse(path.begin(), path.end());  // root first
        if (first) {
            common = path;
            first = false;
        } else {
            size_t k = 0;
            while (k < std::min(common.size(), path.size()) && common[k] == path[k]) ++k;
            common.resize(k);
        }
        if (common.size() <= 1) return root;
    }
    return common.empty() ? root : common.back()->shared_from_this();
}

void DfsWeightOrder::join(PyObject* r, bool has_top, int64_t top) {
    members_[r] = Member{has_top, top, -1};
    if (has_top) {
        groups_[top].insert(r);
        touched_.insert(top);
    }
}

void DfsWeightOrder::leave(PyObject* r) {
    auto it = members_.find(r);
    if (it == members_.end()) throw nb::key_error("DfsWeightOrder: not a member");
    const Member m = it->second;
    members_.erase(it);
    if (!m.has_top) return;
    auto g = groups_.find(m.top);
    if (g == groups_.end() || g->second.erase(r) == 0)
        throw std::runtime_error("DfsWeightOrder: a member missing from its group");
    touched_.insert(m.top);
    if (g->second.empty()) groups_.erase(g);
}

// Child `top`'s own DFS order over its members (given in list order).
void DfsWeightOrder::segment(int64_t top, const std::vector<PyObject*>& reqs) {
    std::vector<std::pair<Node*, int64_t>> ends;
    ends.reserve(reqs.size());
    for (PyObject* r : reqs) {
        const End e = end(r);
        ends.emplace_back(e.node, e.offset);
    }
    const std::vector<int64_t> perm = tree().dfs_weight_order_at(ends);
    for (size_t j = 0; j < perm.size(); ++j)
        members_.at(reqs.at(static_cast<size_t>(perm[j]))).segpos = static_cast<int64_t>(j);
    count_[top] = static_cast<int64_t>(reqs.size());
}

Atoms DfsWeightOrder::key(PyObject* r, nb::handle deferred) const {
    const Member& m = members_.at(r);
    const int64_t dep = is_deferred(r, deferred) ? 1 : 0;
    if (!m.has_top) return Atoms{int_atom(dep), int_atom(1), int_atom(-end(r).depth)};
    if (m.segpos < 0) throw std::runtime_error("DfsWeightOrder: a member without a segment");
    return Atoms{int_atom(dep), int_atom(0), int_atom(-count_.at(m.top)), int_atom(m.top),
                 int_atom(m.segpos)};
}

bool DfsWeightOrder::place(nb::handle r, int64_t j) {
    ++calls_.place;
    if (!order_.place(r, j)) return false;
    join(r.ptr(), false, 0);
    return true;
}

void DfsWeightOrder::remove(nb::handle r) {
    if (order_.remove(r, nb::none())) leave(r.ptr());
}

void DfsWeightOrder::rebuild(nb::handle queue, nb::handle deferred) {
    ++calls_.rebuild;
    base_ = lca(queue);
    members_.clear();
    groups_.clear();
    count_.clear();
    const std::vector<PyObject*> reqs = items_of(queue);
    std::vector<int64_t> tops;  // in order of first member (joined in list order)
    std::unordered_map<int64_t, std::vector<PyObject*>> by_top;
    for (PyObject* r : reqs) {
        const Fit f = child_of_base(r);
        join(r, f.has_top, f.top);
        if (!f.has_top) continue;
        auto& group = by_top[f.top];
        if (group.empty()) tops.push_back(f.top);
        group.push_back(r);
    }
    for (int64_t top : tops) segment(top, by_top.at(top));
    touched_.clear();
    order_.reset_atoms(queue, [&](size_t i, Atoms& atoms) { atoms = key(reqs.at(i), deferred); });
    check(PyList_SetSlice(queue.ptr(), 0, PY_SSIZE_T_MAX, order_.reqs.ptr()));
}

void DfsWeightOrder::resegment(const std::unordered_set<PyObject*>& fresh,
                               const std::vector<PyObject*>& arrivals,
                               std::vector<PyObject*>& rekey) {
    std::unordered_set<PyObject*> listed(rekey.begin(), rekey.end());
    for (int64_t top : touched_) {
        auto g = groups_.find(top);
        if (g == groups_.end()) {
            count_.erase(top);
            continue;
        }
        std::vector<std::pair<size_t, PyObject*>> olds;
        for (PyObject* r : g->second)
            if (fresh.count(r) == 0) olds.emplace_back(order_.position(r), r);
        std::sort(olds.begin(), olds.end());  // positions are distinct
        std::vector<PyObject*> reqs;
        reqs.reserve(g->second.size());
        for (const auto& o : olds) reqs.push_back(o.second);
        for (PyObject* r : arrivals)
            if (g->second.count(r) != 0) reqs.push_back(r);
        segment(top, reqs);
        for (const auto& o : olds)
            if (listed.insert(o.second).second) rekey.push_back(o.second);
    }
}

bool DfsWeightOrder::advance(nb::handle changed, nb::handle arrivals, nb::handle deferred,
                             nb::handle queue) {
    return advance_items(items_of(changed), items_of(arrivals), deferred, queue);
}

bool DfsWeightOrder::advance_items(const std::vector<PyObject*>& moved,
                                   const std::vector<PyObject*>& news, nb::handle deferred,
                                   nb::handle queue) {
    ++calls_.advance;
    if (!PyList_Check(queue.ptr())) throw nb::type_error("DfsWeightOrder: a list expected");
    const auto total = static_cast<size_t>(PyList_GET_SIZE(queue.ptr()));
    const bool detached = base_->parent == nullptr && base_.get() != tree().root().get();
    if (detached || worth_rebuilding(moved.size() + news.size(), total)) return false;
    for (PyObject* r : moved) leave(r);
    std::vector<Fit> fits;
    fits.reserve(moved.size() + news.size());
    for (const auto* list : {&moved, &news})
        for (PyObject* r : *list) {
            fits.push_back(child_of_base(r));
            if (!fits.back().fits) return false;
        }
    size_t k = 0;
    for (const auto* list : {&moved, &news})
        for (PyObject* r : *list) {
            join(r, fits.at(k).has_top, fits.at(k).top);
            ++k;
        }
    // A touched branch re-keys all its members: when that is much of the queue, one sort of
    // the whole queue is cheaper than moving them one by one.
    size_t moving = moved.size() + news.size();
    for (int64_t top : touched_)
        if (auto g = groups_.find(top); g != groups_.end()) moving += g->second.size();
    if (worth_rebuilding(moving, total)) return false;
    std::vector<PyObject*> rekey;
    std::unordered_set<PyObject*> seen;
    for (PyObject* r : moved)
        if (seen.insert(r).second) rekey.push_back(r);
    const std::unordered_set<PyObject*> fresh(news.begin(), news.end());
    resegment(fresh, news, rekey);
    touched_.clear();
    StableOrder::Keyed rekeyed, placed;
    rekeyed.reserve(rekey.size());
    for (PyObject* r : rekey) rekeyed.emplace_back(nb::borrow(r), key(r, deferred));
    placed.reserve(news.size());
    for (PyObject* r : news) placed.emplace_back(nb::borrow(r), key(r, deferred));
    order_.update_atoms(std::move(rekeyed), std::move(placed), queue);
    return true;
}

nb::object DfsWeightOrder::top_of(nb::handle r) const {
    auto it = members_.find(r.ptr());
    if (it == members_.end()) throw nb::key_error("DfsWeightOrder.top_of: not a member");
    return it->second.has_top ? nb::object(nb::int_(it->second.top)) : nb::none();
}

void bind_dfs_order(nb::module_& m, TreeOf tree_of) {
    g_tree_of = tree_of;
    nb::class_<DfsWeightOrder>(m, "DfsWeightOrder")
        .def("__init__",
             [](DfsWeightOrder* self, nb::object tree) {
                 g_tree_of(tree);  // a native Tree, or a TypeError now
                 new (self) DfsWeightOrder(std::move(tree), g_tree_of);
             },
             "tree"_a)
        .def_prop_ro("reqs", &DfsWeightOrder::reqs)
        .def_prop_ro("base", &DfsWeightOrder::base)
        .def("__len__", &DfsWeightOrder::size)
        .def("place", &DfsWeightOrder::place, "r"_a, "j"_a)
        .def("remove", &DfsWeightOrder::remove, "r"_a)
        .def("rebuild", &DfsWeightOrder::rebuild, "queue"_a, "deferred"_a)
        .def("advance", &DfsWeightOrder::advance, "changed"_a, "arrivals"_a, "deferred"_a,
             "queue"_a)
        .def("top_of", &DfsWeightOrder::top_of, "r"_a)
        .def_prop_ro("calls", [](const DfsWeightOrder& o) {
            const DfsWeightOrder::Calls& c = o.calls();
            nb::dict d;
            d["advance"] = c.advance;
            d["rebuild"] = c.rebuild;
            d["place"] = c.place;
            return d;
        });
}

}  // namespace radixsched
