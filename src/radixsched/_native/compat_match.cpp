// See compat_match.hpp. Bit for bit what the Python loop did: the same walk per request
// (Tree::walk_into, as Tree.walk_node makes it: the same clock tick, touches and splits), in
// list order, and the same Python values set on each request (ints, the node's own object).
#include "compat_match.hpp"

#include <nanobind/stl/shared_ptr.h>
#include <structmember.h>  // PyMember_GetOne, PyMember_SetOne

#include <algorithm>
#include <cstdint>
#include <limits>
#include <cstring>
#include <utility>
#include <vector>

#include "compat_fill.hpp"
#include "py_attr.hpp"
#include "radix.hpp"
#include "radix_match.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace compat {

Names& names() {
    static Names n;  // never destroyed before Python's end matters: it holds no references
    return n;
}

PyMemberDef* Attr::resolve(PyTypeObject* t) {
    Py_INCREF(t);  // held: a freed type's address must not pass for it
    Py_XDECREF(type_);
    type_ = t;
    tag_ = 0;
    def_ = nullptr;
    if (t->tp_getattro != PyObject_GenericGetAttr || t->tp_setattro != PyObject_GenericSetAttr)
        return nullptr;
    PyObject* d = _PyType_Lookup(t, name_);  // borrowed; gives t a version tag
    if (d == nullptr || Py_TYPE(d) != &PyMemberDescr_Type) return nullptr;
    PyMemberDef* def = reinterpret_cast<PyMemberDescrObject*>(d)->d_member;
    if (def->flags != 0 || !PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) return nullptr;
    tag_ = t->tp_version_tag;
    def_ = def;
    return def_;
}

nb::object Attr::get_slow(nb::handle o, PyMemberDef* def) {
    if (def == nullptr) return py::get(o, name_);
    PyObject* v = PyMember_GetOne(reinterpret_cast<const char*>(o.ptr()), def);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

void Attr::set(nb::handle o, nb::handle v) {
    PyMemberDef* def = member(Py_TYPE(o.ptr()));
    if (def == nullptr) return py::set(o, name_, v);
    if (PyMember_SetOne(reinterpret_cast<char*>(o.ptr()), def, v.ptr()) != 0)
        throw nb::python_error();
}

Fill fill_of(const TokenView& prompt, nb::handle req, std::vector<int32_t>& joined) {
    nb::object outs = names().output_ids.get(req);
    const int64_t no = py::len_of(outs);
    const int64_t np = prompt.size();
    if (no == 0) return Fill{prompt.data(), np};
    joined.assign(prompt.data(), prompt.data() + np);
    for (int64_t i = 0; i < no; ++i) {
        const auto v = nb::cast<int64_t>(outs[i]);
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
            throw nb::value_error("an output token id does not fit in int32");
        joined.push_back(static_cast<int32_t>(v));
    }
    return Fill{joined.data(), np + no};
}

nb::object namespace_of(nb::handle req) {
    Names& k = names();
    nb::object extra = k.extra_key.get(req), salt = k.cache_salt.get(req);
    if (extra.is_none() && salt.is_none()) return nb::none();
    return nb::make_tuple(extra, salt);
}

int32_t ns_of(nb::handle req, nb::handle namespace_id) {
    nb::object ns = namespace_of(req);
    return ns.is_none() ? 0 : nb::cast<int32_t>(namespace_id(ns));
}

NodeMatch match_node(Tree& tree, nb::handle req, const Fill& f, bool disabled,
                     nb::handle namespace_id) {
    Names& k = names();
    NodeMatch m{WalkResult{tree.root(), 0}, nb::object(), nb::object(), 0};
    if (!disabled && f.n > 0)  // NativeRadixCache.match_node's walk (ticks the clock)
        m.walk = tree.walk_into(f.data, f.n, ns_of(req, namespace_id), nullptr);
    m.node = nb::cast(m.walk.node);
    m.length = nb::int_(m.walk.length);
    k.prefix_len.set(req, m.length);
    k.last_node.set(req, m.node);
    k.host_hit_len.set(req, nb::int_(0));
    const int64_t total = m.walk.length;  // + host_len, always 0 on the native tree
    m.matched = std::min(total, f.n - 1);
    if (total <= f.n - 1)
        k.num_matched.set(req, m.length);
    else
        k.num_matched.set(req, nb::int_(f.n - 1));
    return m;
}

bool DedupGroups::duplicate(nb::handle req, const Fill& f) {
    if (f.n < width_) return false;  // not grouped
    return duplicate_at(namespace_of(req), f.data, head_hash(f.data, width_));
}

bool DedupGroups::duplicate_at(nb::handle ns, const int32_t* head, uint64_t hash) {
    int64_t number = -1;  // the default namespace (None)
    if (!ns.is_none()) {  // (extra_key, cache_salt): numbered here by tuple equality
        nb::object next = nb::int_(nb::len(ns_index_));
        PyObject* idx = PyDict_SetDefault(ns_index_.ptr(), ns.ptr(), next.ptr());
        if (idx == nullptr) throw nb::python_error();
        number = PyLong_AsLongLong(idx);
    }
    return !add(number, head, hash);
}

uint64_t head_hash(const int32_t* tokens, int64_t width) {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    const int64_t head = std::min<int64_t>(width, 4);
    const int64_t tail = std::max<int64_t>(head, width - 4);
    auto mix = [&h](int32_t t) {
        h ^= static_cast<uint32_t>(t);
        h *= 0xFF51AFD7ED558CCDULL;
        h ^= h >> 29;
    };
    for (int64_t i = 0; i < head; ++i) mix(tokens[i]);
    for (int64_t i = tail; i < width; ++i) mix(tokens[i]);
    return h;
}

void DedupGroups::reserve(size_t n) {
    ns_.reserve(n);
    hash_.reserve(n);
    tokens_.reserve(n * static_cast<size_t>(std::max<int64_t>(width_, 0)));
}

// A group key's hash: its namespace's number mixed into its tokens' head_hash.
bool DedupGroups::add(int64_t ns, const int32_t* tokens, uint64_t hash) {
    const size_t width = static_cast<size_t>(width_);
    const uint64_t h = hash ^ (static_cast<uint64_t>(ns) * 0xC2B2AE3D27D4EB4FULL);
    if (2 * (ns_.size() + 1) > table_.size()) grow();
    const size_t mask = table_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const uint32_t slot = table_.at(i);
        if (slot == 0) {
            table_.at(i) = static_cast<uint32_t>(ns_.size() + 1);
            ns_.push_back(ns);
            hash_.push_back(h);
            const size_t at = tokens_.size();
            tokens_.resize(at + width);
            std::memcpy(tokens_.data() + at, tokens, width * sizeof(int32_t));
            return true;
        }
        const size_t g = slot - 1;
        if (hash_.at(g) == h && ns_.at(g) == ns &&
            std::memcmp(tokens_.data() + g * width, tokens, width * sizeof(int32_t)) == 0)
            return false;
    }
}

void DedupGroups::grow() {
    table_.assign(std::max<size_t>(64, 2 * table_.size()), 0);
    const size_t mask = table_.size() - 1;
    for (size_t g = 0; g < ns_.size(); ++g) {
        size_t i = hash_.at(g) & mask;
        while (table_.at(i) != 0) i = (i + 1) & mask;
        table_.at(i) = static_cast<uint32_t>(g + 1);
    }
}

}  // namespace compat

namespace {

using compat::Fill;
using compat::Names;
using compat::names;

nb::tuple match_nodes(Tree& tree, nb::list reqs, bool want_ends, bool disabled,
                      nb::handle namespace_id) {
    nb::list device, ends;
    std::vector<int32_t> joined;
    for (size_t i = 0; i < nb::len(reqs); ++i) {  // as `for r in reqs` reads a list
        nb::object req = reqs[i];
        const TokenView prompt(names().prompt_ids.get(req));  // its buffer holds the array
        const Fill f = compat::fill_of(prompt, req, joined);
        const compat::NodeMatch m = compat::match_node(tree, req, f, disabled, namespace_id);
        device.append(m.length);
        if (want_ends) ends.append(nb::make_tuple(m.node, nb::int_(m.walk.node->size())));
    }
    return nb::make_tuple(device, want_ends ? nb::object(ends) : nb::none());
}

// WaitingQueue.dedup under SGLang compat: the candidates are the requests whose device match
// is at most `check`; with `threshold` <= 0 every candidate is deferred; else candidates whose
// fill has `threshold` tokens are grouped by (namespace, those first tokens) and every member
// but a group's first (in list order) is deferred. Their rids, in list order.
nb::list compat_dedup(nb::list reqs, nb::list device, int64_t check, int64_t threshold) {
    Names& k = names();
    nb::list dup;
    compat::DedupGroups groups(threshold);
    std::vector<int32_t> joined;
    if (nb::len(device) != nb::len(reqs)) throw nb::value_error("one device length per request");
    for (size_t i = 0; i < nb::len(reqs); ++i) {
        if (nb::cast<int64_t>(device[i]) > check) continue;  // not a candidate
        nb::object req = reqs[i];
        if (threshold <= 0) {
            dup.append(k.rid.get(req));
            continue;
        }
        const TokenView prompt(k.prompt_ids.get(req));
        if (groups.duplicate(req, compat::fill_of(prompt, req, joined)))
            dup.append(k.rid.get(req));
    }
    return dup;
}

}  // namespace

void bind_compat_match(nb::module_& m, TreeRef tree_of) {
    static TreeRef resolve = tree_of;
    m.def(
        "match_nodes",
        [](nb::handle tree, nb::list reqs, bool ends, bool disabled, nb::handle namespace_id) {
            return match_nodes(*resolve(tree), std::move(reqs), ends, disabled, namespace_id);
        },
        "tree"_a, "reqs"_a, "ends"_a, "disabled"_a, "namespace_id"_a,
        "A waiting queue's SGLang-compat matching in one call (see compat_match.hpp).");
    m.def("compat_dedup", &compat_dedup, "reqs"_a, "device"_a, "check"_a, "threshold"_a,
          "A waiting queue's SGLang-compat dedup in one call (see compat_match.hpp).");
}

}  // namespace radixsched
