// Kept orders (radixsched.native.orders' engines call these once per round): a stable sort of
// the waiting list by a per-request key, maintained across rounds, and hrrn's per-request
// columns with its lazily sorted round order. Keys are Python tuples compared here exactly as
// Python compares them; the request objects stay Python objects, held by a Python list that
// the scheduler reads and edits directly.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace radixsched {

// One element of a key. Int: an int (bool included) that fits int64; Float: a float other
// than nan; Str: an exact str; Obj: anything else, compared by Python's own operators. `obj`
// is the Python element (null only for a tie number, which is a Float).
struct Atom {
    enum Kind : uint8_t { Int, Float, Str, Obj };
    Kind kind = Int;
    int64_t i = 0;
    double d = 0.0;
    nanobind::object obj;

    static Atom of(nanobind::handle h);
    static Atom tie(double t);
};

using Atoms = std::vector<Atom>;

// -1, 0, 1 as Python orders the two elements (== first, then <); int and float exactly.
int compare(const Atom& a, const Atom& b);
// Python's tuple comparison over atoms [a, a + na) and [b, b + nb).
int compare(const Atom* a, size_t na, const Atom* b, size_t nb);

// Whether re-keying `moving` of a kept order's `total` requests costs more than one stable
// sort of the list: more than 32 of them and more than a quarter of the list (the Python
// round's native/orders.py _worth_rebuilding; a native round then declines, Python rebuilds).
inline bool worth_rebuilding(size_t moving, size_t total) {
    constexpr size_t kMin = 32, kShare = 4;
    return moving > kMin && kShare * moving > total;
}

// Requests in the order a stable sort by a key leaves them, maintained across rounds.
// Invariants: `reqs[i]`'s stored key is `*keys[i]` (its key, then its tie number, a unique
// number per member), `keys` ascends strictly, and every tie number lies strictly between
// `lo` and `hi`. A request whose key grew stood before every request that already had its
// new key (a stable sort keeps it first among them), so it gets a tie number below all;
// one whose key shrank gets one above all; arrivals come last, in append order. Several
// movers are numbered in their old order, so they keep their order among themselves.
class StableOrder {
public:
    nanobind::list reqs;

    size_t size() const { return keys_.size(); }
    bool contains(nanobind::handle r) const { return key_of_.count(r.ptr()) != 0; }
    bool remove(nanobind::handle r, nanobind::handle mirror);
    void reset(nanobind::handle pre, nanobind::handle keys);
    bool place(nanobind::handle r, int64_t j);
    void update(nanobind::handle changed, nanobind::handle arrivals, nanobind::handle mirror);
    size_t position(nanobind::handle r) const;
    nanobind::tuple stored(nanobind::handle r) const;

    // The same for a kept order built in C++ (dfs_order.cpp), its keys given as atoms:
    // `fill(i, key)` writes the key of `pre`'s i-th request into the empty `key`.
    using KeyFill = std::function<void(size_t, Atoms&)>;
    using Keyed = std::vector<std::pair<nanobind::object, Atoms>>;  // (request, key)
    void reset_atoms(nanobind::handle pre, const KeyFill& fill);
    void update_atoms(Keyed changed, Keyed arrivals, nanobind::handle mirror);

private:
    struct Stored {
        nanobind::object req;  // keeps the member (the map's key) alive whatever edits `reqs`
        Atoms atoms;           // the key, then the tie number
        double tie() const { return atoms.back().d; }
    };
    struct Mover {
        Stored old;
        nanobind::object req;
        Atoms key;
    };

    using KeyOf = std::unordered_map<PyObject*, Stored>;
    // reset()'s work (on an exception the order is left empty).
    void rebuild(nanobind::handle pre, const KeyFill& fill);
    size_t find(const Stored& s) const;  // where `s` (a member's stored key) stands
    size_t bisect_right(const Stored& s) const;
    void insert(nanobind::handle r, Atoms key, double t, nanobind::handle mirror);
    void erase_at(size_t i, PyObject* r, nanobind::handle mirror);
    static bool key_equal(const Stored& s, const Atoms& key);
    static bool less(const Stored* x, const Stored* y);
    // The stored keys' shape: whether `key` (a key without its tie number) has it and stands
    // within it; `note` a stored key (its tie included): extends the shape, or drops `plain_`.
    bool fits(const Atoms& key) const;
    void note(const Atoms& stored);
    void unshape();  // no member: no shape yet
    // update's movers: straight from their old places to their new ones (false, nothing done:
    // keys of another shape, which may raise or compare inconsistently, a non-member, a
    // duplicate, or many of them), else one by one (all erased, then inserted, as before).
    bool move_in_place(Keyed& changed, nanobind::handle mirror);
    void move_one_by_one(Keyed& changed, nanobind::handle mirror);

    std::vector<const Stored*> keys_;                 // point into key_of_'s nodes
    std::unordered_map<PyObject*, Stored> key_of_;  // member -> its stored key
    int64_t lo_ = 0;
    int64_t hi_ = 0;
    // Every key stored since the last rebuild (tie numbers included) had at each place what
    // the others have there: a number (Int or Float: shape_ 0) or a Str (1), never an Obj.
    bool plain_ = true;
    std::vector<uint8_t> shape_;
};

// One hrrn round's order over the list as it stands: ascending (ratio, entry, arrival, rid,
// position), a total order. Handed out lazily: the head is selected (nth_element) and sorted;
// a reader that gets past it doubles it. `reqs` is read only for rids, on exact ties.
class HrrnRound {
public:
    static constexpr size_t kFirst = 16;  // most rounds admit a handful of requests

    HrrnRound(nanobind::list reqs, std::vector<double> ratio, std::vector<double> entry,
              std::vector<double> arrival);
    bool done() const { return next_ >= perm_.size(); }
    int64_t next();
    const std::vector<int64_t>& full();  // the whole order

private:
    bool before(int64_t a, int64_t b) const;
    void select(size_t need);

    nanobind::list reqs_;
    std::vector<double> ratio_, entry_, arrival_;
    std::vector<int64_t> perm_;
    size_t sorted_ = 0;  // perm_[:sorted_] is the order's head
    size_t next_ = 0;
};

// hrrn's per-request columns, aligned with `reqs` (the engine's members in list order).
class HrrnColumns {
public:
    nanobind::list reqs;

    void clear();
    void remove(nanobind::handle r);
    // Re-fill the key columns of `changed`, append `arrivals`, and compute this round's ratios.
    HrrnRound advance(nanobind::handle changed, nanobind::handle arrivals,
                      nanobind::handle deferred, nanobind::handle processed_tokens);
    // Sort the members (and their columns) by `round`'s whole order.
    void apply(HrrnRound& round);

private:
    void fill_key(nanobind::handle r, nanobind::handle deferred, size_t i);
    void append(nanobind::handle r, nanobind::handle deferred);
    void erase_at(size_t i);
    size_t listed_at(nanobind::handle r) const;  // identity, as list.index (Req has no __eq__)

    std::unordered_set<PyObject*> held_;
    std::vector<double> q_, work_, override_, entry_, arrival_;
    std::vector<uint8_t> fixed_;  // the ratio is `override_` (deferred, or no work left)
};

void bind_order(nanobind::module_& m);

}  // namespace radixsched
