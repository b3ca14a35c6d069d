// Kept orders (order.hpp). Every result equals what the former Python kept
// orders gave: the same comparisons (Python's, exactly), the same tie numbers, the same
// floating-point operations in the same order for hrrn's ratios.
#include "order.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {

namespace {

constexpr double kTwo63 = 9223372036854775808.0;
constexpr int64_t kExactTie = int64_t{1} << 53;  // tie numbers stay exact doubles below this

void check(int rc) {
    if (rc < 0) throw nb::python_error();
}

// -1, 0, 1: the integer `i` against the float `d` (not nan), exactly.
int compare_int_float(int64_t i, double d) {
    if (d >= kTwo63) return -1;
    if (d < -kTwo63) return 1;
    const double whole = std::trunc(d);
    const auto w = static_cast<int64_t>(whole);  // exact: |whole| < 2^63
    if (i != w) return i < w ? -1 : 1;
    const double frac = d - whole;
    return frac > 0 ? -1 : (frac < 0 ? 1 : 0);
}

bool numeric(const Atom& a) { return a.kind == Atom::Int || a.kind == Atom::Float; }

nb::object py(const Atom& a) {
    if (a.obj.is_valid()) return a.obj;
    return a.kind == Atom::Int ? nb::object(nb::int_(a.i)) : nb::object(nb::float_(a.d));
}

// Python's rule for two objects: equal (identity first), else less, else greater.
int compare_objects(PyObject* x, PyObject* y) {
    if (x == y) return 0;
    const int eq = PyObject_RichCompareBool(x, y, Py_EQ);
    check(eq);
    if (eq) return 0;
    const int lt = PyObject_RichCompareBool(x, y, Py_LT);
    check(lt);
    return lt ? -1 : 1;
}

// A sequence's items (a tuple or list without copying; anything else through a list).
class Items {
public:
    explicit Items(nb::handle seq) {
        PyObject* fast = PySequence_Fast(seq.ptr(), "a kept order takes sequences");
        if (fast == nullptr) throw nb::python_error();
        seq_ = nb::steal(fast);
    }
    size_t size() const { return static_cast<size_t>(PySequence_Fast_GET_SIZE(seq_.ptr())); }
    nb::handle operator[](size_t i) const {
        if (i >= size()) throw std::out_of_range("sequence index");
        return PySequence_Fast_GET_ITEM(seq_.ptr(), static_cast<Py_ssize_t>(i));
    }

private:
    nb::object seq_;
};

Atoms atoms_of(nb::handle key) {
    Items items(key);
    Atoms out;
    out.reserve(items.size() + 1);
    for (size_t k = 0; k < items.size(); ++k) out.push_back(Atom::of(items[k]));
    return out;
}

nb::list list_of(nb::handle mirror) {
    if (!PyList_Check(mirror.ptr())) throw nb::type_error("mirror: a list or None");
    return nb::borrow<nb::list>(mirror);
}

PyObject** list_items(nb::handle list) {
    return reinterpret_cast<PyListObject*>(list.ptr())->ob_item;
}

// del list[i] (nothing past the end, as the slice deletion it replaces): the items after it
// moved down in one memmove.
void list_delete(nb::handle list, size_t i) {
    const auto n = static_cast<size_t>(PyList_GET_SIZE(list.ptr()));
    if (i >= n) return;
    PyObject** items = list_items(list);
    PyObject* gone = items[i];
    std::memmove(items + i, items + i + 1, (n - i - 1) * sizeof(PyObject*));
    Py_SET_SIZE(reinterpret_cast<PyVarObject*>(list.ptr()), static_cast<Py_ssize_t>(n - 1));
    Py_DECREF(gone);  // last: the list is consistent should a finalizer read it
}

// list.insert(i, item) (i past the end: appended): appended, then moved to i in one memmove.
void list_insert(nb::handle list, size_t i, nb::handle item) {
    const auto n = static_cast<size_t>(PyList_GET_SIZE(list.ptr()));
    check(PyList_Append(list.ptr(), item.ptr()));  // the list's reference, its room grown
    if (i >= n) return;
    PyObject** items = list_items(list);
    std::memmove(items + i + 1, items + i, (n - i) * sizeof(PyObject*));
    items[i] = item.ptr();
}

// Moves the item at i to j (both in range), the ones between shifted by one: the same
// references, so no count changes.
template <class T>
void move_item(T* items, size_t i, size_t j) {
    if (i == j) return;
    T item = items[i];
    if (i < j)
        std::memmove(items + i, items + i + 1, (j - i) * sizeof(T));
    else
        std::memmove(items + j + 1, items + j, (i - j) * sizeof(T));
    items[j] = item;
}

PyObject* interned(const char* name) {
    // One reference per name for the life of the process, never released (statics must not
    // touch Python objects after interpreter shutdown).
    PyObject* s = PyUnicode_InternFromString(name);
    if (s == nullptr) throw nb::python_error();
    return s;
}

nb::object attr(nb::handle obj, PyObject* name) {
    PyObject* v = PyObject_GetAttr(obj.ptr(), name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

double as_double(nb::handle v) {  // what numpy stores for a Python number in a float64 array
    const double d = PyFloat_AsDouble(v.ptr());
    if (d == -1.0 && PyErr_Occurred()) throw nb::python_error();
    return d;
}

int64_t as_int(nb::handle v) {
    const long long x = PyLong_AsLongLong(v.ptr());
    if (x == -1 && PyErr_Occurred()) throw nb::python_error();
    return x;
}

}  // namespace

Atom Atom::of(nb::handle h) {
    Atom a;
    a.obj = nb::borrow(h);
    PyObject* p = h.ptr();
    if (PyLong_CheckExact(p) || PyBool_Check(p)) {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
        if (overflow == 0) {
            a.kind = Int;
            a.i = v;
            return a;
        }
    } else if (PyFloat_CheckExact(p)) {
        const double d = PyFloat_AS_DOUBLE(p);
        if (!std::isnan(d)) {
            a.kind = Float;
            a.d = d;
            return a;
        }
    } else if (PyUnicode_CheckExact(p)) {
        a.kind = Str;
        return a;
    }
    a.kind = Obj;
    return a;
}

Atom Atom::tie(double t) {
    Atom a;
    a.kind = Float;
    a.d = t;
    return a;
}

int compare(const Atom& a, const Atom& b) {
    if (numeric(a) && numeric(b)) {
        if (a.kind == Atom::Int && b.kind == Atom::Int) return a.i < b.i ? -1 : (a.i > b.i);
        if (a.kind == Atom::Float && b.kind == Atom::Float) return a.d < b.d ? -1 : (a.d > b.d);
        return a.kind == Atom::Int ? compare_int_float(a.i, b.d) : -compare_int_float(b.i, a.d);
    }
    if (a.kind == Atom::Str && b.kind == Atom::Str) {
        if (a.obj.ptr() == b.obj.ptr()) return 0;
        const int c = PyUnicode_Compare(a.obj.ptr(), b.obj.ptr());
        if (c == -1 && PyErr_Occurred()) throw nb::python_error();
        return c;
    }
    return compare_objects(py(a).ptr(), py(b).ptr());
}

int compare(const Atom* a, size_t na, const Atom* b, size_t nb) {
    const size_t n = std::min(na, nb);
    for (size_t k = 0; k < n; ++k) {
        const int c = compare(a[k], b[k]);
        if (c != 0) return c;
    }
    return na < nb ? -1 : (na > nb);
}

// ---- StableOrder ------------------------------------------------------------------------------

namespace {
int compare_stored(const Atoms& a, const Atoms& b) {
    return compare(a.data(), a.size(), b.data(), b.size());
}

}  // namespace

bool StableOrder::less(const Stored* x, const Stored* y) {
    return compare_stored(x->atoms, y->atoms) < 0;
}

bool StableOrder::key_equal(const Stored& s, const Atoms& key) {
    return compare(s.atoms.data(), s.atoms.size() - 1, key.data(), key.size()) == 0;
}

size_t StableOrder::find(const Stored& s) const {
    // bisect_left finds it: stored keys are unique.
    auto it = std::lower_bound(keys_.begin(), keys_.end(), &s, less);
    if (it != keys_.end() && *it == &s) return static_cast<size_t>(it - keys_.begin());
    for (size_t i = 0; i < keys_.size(); ++i)  // keys that compare inconsistently (Obj atoms)
        if (keys_[i] == &s) return i;
    throw std::runtime_error("StableOrder: a member's stored key is missing");
}

size_t StableOrder::bisect_right(const Stored& s) const {
    auto it = std::upper_bound(keys_.begin(), keys_.end(), &s, less);
    return static_cast<size_t>(it - keys_.begin());
}

void StableOrder::erase_at(size_t i, PyObject* r, nb::handle mirror) {
    keys_.erase(keys_.begin() + static_cast<std::ptrdiff_t>(i));
    list_delete(reqs, i);
    if (!mirror.is_none()) list_delete(mirror, i);
    key_of_.erase(r);
}

bool StableOrder::remove(nb::handle r, nb::handle mirror) {
    auto it = key_of_.find(r.ptr());
    if (it == key_of_.end()) return false;
    if (!mirror.is_none()) list_of(mirror);
    erase_at(find(it->second), r.ptr(), mirror);
    return true;
}

void StableOrder::insert(nb::handle r, Atoms key, double t, nb::handle mirror) {
    if (key_of_.count(r.ptr()) != 0) throw nb::value_error("StableOrder: already a member");
    Stored s;
    s.req = nb::borrow(r);
    s.atoms = std::move(key);
    s.atoms.push_back(Atom::tie(t));
    note(s.atoms);
    const size_t i = bisect_right(s);
    auto placed = key_of_.emplace(r.ptr(), std::move(s)).first;  // node: a stable address
    keys_.insert(keys_.begin() + static_cast<std::ptrdiff_t>(i), &placed->second);
    list_insert(reqs, i, r);
    if (!mirror.is_none()) list_insert(mirror, i, r);
}

void StableOrder::reset(nb::handle pre, nb::handle keys) {
    Items members(pre), key_items(keys);
    const size_t n = members.size();
    if (key_items.size() != n) throw nb::value_error("StableOrder.reset: one key per request");
    reset_atoms(pre, [&key_items](size_t i, Atoms& atoms) {
        Items items(key_items[i]);
        atoms.reserve(items.size() + 1);
        for (size_t k = 0; k < items.size(); ++k) atoms.push_back(Atom::of(items[k]));
    });
}

void StableOrder::reset_atoms(nb::handle pre, const KeyFill& fill) {
    try {
        rebuild(pre, fill);
    } catch (...) {  // the old members' stored keys may be gone: an empty order, consistent
        keys_.clear();
        key_of_.clear();
        reqs = nb::list();
        lo_ = -1;
        hi_ = 0;
        unshape();
        throw;
    }
}

void StableOrder::rebuild(nb::handle pre, const KeyFill& fill) {
    Items members(pre);
    const size_t n = members.size();
    // Each member's stored key, in its old node where it was a member (no allocation: the
    // node and its atoms' buffer are reused), else in a new one.
    std::vector<KeyOf::node_type> nodes;
    nodes.reserve(n);
    KeyOf fresh;
    for (size_t i = 0; i < n; ++i) {
        KeyOf::node_type nh = key_of_.extract(members[i].ptr());
        if (nh.empty()) {
            auto made = fresh.try_emplace(members[i].ptr()).first;
            nh = fresh.extract(made);
            nh.mapped().req = nb::borrow(members[i]);
        }
        Atoms& atoms = nh.mapped().atoms;
        atoms.clear();
        fill(i, atoms);
        nodes.push_back(std::move(nh));
    }
    std::vector<size_t> perm(n);
    std::iota(perm.begin(), perm.end(), size_t{0});
    const auto less = [&nodes](size_t a, size_t b) {
        return compare_stored(nodes[a].mapped().atoms, nodes[b].mapped().atoms) < 0;
    };
    // Already in order (a rebuild over an unchanged list): a stable sort leaves it as it is.
    if (!std::is_sorted(perm.begin(), perm.end(), less))
        std::stable_sort(perm.begin(), perm.end(), less);
    nb::list sorted;
    KeyOf key_of;
    key_of.reserve(n);
    std::vector<const Stored*> ptrs;
    ptrs.reserve(n);
    unshape();
    for (size_t t = 0; t < n; ++t) {
        KeyOf::node_type& nh = nodes[perm[t]];
        sorted.append(nh.mapped().req);
        nh.mapped().atoms.push_back(Atom::tie(static_cast<double>(t)));
        note(nh.mapped().atoms);
        auto placed = key_of.insert(std::move(nh));
        if (!placed.inserted) throw nb::value_error("StableOrder.reset: a request listed twice");
        ptrs.push_back(&placed.position->second);
    }
    reqs = std::move(sorted);
    key_of_ = std::move(key_of);  // nodes move with the table: the pointers stay valid
    keys_ = std::move(ptrs);
    lo_ = -1;
    hi_ = static_cast<int64_t>(n);
}

bool StableOrder::place(nb::handle r, int64_t j) {
    const auto n = static_cast<int64_t>(keys_.size());
    if (j < 0 || j > n) throw nb::index_error("StableOrder.place: position out of range");
    if (n == 0) return false;  // no neighbour to take a key from
    if (key_of_.count(r.ptr()) != 0) throw nb::value_error("StableOrder: already a member");
    const auto at = static_cast<size_t>(j);
    const Stored& near = j == 0 ? *keys_.front() : *keys_.at(at - 1);
    Atoms key(near.atoms.begin(), near.atoms.end() - 1);  // the neighbour's key
    double t;
    if (j == 0) {
        t = static_cast<double>(--lo_);
    } else if (j == n || !key_equal(*keys_.at(at), key)) {
        t = static_cast<double>(++hi_);  // above every tie number of `key`: still below right
    } else {
        const double left = near.tie(), right = keys_.at(at)->tie();
        t = (left + right) / 2;
        if (!(left < t && t < right)) return false;
    }
    if (lo_ <= -kExactTie || hi_ >= kExactTie) throw std::overflow_error("tie numbers");
    Stored s;
    s.req = nb::borrow(r);
    s.atoms = std::move(key);
    s.atoms.push_back(Atom::tie(t));
    note(s.atoms);
    auto placed = key_of_.emplace(r.ptr(), std::move(s)).first;
    keys_.insert(keys_.begin() + j, &placed->second);
    list_insert(reqs, at, r);
    return true;
}

void StableOrder::update(nb::handle changed, nb::handle arrivals, nb::handle mirror) {
    auto keyed = [](nb::handle pairs) {
        Items items(pairs);
        Keyed out;
        out.reserve(items.size());
        for (size_t k = 0; k < items.size(); ++k) {
            Items pair(items[k]);
            out.emplace_back(nb::borrow(pair[0]), atoms_of(pair[1]));
        }
        return out;
    };
    update_atoms(keyed(changed), keyed(arrivals), mirror);
}

bool StableOrder::fits(const Atoms& key) const {
    // A tie number (a Float) follows: it must stand where every stored key has a number.
    if (!plain_ || key.size() + 1 > shape_.size() || shape_[key.size()] != 0) return false;
    for (size_t k = 0; k < key.size(); ++k)
        if (key[k].kind == Atom::Obj || shape_[k] != (key[k].kind == Atom::Str)) return false;
    return true;
}

void StableOrder::note(const Atoms& stored) {
    if (!plain_) return;
    for (size_t k = 0; k < stored.size(); ++k) {
        if (stored[k].kind == Atom::Obj) {
            plain_ = false;
            return;
        }
        const uint8_t str = stored[k].kind == Atom::Str ? 1 : 0;
        if (k == shape_.size()) {
            shape_.push_back(str);
        } else if (shape_[k] != str) {
            plain_ = false;
            return;
        }
    }
}

void StableOrder::unshape() {
    plain_ = true;
    shape_.clear();
}

bool StableOrder::move_in_place(Keyed& changed, nb::handle mirror) {
    constexpr size_t kFew = 16;  // duplicates looked for pairwise (past that: a hash set)
    const size_t n = keys_.size();
    if (!plain_) return false;
    // The moves below read the lists' first n items in place (i, j < n): both must have them
    // (the mirror lists the members first; `reqs` is edited only here, unless by its reader).
    const auto has_members = [n](nb::handle list) {
        return static_cast<size_t>(PyList_GET_SIZE(list.ptr())) >= n;
    };
    if (!has_members(reqs) || (!mirror.is_none() && !has_members(mirror))) return false;
    std::unordered_set<PyObject*> seen;
    for (size_t k = 0; k < changed.size(); ++k) {  // (nothing changes before this holds)
        PyObject* r = changed[k].first.ptr();
        const Atoms& key = changed[k].second;
        if (!fits(key) || key_of_.count(r) == 0) return false;
        if (changed.size() > kFew) {
            if (!seen.insert(r).second) return false;
        } else {
            for (size_t q = 0; q < k; ++q)
                if (changed[q].first.ptr() == r) return false;
        }
    }
    struct Move {
        Stored* s;
        Atoms* key;
    };
    std::vector<Move> grew, shrank;
    for (auto& [r, key] : changed) {
        Stored& s = key_of_.find(r.ptr())->second;
        if (key_equal(s, key)) continue;
        const bool up = compare(s.atoms.data(), s.atoms.size() - 1, key.data(), key.size()) < 0;
        (up ? grew : shrank).push_back(Move{&s, &key});
    }
    // The tie numbers exactly as the sequential update gives them (its movers sorted by their
    // old keys), each mover then moved straight from its old place to its new one. Every key
    // has the one shape (numbers and strings at the same places, no Obj atom), so no
    // comparison calls Python or raises, and the comparisons (lexicographic over totally
    // ordered atoms) order the stored keys totally; these are unique: the result is the one
    // sorted order, whatever the order of the moves.
    const auto old_less = [](const Move& a, const Move& b) {
        return compare_stored(a.s->atoms, b.s->atoms) < 0;
    };
    std::sort(grew.begin(), grew.end(), [&old_less](const Move& a, const Move& b) {
        return old_less(b, a);
    });
    std::sort(shrank.begin(), shrank.end(), old_less);
    const auto relocate = [this, &mirror](const Move& m, double t) {
        const size_t i = find(*m.s);
        Atoms& key = *m.key;
        key.push_back(Atom::tie(t));
        // Where the new key goes among the others (the mover still stands at i, its old key
        // differs from the new one): past every key below it.
        const auto at = std::upper_bound(keys_.begin(), keys_.end(), key,
                                         [](const Atoms& k, const Stored* y) {
                                             return compare_stored(k, y->atoms) < 0;
                                         });
        const auto p = static_cast<size_t>(at - keys_.begin());
        const size_t j = p > i ? p - 1 : p;
        m.s->atoms = std::move(key);
        move_item(keys_.data(), i, j);
        move_item(list_items(reqs), i, j);
        if (!mirror.is_none()) move_item(list_items(mirror), i, j);
    };
    for (const Move& m : grew) relocate(m, static_cast<double>(--lo_));
    for (const Move& m : shrank) relocate(m, static_cast<double>(++hi_));
    return true;
}

void StableOrder::update_atoms(Keyed changed, Keyed arrivals, nb::handle mirror) {
    if (!mirror.is_none()) list_of(mirror);
    if (!mirror.is_none() && !arrivals.empty())  // the arrivals are re-inserted at their places
        check(PyList_SetSlice(mirror.ptr(), static_cast<Py_ssize_t>(keys_.size()),
                              PY_SSIZE_T_MAX, nullptr));
    if (!move_in_place(changed, mirror)) move_one_by_one(changed, mirror);
    for (auto& [r, key] : arrivals) insert(r, std::move(key), static_cast<double>(++hi_), mirror);
    if (lo_ <= -kExactTie || hi_ >= kExactTie) throw std::overflow_error("tie numbers");
}

void StableOrder::move_one_by_one(Keyed& changed, nb::handle mirror) {
    std::vector<Mover> grew, shrank;
    for (auto& [r, key] : changed) {
        auto it = key_of_.find(r.ptr());
        if (it == key_of_.end()) throw nb::key_error("StableOrder.update: not a member");
        if (key_equal(it->second, key)) continue;
        const size_t i = find(it->second);
        const bool up = compare(it->second.atoms.data(), it->second.atoms.size() - 1,
                                key.data(), key.size()) < 0;
        Mover m{std::move(it->second), r, std::move(key)};
        erase_at(i, r.ptr(), mirror);
        (up ? grew : shrank).push_back(std::move(m));
    }
    auto by_old = [](const Mover& a, const Mover& b) {
        return compare_stored(a.old.atoms, b.old.atoms) < 0;
    };
    // The last of those that grew, in the old order, is numbered first (lowest).
    std::sort(grew.begin(), grew.end(), [&by_old](const Mover& a, const Mover& b) {
        return by_old(b, a);
    });
    for (Mover& m : grew) insert(m.req, std::move(m.key), static_cast<double>(--lo_), mirror);
    std::sort(shrank.begin(), shrank.end(), by_old);
    for (Mover& m : shrank) insert(m.req, std::move(m.key), static_cast<double>(++hi_), mirror);
}

size_t StableOrder::position(nb::handle r) const {
    auto it = key_of_.find(r.ptr());
    if (it == key_of_.end()) throw nb::key_error("StableOrder.position: not a member");
    return find(it->second);
}

nb::tuple StableOrder::stored(nb::handle r) const {
    auto it = key_of_.find(r.ptr());
    if (it == key_of_.end()) throw nb::key_error("StableOrder.stored: not a member");
    nb::list out;
    const Atoms& atoms = it->second.atoms;
    for (size_t k = 0; k + 1 < atoms.size(); ++k) out.append(py(atoms[k]));
    const double t = it->second.tie();
    if (t == std::trunc(t))
        out.append(nb::int_(static_cast<int64_t>(t)));
    else
        out.append(nb::float_(t));
    return nb::tuple(out);
}

// ---- hrrn -------------------------------------------------------------------------------------

HrrnRound::HrrnRound(nb::list reqs, std::vector<double> ratio, std::vector<double> entry,
                     std::vector<double> arrival)
    : reqs_(std::move(reqs)),
      ratio_(std::move(ratio)),
      entry_(std::move(entry)),
      arrival_(std::move(arrival)),
      perm_(ratio_.size()) {
    if (entry_.size() != ratio_.size() || arrival_.size() != ratio_.size())
        throw nb::value_error("HrrnRound: columns of unequal length");
    std::iota(perm_.begin(), perm_.end(), int64_t{0});
}

bool HrrnRound::before(int64_t a, int64_t b) const {
    const auto i = static_cast<size_t>(a), j = static_cast<size_t>(b);
    if (ratio_.at(i) != ratio_.at(j)) return ratio_[i] < ratio_[j];
    if (entry_.at(i) != entry_.at(j)) return entry_[i] < entry_[j];
    if (arrival_.at(i) != arrival_.at(j)) return arrival_[i] < arrival_[j];
    static PyObject* const rid = interned("rid");
    if (static_cast<size_t>(std::max(a, b)) >= nb::len(reqs_))
        throw std::runtime_error("HrrnRound: the list shrank under the round");
    nb::object x = attr(reqs_[a], rid), y = attr(reqs_[b], rid);
    int lt = PyObject_RichCompareBool(x.ptr(), y.ptr(), Py_LT);
    check(lt);
    if (lt) return true;
    lt = PyObject_RichCompareBool(y.ptr(), x.ptr(), Py_LT);
    check(lt);
    return lt ? false : a < b;  // equal rids: list order (a stable sort)
}

void HrrnRound::select(size_t need) {
    const size_t n = perm_.size();
    const size_t k = std::min(n, std::max({need, 2 * sorted_, kFirst}));
    auto cmp = [this](int64_t a, int64_t b) { return before(a, b); };
    auto from = perm_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    auto upto = perm_.begin() + static_cast<std::ptrdiff_t>(k);
    if (k < n) std::nth_element(from, upto, perm_.end(), cmp);  // the rest all come after
    std::sort(from, upto, cmp);
    sorted_ = k;
}

int64_t HrrnRound::next() {
    if (done()) throw nb::stop_iteration();
    if (next_ >= sorted_) select(next_ + 1);
    return perm_.at(next_++);
}

const std::vector<int64_t>& HrrnRound::full() {
    if (sorted_ < perm_.size()) select(perm_.size());
    return perm_;
}

void HrrnColumns::clear() {
    reqs = nb::list();
    held_.clear();
    for (auto* col : {&q_, &work_, &override_, &entry_, &arrival_}) col->clear();
    fixed_.clear();
}

void HrrnColumns::fill_key(nb::handle r, nb::handle deferred, size_t i) {
    static PyObject* const fill_len = interned("fill_len");
    static PyObject* const matched = interned("num_matched_prefix_tokens");
    static PyObject* const rid = interned("rid");
    const int64_t work = as_int(attr(r, fill_len)) - as_int(attr(r, matched));
    work_.at(i) = static_cast<double>(work > 0 ? work : 1);
    const int dep = PySequence_Contains(deferred.ptr(), attr(r, rid).ptr());
    check(dep);
    if (dep)
        override_.at(i) = INFINITY;
    else if (work <= 0)
        override_.at(i) = -INFINITY;
    fixed_.at(i) = dep || work <= 0;
}

void HrrnColumns::append(nb::handle r, nb::handle deferred) {
    static PyObject* const q = interned("queue_entry_processed_tokens");
    static PyObject* const entry = interned("queue_entry_time");
    static PyObject* const arrival = interned("arrival_time");
    if (!held_.insert(r.ptr()).second) throw nb::value_error("HrrnColumns: already a member");
    q_.push_back(as_double(attr(r, q)));
    entry_.push_back(as_double(attr(r, entry)));
    arrival_.push_back(as_double(attr(r, arrival)));
    work_.push_back(1.0);
    override_.push_back(0.0);
    fixed_.push_back(0);
    reqs.append(r);
    fill_key(r, deferred, q_.size() - 1);
}

void HrrnColumns::erase_at(size_t i) {
    const auto at = static_cast<std::ptrdiff_t>(i);
    for (auto* col : {&q_, &work_, &override_, &entry_, &arrival_}) col->erase(col->begin() + at);
    fixed_.erase(fixed_.begin() + at);
    list_delete(reqs, i);
}

size_t HrrnColumns::listed_at(nb::handle r) const {
    PyObject* list = reqs.ptr();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i)
        if (PyList_GET_ITEM(list, i) == r.ptr()) return static_cast<size_t>(i);
    throw nb::value_error("HrrnColumns: not a member");
}

void HrrnColumns::remove(nb::handle r) {
    if (held_.erase(r.ptr()) == 0) return;
    erase_at(listed_at(r));
}

HrrnRound HrrnColumns::advance(nb::handle changed, nb::handle arrivals, nb::handle deferred,
                               nb::handle processed_tokens) {
    Items moved(changed), news(arrivals);
    std::unordered_map<PyObject*, size_t> index;  // for many changed: one pass over the list
    if (moved.size() > 8)
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(reqs.ptr()); ++i)
            index.emplace(PyList_GET_ITEM(reqs.ptr(), i), static_cast<size_t>(i));
    for (size_t k = 0; k < moved.size(); ++k) {
        auto it = index.find(moved[k].ptr());
        fill_key(moved[k], deferred, it != index.end() ? it->second : listed_at(moved[k]));
    }
    for (size_t k = 0; k < news.size(); ++k) append(news[k], deferred);
    // -(max(waited, 0) / work) in float64, as numpy computes it (the processed-token count
    // and the entry counts are exact doubles); a request that has not waited scores -0.0.
    const double processed = as_double(processed_tokens);
    const size_t n = q_.size();
    std::vector<double> ratio(n);
    for (size_t i = 0; i < n; ++i) {
        const double waited = std::max(processed - q_[i], 0.0);
        ratio[i] = fixed_[i] ? override_[i] : -(waited / work_[i]);
    }
    return HrrnRound(reqs, std::move(ratio), entry_, arrival_);
}

void HrrnColumns::apply(HrrnRound& round) {
    const std::vector<int64_t>& perm = round.full();
    if (perm.size() != q_.size()) throw nb::value_error("HrrnColumns.apply: another round");
    auto permuted = [&perm](const auto& col) {
        std::remove_const_t<std::remove_reference_t<decltype(col)>> out(col.size());
        for (size_t k = 0; k < perm.size(); ++k) out[k] = col.at(static_cast<size_t>(perm[k]));
        return out;
    };
    nb::list sorted;
    for (int64_t i : perm) sorted.append(reqs[i]);
    q_ = permuted(q_);
    work_ = permuted(work_);
    override_ = permuted(override_);
    entry_ = permuted(entry_);
    arrival_ = permuted(arrival_);
    fixed_ = permuted(fixed_);
    reqs = std::move(sorted);
}

// ---- bindings ---------------------------------------------------------------------------------

namespace {
std::vector<double> column(nb::handle values) {
    Items items(values);  // a numpy array goes through a list of floats
    std::vector<double> out(items.size());
    for (size_t i = 0; i < items.size(); ++i) out[i] = as_double(items[i]);
    return out;
}

void bind_stable_order(nb::module_& m) {
    nb::class_<StableOrder>(m, "StableOrder")
        .def(nb::init<>())
        .def_prop_ro("reqs", [](const StableOrder& o) { return o.reqs; })
        .def("__len__", &StableOrder::size)
        .def("__contains__", &StableOrder::contains)
        .def("remove", &StableOrder::remove, "r"_a, "mirror"_a = nb::none())
        .def("reset", &StableOrder::reset, "pre"_a, "keys"_a)
        .def("place", &StableOrder::place, "r"_a, "j"_a)
        .def("update", &StableOrder::update, "changed"_a, "arrivals"_a,
             "mirror"_a = nb::none())
        .def("position", &StableOrder::position, "r"_a)
        .def("stored", &StableOrder::stored, "r"_a);
}

void bind_hrrn(nb::module_& m) {
    nb::class_<HrrnRound>(m, "HrrnRound")
        .def("__init__",
             [](HrrnRound* self, nb::list reqs, nb::handle ratio, nb::handle entry,
                nb::handle arrival) {
                 new (self) HrrnRound(std::move(reqs), column(ratio), column(entry),
                                      column(arrival));
             },
             "reqs"_a, "ratio"_a, "entry"_a, "arrival"_a)
        .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
        .def("__next__", &HrrnRound::next);
    nb::class_<HrrnColumns>(m, "HrrnColumns")
        .def(nb::init<>())
        .def_prop_ro("reqs", [](const HrrnColumns& c) { return c.reqs; })
        .def("clear", &HrrnColumns::clear)
        .def("remove", &HrrnColumns::remove, "r"_a)
        .def("advance", &HrrnColumns::advance, "changed"_a, "arrivals"_a, "deferred"_a,
             "processed_tokens"_a)
        .def("apply", &HrrnColumns::apply, "round"_a);
}
}  // namespace

void bind_order(nb::module_& m) {
    bind_stable_order(m);
    bind_hrrn(m);
}

}  // namespace radixsched
