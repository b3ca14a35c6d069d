// What the SGLang-compat queue calls (compat_match.cpp, compat_round.cpp) read of a request
// and do for each: its fill tokens, its namespace, and the reference loop's node matching of
// one request (WaitingQueue.match_all's node-matching branch over NativeRadixCache).
#pragma once

#include <nanobind/nanobind.h>
#include <structmember.h>  // PyMemberDef, T_OBJECT_EX

#include <cstdint>
#include <vector>

#include "radix.hpp"
#include "radix_match.hpp"

namespace radixsched::compat {

// One attribute of a request, read and written as getattr and setattr do it. Where the
// object's type is the one this attribute last resolved, unchanged since (the same version
// tag), with the generic attribute protocol, and the name resolves there to a plain member
// descriptor (a __slots__ entry, no flags): through that descriptor's member, as its __get__ and
// __set__ do (PyMember_GetOne, PyMember_SetOne), without the lookup; else PyObject_GetAttr and
// PyObject_SetAttr. The name and the type are held for the life of the process.
class Attr {
public:
    explicit Attr(const char* name) : name_(PyUnicode_InternFromString(name)) {}
    // getattr(o, name): a plain member's object read in place where it is set (as
    // PyMember_GetOne reads a T_OBJECT_EX member without flags), else get_slow.
    nanobind::object get(nanobind::handle o) {
        PyMemberDef* def = member(Py_TYPE(o.ptr()));
        if (def != nullptr && def->type == T_OBJECT_EX) {
            char* at = reinterpret_cast<char*>(o.ptr()) + def->offset;
            PyObject* v = *reinterpret_cast<PyObject**>(at);
            if (v != nullptr) return nanobind::borrow(v);
        }
        return get_slow(o, def);
    }
    void set(nanobind::handle o, nanobind::handle v);
    // set(o, int(v)), unless the member holds an exact int equal to v already (the value set
    // would be the same; only an int's identity could differ, which nothing reads).
    void set_int(nanobind::handle o, int64_t v) {
        PyObject* cur = peek(o);
        if (cur != nullptr && PyLong_CheckExact(cur) && int_is(cur, v)) return;
        set(o, nanobind::int_(v));
    }
    // The object a plain object member holds (borrowed; null: unset, or not such a member).
    PyObject* peek(nanobind::handle o) {
        PyMemberDef* def = member(Py_TYPE(o.ptr()));
        if (def == nullptr || (def->type != T_OBJECT_EX && def->type != T_OBJECT)) return nullptr;
        return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o.ptr()) + def->offset);
    }

private:
    // The member `t` resolves the name to (null: none usable): the one resolved last while t
    // is that type, unchanged since (inline: the common case), else resolve(t).
    PyMemberDef* member(PyTypeObject* t) {
        if (t == type_ && tag_ != 0 && PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG) &&
            t->tp_version_tag == tag_)
            return def_;
        return resolve(t);
    }
    PyMemberDef* resolve(PyTypeObject* t);
    nanobind::object get_slow(nanobind::handle o, PyMemberDef* def);  // def: member()'s
    // Whether the exact int `o` equals v. Where an int is a signed count of 30-bit digits
    // (ob_size) and its digits (CPython before 3.12; normalized: one value, one form), one or
    // two digits are read in place; else PyLong_AsLongLongAndOverflow answers.
    static bool int_is(PyObject* o, int64_t v) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
        const digit* d = reinterpret_cast<PyLongObject*>(o)->ob_digit;
        const auto low = static_cast<int64_t>(d[0]);
        switch (Py_SIZE(o)) {
            case 0: return v == 0;
            case 1: return v == low;
            case -1: return v == -low;
            case 2: return v == (static_cast<int64_t>(d[1]) << PyLong_SHIFT | low);
            case -2: return v == -(static_cast<int64_t>(d[1]) << PyLong_SHIFT | low);
            default: break;
        }
#endif
        int overflow = 0;
        const long long c = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (c == -1 && PyErr_Occurred()) throw nanobind::python_error();
        return overflow == 0 && c == v;
    }

    PyObject* name_;
    PyTypeObject* type_ = nullptr;
    unsigned int tag_ = 0;  // type_'s version tag when resolved (0: not resolved)
    PyMemberDef* def_ = nullptr;
};

// The attributes these calls read and write, created once.
struct Names {
    Attr prompt_ids{"prompt_ids"}, output_ids{"output_ids"}, extra_key{"extra_key"},
        cache_salt{"cache_salt"}, prefix_len{"prefix_len"}, last_node{"last_node"},
        host_hit_len{"host_hit_len"}, num_matched{"num_matched_prefix_tokens"}, rid{"rid"},
        queue_entry_time{"queue_entry_time"}, arrival_time{"arrival_time"};
};
Names& names();

// A request's fill tokens (Req.fill_ids()): the prompt read in place, or the prompt and the
// outputs joined into `joined` (int32, as np.asarray(output_ids, dtype=np.int32) makes them).
struct Fill {
    const int32_t* data = nullptr;
    int64_t n = 0;
};
Fill fill_of(const TokenView& prompt, nanobind::handle req, std::vector<int32_t>& joined);

// radixsched.native.namespace_id(req.namespace) (0 for the default namespace, None).
int32_t ns_of(nanobind::handle req, nanobind::handle namespace_id);

// Req.namespace: None, or (extra_key, cache_salt).
nanobind::object namespace_of(nanobind::handle req);

// One request's node matching, as the reference loop does it: Tree::walk_into over its fill
// (a disabled cache or an empty fill: (root, 0) without a walk, no clock tick), then
// prefix_len = the length, last_node = the node, host_hit_len = 0 and
// num_matched_prefix_tokens = min(length, fill_len - 1) set on it. `node` is the node's object.
struct NodeMatch {
    WalkResult walk;
    nanobind::object node, length;
    int64_t matched = 0;  // the num_matched_prefix_tokens set
};
NodeMatch match_node(Tree& tree, nanobind::handle req, const Fill& f, bool disabled,
                     nanobind::handle namespace_id);

// The hash of a group key's first `width` tokens (up to 4 from each end; equal keys hash alike;
// the groups' table compares whole keys).
uint64_t head_hash(const int32_t* tokens, int64_t width);

// The compat dedup's groups (WaitingQueue.dedup under SGLang compat, threshold > 0): a
// candidate whose fill has `width` tokens belongs to the group (its namespace, its first
// `width` fill tokens); `duplicate` says whether that group had a member already (then it is
// deferred; a group's first member, in list order, represents it).
class DedupGroups {
public:
    explicit DedupGroups(int64_t width) : width_(width) {}
    bool duplicate(nanobind::handle req, const Fill& f);
    // The same for a candidate of namespace `ns` (Req.namespace) whose fill has at least
    // `width` tokens, `head` its first ones, `hash` head_hash(head, width).
    bool duplicate_at(nanobind::handle ns, const int32_t* head, uint64_t hash);
    void reserve(size_t n);  // room for n groups

private:
    bool add(int64_t ns, const int32_t* tokens, uint64_t hash);  // true: a new group
    void grow();

    int64_t width_;
    nanobind::dict ns_index_;  // a namespace (extra_key, cache_salt) -> its number here
    // The groups, in the order they were found: namespace number (-1: the default), hash, and
    // first `width_` tokens (group after group); an open-addressing table of group + 1 (0:
    // empty), at most half full.
    std::vector<int64_t> ns_;
    std::vector<uint64_t> hash_;
    std::vector<int32_t> tokens_;
    std::vector<uint32_t> table_;
};

}  // namespace radixsched::compat
