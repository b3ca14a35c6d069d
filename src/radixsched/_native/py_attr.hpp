// Attribute and sequence access on Python objects for the native core's request bindings
// (kv.cpp, adder.cpp): every failure is the Python exception, never a null object.
#pragma once

#include <nanobind/nanobind.h>
#include <structmember.h>  // T_OBJECT_EX, READONLY, READ_RESTRICTED

#include <cstdint>

namespace radixsched::py {

namespace nb = nanobind;

namespace detail {

// Where the generic attribute access of instances of `type` reaches `name` through a member
// descriptor of a __slots__ class (T_OBJECT_EX, no access restriction: the requests' fields),
// its offset in the instance; -1 where it does not (a dict attribute, a property, another
// getattro or setattro). Kept per (type, its version tag, name): a change to the type or a
// base (PyType_Modified) invalidates its tag, and tags are never reused.
struct SlotEntry {
    PyTypeObject* type = nullptr;
    unsigned int version = 0;
    PyObject* name = nullptr;
    Py_ssize_t get_at = -1;  // -1: PyObject_GetAttr decides
    Py_ssize_t set_at = -1;  // -1: PyObject_SetAttr decides
    // Where the generic access reaches `name` in the instance's own attributes first (CPython
    // 3.11: see instance_value), `managed`; the type's shared keys and the name's index in
    // them where they hold it (-1: not there).
    bool managed = false;
    const void* keys = nullptr;
    Py_ssize_t value_at = -1;
};

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
// CPython 3.11's instance attributes (Include/internal/pycore_dict.h, pycore_object.h), what
// its _PyObject_GenericGetAttrWithDict and _PyObject_GenericSetAttrWithDict reach where a type
// has no data descriptor for a name: an instance of a heap type with Py_TPFLAGS_MANAGED_DICT
// keeps its attributes' values in an array (its pointer four words before the object), indexed
// as the type's shared keys (ht_cached_keys: a split keys object, whose entries are only ever
// appended, so a name's index never changes) order the names, a NULL value an unset
// attribute; or, once a dict is made of them (the pointer then NULL), in that dict (its
// pointer three words before the object; NULL: no attributes yet).
#define RADIXSCHED_INLINE_VALUES 1
struct KeysHead {  // struct _dictkeysobject's fixed part (3.11): its indices follow it
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size, dk_log2_index_bytes, dk_kind;
    uint32_t dk_version;
    Py_ssize_t dk_usable, dk_nentries;
};
static_assert(sizeof(KeysHead) == 4 * sizeof(Py_ssize_t), "3.11's keys header: four words");
struct UnicodeEntry {  // PyDictUnicodeEntry (3.11)
    PyObject* me_key;
    PyObject* me_value;
};
constexpr uint8_t kSplitKeys = 2;  // DICT_KEYS_SPLIT

inline PyObject** inline_values(PyObject* o) {  // *_PyObject_ValuesPointer(o): NULL or values
    return reinterpret_cast<PyObject***>(o)[-4];
}
inline PyObject* managed_dict(PyObject* o) {  // *_PyObject_ManagedDictPointer(o)
    return reinterpret_cast<PyObject**>(o)[-3];
}

// The index of `name` (by identity: interned names) among the split keys `keys`, or -1.
inline Py_ssize_t split_index(const void* keys, PyObject* name) {
    const auto* k = static_cast<const KeysHead*>(keys);
    if (k->dk_kind != kSplitKeys) return -1;
    const auto* entries = reinterpret_cast<const UnicodeEntry*>(  // past the indices
        static_cast<const char*>(keys) + sizeof(KeysHead) + (size_t(1) << k->dk_log2_index_bytes));
    for (Py_ssize_t i = 0; i < k->dk_nentries; ++i)
        if (entries[i].me_key == name) return i;
    return -1;
}

// The value the generic access finds for `name` among `o`'s own attributes, where `e` (of its
// type, `managed`) says they are reached first: borrowed; NULL where `o` has none by that name
// (unset, not in the shared keys, or no attributes at all).
inline PyObject* instance_value(const SlotEntry& e, PyObject* o, PyObject* name) {
    if (PyObject** values = inline_values(o)) {
        if (e.value_at < 0 ||
            reinterpret_cast<PyHeapTypeObject*>(Py_TYPE(o))->ht_cached_keys != e.keys)
            return nullptr;
        return values[e.value_at];
    }
    PyObject* dict = managed_dict(o);
    if (dict == nullptr) return nullptr;
    PyObject* v = PyDict_GetItemWithError(dict, name);  // (str keys: no code of theirs runs)
    if (v == nullptr && PyErr_Occurred()) throw nb::python_error();
    return v;
}

// Whether the generic access of `t`'s instances reaches `name` (its class attribute `descr`,
// borrowed, NULL: none) among their own attributes first, and they are kept as above: a heap
// type with a managed dict and the generic getattro and setattro, an exact str name, and no
// class attribute or one of a static type that is no descriptor at all (a default value: a
// static type's slots never change, so this holds while t's version tag does). If so, `e`
// says so, checked on `o`: the value instance_value finds must be what PyObject_GetAttr gives
// (a layout misread keeps the generic path). That read runs no code of the program's: the
// type's generic getattro, no descriptor.
inline void fill_managed(SlotEntry& e, PyTypeObject* t, PyObject* name, PyObject* descr,
                         PyObject* o) {
    if (!PyType_HasFeature(t, Py_TPFLAGS_MANAGED_DICT) || !PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE) ||
        !PyUnicode_CheckExact(name) || t->tp_getattro != PyObject_GenericGetAttr ||
        t->tp_setattro != PyObject_GenericSetAttr)
        return;
    if (descr != nullptr) {
        const PyTypeObject* d = Py_TYPE(descr);
        if (PyType_HasFeature(const_cast<PyTypeObject*>(d), Py_TPFLAGS_HEAPTYPE) ||
            d->tp_descr_get != nullptr || d->tp_descr_set != nullptr)
            return;
    }
    const void* keys = reinterpret_cast<PyHeapTypeObject*>(t)->ht_cached_keys;
    SlotEntry got = e;
    got.managed = true;
    got.keys = keys;
    got.value_at = keys != nullptr ? split_index(keys, name) : -1;
    PyObject* fast = instance_value(got, o, name);
    if (fast == nullptr) return;
    PyObject* generic = PyObject_GetAttr(o, name);
    if (generic == nullptr) {
        PyErr_Clear();
        return;
    }
    const bool same = generic == fast;
    Py_DECREF(generic);
    if (same) e = got;
}
#endif


// One table for the module: 512 sets of two entries, a set chosen by (type, name) mixed (the
// pointers' low bits alone made a few hot pairs share a place and refill each other).
constexpr unsigned kSlotSetBits = 9;
inline SlotEntry g_slots[size_t(1) << kSlotSetBits][2];

inline SlotEntry* slot_set(PyTypeObject* t, PyObject* name) {
    constexpr uint64_t golden = 0x9E3779B97F4A7C15ULL;
    const uint64_t k = uint64_t(reinterpret_cast<uintptr_t>(t)) ^
                       uint64_t(reinterpret_cast<uintptr_t>(name)) * golden;
    return g_slots[(k * golden) >> (64 - kSlotSetBits)];
}

// The entry of (type, name) filled anew (a miss: the generic lookup, once per type version).
[[gnu::noinline]] inline const SlotEntry& fill_slot_entry(SlotEntry& e, PyTypeObject* t,
                                                          PyObject* name, PyObject* o) {
    e = SlotEntry{};
    // Looked up first: _PyType_Lookup assigns the version tag it is valid under.
    PyObject* descr = _PyType_Lookup(t, name);  // borrowed
    if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) return e;  // (not cached)
    e.type = t;
    e.version = t->tp_version_tag;
    e.name = name;
    if (descr != nullptr && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        const PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
        if (m->type == T_OBJECT_EX) {
            if (t->tp_getattro == PyObject_GenericGetAttr && !(m->flags & READ_RESTRICTED))
                e.get_at = m->offset;
            if (t->tp_setattro == PyObject_GenericSetAttr &&
                !(m->flags & (READONLY | PY_WRITE_RESTRICTED)))
                e.set_at = m->offset;
        }
    }
#ifdef RADIXSCHED_INLINE_VALUES
    fill_managed(e, t, name, descr, o);
#else
    (void)o;
#endif
    return e;
}

[[gnu::always_inline]] inline const SlotEntry& slot_entry(PyObject* o, PyObject* name) {
    PyTypeObject* t = Py_TYPE(o);
    SlotEntry* set = slot_set(t, name);
    const bool valid = PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG);
    for (int w = 0; w < 2; ++w) {
        SlotEntry& e = set[w];
        if (e.type == t && e.name == name && valid && e.version == t->tp_version_tag) return e;
    }
    set[1] = set[0];  // a miss: the newer entry stays, the older one goes
    return fill_slot_entry(set[0], t, name, o);
}

// instance_value where `e` is `managed` (else NULL: the generic path decides).
inline PyObject* own_value(const SlotEntry& e, PyObject* o, PyObject* name) {
#ifdef RADIXSCHED_INLINE_VALUES
    if (e.managed) return instance_value(e, o, name);
#else
    (void)e;
    (void)o;
    (void)name;
#endif
    return nullptr;
}

// o.name = v where `e` is `managed` and the generic setattr would store it among o's own
// attributes: a set inline value replaced in place (what _PyObject_StoreInstanceAttribute
// does to one: no other change), a made dict's item set (what _PyObjectDict_SetItem does
// there). False where the generic path decides (an unset value, no attributes yet).
inline bool set_own(const SlotEntry& e, PyObject* o, PyObject* name, PyObject* v) {
#ifdef RADIXSCHED_INLINE_VALUES
    if (!e.managed) return false;
    if (PyObject** values = inline_values(o)) {
        if (e.value_at < 0 ||
            reinterpret_cast<PyHeapTypeObject*>(Py_TYPE(o))->ht_cached_keys != e.keys)
            return false;
        PyObject* old = values[e.value_at];
        if (old == nullptr) return false;
        values[e.value_at] = Py_NewRef(v);
        Py_DECREF(old);
        return true;
    }
    PyObject* dict = managed_dict(o);
    if (dict == nullptr) return false;
    if (PyDict_SetItem(dict, name, v) < 0) throw nb::python_error();
    return true;
#else
    (void)e;
    (void)o;
    (void)name;
    (void)v;
    return false;
#endif
}

inline PyObject*& slot_at(PyObject* o, Py_ssize_t offset) {
    return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset);
}

}  // namespace detail

// o.name (a slot read in place where detail::slot_entry finds one: what member_get does).
// An instance attribute among o's own ones is read there (detail::own_value).
inline nb::object get(nb::handle o, PyObject* name) {
    const detail::SlotEntry& e = detail::slot_entry(o.ptr(), name);
    if (e.get_at >= 0) {
        PyObject* v = detail::slot_at(o.ptr(), e.get_at);
        if (v != nullptr) return nb::borrow(v);
    } else if (PyObject* v = detail::own_value(e, o.ptr(), name)) {
        return nb::borrow(v);
    }  // else (an unset slot or value included) the generic path, which raises its AttributeError
    PyObject* v = PyObject_GetAttr(o.ptr(), name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}
inline int64_t get_int(nb::handle o, PyObject* name) { return nb::cast<int64_t>(get(o, name)); }
// o.name = v (a slot written in place where detail::slot_entry finds one: what member_set
// does, the old value released last).
// An instance attribute among o's own ones is set there (detail::set_own).
inline void set(nb::handle o, PyObject* name, nb::handle v) {
    const detail::SlotEntry& e = detail::slot_entry(o.ptr(), name);
    if (e.set_at >= 0 && v.ptr() != nullptr) {
        PyObject*& slot = detail::slot_at(o.ptr(), e.set_at);
        PyObject* old = slot;
        slot = Py_NewRef(v.ptr());
        Py_XDECREF(old);
        return;
    }
    if (v.ptr() != nullptr && detail::set_own(e, o.ptr(), name, v.ptr())) return;
    if (PyObject_SetAttr(o.ptr(), name, v.ptr()) != 0) throw nb::python_error();
}
inline void set_int(nb::handle o, PyObject* name, int64_t v) { set(o, name, nb::int_(v)); }
inline int64_t len_of(nb::handle o) {
    const Py_ssize_t n = PyObject_Length(o.ptr());
    if (n < 0) throw nb::python_error();
    return n;
}
inline nb::object slice(nb::handle o, int64_t lo, int64_t hi) {  // o[lo:hi]
    PyObject* v = PySequence_GetSlice(o.ptr(), lo, hi);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

}  // namespace radixsched::py
