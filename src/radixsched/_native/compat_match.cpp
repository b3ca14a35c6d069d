// See compat_match.hpp. Bit for bit what the Python loop did: the same walk per request
// (Tree::walk_into, as Tree.walk_node makes it: the same clock tick, touches and splits), in
// list order, and the same Python values set on each request (ints, the node's own object).
#include "compat_match.hpp"

#include <nanobind/stl/shared_ptr.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "py_attr.hpp"
#include "radix.hpp"
#include "radix_match.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

// Interned attribute names, created once and never released (like adder.cpp's).
struct Names {
    PyObject *prompt_ids, *output_ids, *extra_key, *cache_salt, *prefix_len, *last_node,
        *host_hit_len, *num_matched, *rid;
};

const Names& names() {
    static const Names n{
        PyUnicode_InternFromString("prompt_ids"),   PyUnicode_InternFromString("output_ids"),
        PyUnicode_InternFromString("extra_key"),    PyUnicode_InternFromString("cache_salt"),
        PyUnicode_InternFromString("prefix_len"),   PyUnicode_InternFromString("last_node"),
        PyUnicode_InternFromString("host_hit_len"),
        PyUnicode_InternFromString("num_matched_prefix_tokens"),
        PyUnicode_InternFromString("rid")};
    return n;
}

// A request's fill tokens (Req.fill_ids()): the prompt read in place, or the prompt and the
// outputs joined into `joined` (int32, as np.asarray(output_ids, dtype=np.int32) makes them).
struct Fill {
    const int32_t* data = nullptr;
    int64_t n = 0;
};

Fill fill_of(const TokenView& prompt, nb::handle req, std::vector<int32_t>& joined) {
    nb::object outs = py::get(req, names().output_ids);
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

// radixsched.native.namespace_id(req.namespace) (0 for the default namespace, None).
int32_t ns_of(nb::handle req, nb::handle namespace_id) {
    const Names& k = names();
    nb::object extra = py::get(req, k.extra_key), salt = py::get(req, k.cache_salt);
    if (extra.is_none() && salt.is_none()) return 0;
    return nb::cast<int32_t>(namespace_id(nb::make_tuple(extra, salt)));
}

nb::tuple match_nodes(Tree& tree, nb::list reqs, bool want_ends, bool disabled,
                      nb::handle namespace_id) {
    const Names& k = names();
    nb::list device, ends;
    const nb::object zero = nb::int_(0);
    std::vector<int32_t> joined;
    for (size_t i = 0; i < nb::len(reqs); ++i) {  // as `for r in reqs` reads a list
        nb::object req = reqs[i];
        const TokenView prompt(py::get(req, k.prompt_ids));  // its buffer holds the array
        const Fill f = fill_of(prompt, req, joined);
        WalkResult w{tree.root(), 0};
        if (!disabled && f.n > 0) {  // NativeRadixCache.match_node's walk (ticks the clock)
            const int32_t ns = ns_of(req, namespace_id);
            w = tree.walk_into(f.data, f.n, ns, nullptr);
        }
        nb::object node = nb::cast(w.node), length = nb::int_(w.length);
        py::set(req, k.prefix_len, length);
        py::set(req, k.last_node, node);
        py::set(req, k.host_hit_len, zero);
        const int64_t total = w.length;  // + host_len, always 0 on the native tree
        if (total <= f.n - 1)
            py::set(req, k.num_matched, length);
        else
            py::set_int(req, k.num_matched, f.n - 1);
        device.append(length);
        if (want_ends) ends.append(nb::make_tuple(node, nb::int_(w.node->size())));
    }
    return nb::make_tuple(device, want_ends ? nb::object(ends) : nb::none());
}

// The reference loop's read-only branch (NativeRadixCache.match_len per request): no walk
// side effect; num_matched_prefix_tokens = min(length, fill_len - 1) set on each.
nb::list match_lens(Tree& tree, nb::list reqs, nb::handle namespace_id) {
    const Names& k = names();
    nb::list device;
    std::vector<int32_t> joined;
    for (size_t i = 0; i < nb::len(reqs); ++i) {  // as `for r in reqs` reads a list
        nb::object req = reqs[i];
        const TokenView prompt(py::get(req, k.prompt_ids));  // its buffer holds the array
        const Fill f = fill_of(prompt, req, joined);
        const int64_t n = tree.match_len(f.data, f.n, ns_of(req, namespace_id));
        nb::object length = nb::int_(n);
        if (n <= f.n - 1)
            py::set(req, k.num_matched, length);
        else
            py::set_int(req, k.num_matched, f.n - 1);
        device.append(length);
    }
    return device;
}

// WaitingQueue.dedup under SGLang compat: the candidates are the requests whose device match
// is at most `check`; with `threshold` <= 0 every candidate is deferred; else candidates whose
// fill has `threshold` tokens are grouped by (namespace, those first tokens) and every member
// but a group's first (in list order) is deferred. Their rids, in list order.
nb::list compat_dedup(nb::list reqs, nb::list device, int64_t check, int64_t threshold) {
    const Names& k = names();
    nb::list dup;
    nb::dict ns_index;  // namespace (None or (extra_key, cache_salt)) -> its number here
    std::unordered_set<std::string> seen;  // groups with a first member
    std::vector<int32_t> joined;
    if (nb::len(device) != nb::len(reqs)) throw nb::value_error("one device length per request");
    for (size_t i = 0; i < nb::len(reqs); ++i) {
        if (nb::cast<int64_t>(device[i]) > check) continue;  // not a candidate
        nb::object req = reqs[i];
        if (threshold <= 0) {
            dup.append(py::get(req, k.rid));
            continue;
        }
        const TokenView prompt(py::get(req, k.prompt_ids));
        const Fill f = fill_of(prompt, req, joined);
        if (f.n < threshold) continue;
        nb::object extra = py::get(req, k.extra_key), salt = py::get(req, k.cache_salt);
        nb::object ns = nb::none();  // Req.namespace
        if (!extra.is_none() || !salt.is_none()) ns = nb::make_tuple(extra, salt);
        const auto number = static_cast<int64_t>(nb::len(ns_index));
        PyObject* idx = PyDict_SetDefault(ns_index.ptr(), ns.ptr(), nb::int_(number).ptr());
        if (idx == nullptr) throw nb::python_error();
        const int64_t id = PyLong_AsLongLong(idx);
        std::string key(reinterpret_cast<const char*>(&id), sizeof id);
        key.append(reinterpret_cast<const char*>(f.data), size_t(threshold) * sizeof(int32_t));
        if (!seen.insert(std::move(key)).second) dup.append(py::get(req, k.rid));
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
    m.def(
        "match_lens",
        [](nb::handle tree, nb::list reqs, nb::handle namespace_id) {
            return match_lens(*resolve(tree), std::move(reqs), namespace_id);
        },
        "tree"_a, "reqs"_a, "namespace_id"_a,
        "A waiting queue's read-only matching in one call (see compat_match.hpp).");
    m.def("compat_dedup", &compat_dedup, "reqs"_a, "device"_a, "check"_a, "threshold"_a,
          "A waiting queue's SGLang-compat dedup in one call (see compat_match.hpp).");
}

}  // namespace radixsched
