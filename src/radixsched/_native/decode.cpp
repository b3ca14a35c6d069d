// See decode.hpp. The binding, `DecodeBatch`, is those columns with the requests of their rows:
// radixsched.native.scheduler's NativeRunningBatch keeps one in step with the running batch.
#include "decode.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "pool.hpp"
#include "py_attr.hpp"
#include "stand_in_py.hpp"
#include "stepcost.hpp"

namespace radixsched {

namespace {
int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// DecodeCols::need of a row holding `have` slots whose next token goes at `fill - 1`.
inline int64_t need_of(int64_t fill, int64_t have, int64_t steps, int64_t page) {
    int64_t end = fill + (steps - 1);
    if (page > 1) end = -floor_div(-end, page) * page;
    return std::max<int64_t>(end - have, 0);
}
}  // namespace

DecodeRow DecodeCols::row(size_t i) const {
    return {fill_.at(i), have_.at(i), out_len_.at(i), max_new_.at(i), ignore_eos_.at(i) != 0,
            stops_.at(i) != 0};
}

void DecodeCols::push(const DecodeRow& r) {
    fill_.push_back(r.fill);
    have_.push_back(r.have);
    out_len_.push_back(r.out_len);
    max_new_.push_back(r.max_new);
    ignore_eos_.push_back(r.ignore_eos);
    stops_.push_back(r.stops);
    stopping_ += r.stops;
}

void DecodeCols::remove_at(const std::vector<int64_t>& positions) {
    const size_t n = size();
    // Checked first (nothing changes on bad positions): strictly ascending rows of the batch.
    for (size_t p = 0; p < positions.size(); ++p)
        if (positions[p] < 0 || size_t(positions[p]) >= n ||
            (p > 0 && positions[p] <= positions[p - 1]))
            throw std::invalid_argument("remove_at: positions must be ascending rows of the batch");
    if (positions.empty()) return;
    for (int64_t i : positions) stopping_ -= stops_[size_t(i)];
    // The kept rows between removed ones move down a whole run at a time (a memmove per run
    // and column); the rows before the first removed one stay where they are.
    const auto squeeze = [&positions, n](auto& col) {
        auto w = col.begin() + positions[0];
        for (size_t p = 0; p < positions.size(); ++p) {
            const size_t from = size_t(positions[p]) + 1;
            const size_t to = p + 1 < positions.size() ? size_t(positions[p + 1]) : n;
            w = std::move(col.begin() + int64_t(from), col.begin() + int64_t(to), w);
        }
        col.erase(w, col.end());
    };
    squeeze(fill_);
    squeeze(have_);
    squeeze(out_len_);
    squeeze(max_new_);
    squeeze(ignore_eos_);
    squeeze(stops_);
}

int64_t DecodeCols::need(size_t i, int64_t steps, int64_t page) const {
    return need_of(fill_.at(i), have_.at(i), steps, page);
}

// The loops over all rows below index within size() (operator[]: checked where
// _GLIBCXX_ASSERTIONS is on); page 1, the common case, has no division.
int64_t DecodeCols::need_total(int64_t steps, int64_t page) const {
    const size_t n = size();
    int64_t total = 0;
    if (page == 1) {
        for (size_t i = 0; i < n; ++i)
            total += std::max<int64_t>(fill_[i] + (steps - 1) - have_[i], 0);
    } else {
        for (size_t i = 0; i < n; ++i) total += need_of(fill_[i], have_[i], steps, page);
    }
    return total;
}

int64_t DecodeCols::max_steps_that_fit(int64_t limit, int64_t room, int64_t page) const {
    const size_t n = size();
    if (page == 1 && n > 0) {
        int64_t least = fill_[0] - 1 - have_[0], sum = 0;
        for (size_t i = 0; i < n; ++i) {
            const int64_t short_ = fill_[i] - 1 - have_[i];
            least = std::min(least, short_);
            sum += short_;
        }
        if (least >= 0)
            return std::max<int64_t>(1, std::min(limit, floor_div(room - sum, int64_t(n))));
    }
    int64_t lo = 1, hi = limit;
    while (lo < hi) {
        const int64_t mid = floor_div(lo + hi + 1, 2);
        if (need_total(mid, page) <= room)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

std::pair<int64_t, int64_t> DecodeCols::decode_tokens(int64_t clip) const {
    int64_t full = 0, all = 0;
    for (size_t i = 0; i < size(); ++i) {
        const int64_t rem = std::min(std::max<int64_t>(max_new_[i] - out_len_[i], 0), clip);
        all += rem;
        full += ignore_eos_[i] ? rem : 0;
    }
    return {full, all - full};
}

std::pair<int64_t, int64_t> DecodeCols::progress() const {
    int64_t out = 0, most = 0;
    for (size_t i = 0; i < size(); ++i) {
        out += out_len_[i];
        most += max_new_[i];
    }
    return {out, most};
}

int64_t DecodeCols::to_go(size_t i) const {
    return std::max<int64_t>(max_new_.at(i) - out_len_.at(i), 0);
}

int64_t DecodeCols::min_left() const {
    if (size() == 0) throw std::invalid_argument("min_left: no rows");
    int64_t least = max_new_[0] - out_len_[0];
    for (size_t i = 1; i < size(); ++i) least = std::min(least, max_new_[i] - out_len_[i]);
    return least;
}

std::vector<int64_t> DecodeCols::maybe_finished() const {
    std::vector<int64_t> rows;
    for (size_t i = 0; i < size(); ++i)
        if (can_stop() || out_len_[i] >= max_new_[i]) rows.push_back(int64_t(i));
    return rows;
}

int64_t DecodeCols::advance(int64_t k, int64_t page) {
    int64_t total = 0;
    for (size_t i = 0; i < size(); ++i) {
        const int64_t n = need_of(fill_[i], have_[i], k, page);
        total += n;
        have_[i] += n;
        fill_[i] += k;
        out_len_[i] += k;
    }
    return total;
}

int64_t DecodeCols::total_fill() const {
    int64_t total = 0;
    for (int64_t f : fill_) total += f;
    return total;
}

size_t search_left(const std::vector<double>& ends, size_t n, double key) {
    const auto less = [](double a, double b) { return a < b || (b != b && a == a); };
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = lo + ((hi - lo) >> 1);
        if (less(ends.at(mid), key))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

}  // namespace radixsched

namespace nb = nanobind;
using namespace nb::literals;
using radixsched::DecodeCols;
using radixsched::DecodeRow;

namespace radixsched {
void kv_release(nb::handle kv, nb::handle req, bool cache_kv);  // kv.hpp (kv.cpp)
void append_claimed(nb::handle req, Pool& pool, int64_t n);    // kv.hpp (kv.cpp)
}  // namespace radixsched

namespace {

using Grid = nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>;

// A numpy array that owns a copy of `v` (as `Out`: bytes read as bools).
template <class Out, class T>
nb::ndarray<nb::numpy, Out, nb::ndim<1>> copy_out(const std::vector<T>& v) {
    const size_t n = v.size();
    auto holder = std::make_unique<Out[]>(std::max<size_t>(n, 1));
    for (size_t i = 0; i < n; ++i) holder[i] = static_cast<Out>(v[i]);
    Out* data = holder.get();
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<Out*>(p); });
    holder.release();  // the capsule owns it now
    return nb::ndarray<nb::numpy, Out, nb::ndim<1>>(data, {n}, owner);
}

namespace py = radixsched::py;

// The attribute names this file reads, interned once (held for the process's life): a lookup
// by C string would build and hash a new str each time.
struct Names {
    PyObject *sampling, *output_ids, *prompt_ids, *kv_row, *kv_len, *max_new_tokens,
        *ignore_eos, *stop_token_ids, *scripted_output, *rid, *times, *token_times, *finish;
};
const Names& names() {
    static const Names n = [] {
        const auto in = [](const char* s) {
            PyObject* o = PyUnicode_InternFromString(s);
            if (o == nullptr) throw nb::python_error();
            return o;
        };
        return Names{in("sampling"),       in("output_ids"),     in("prompt_ids"),
                     in("kv_row"),         in("kv_len"),
                     in("max_new_tokens"), in("ignore_eos"),     in("stop_token_ids"),
                     in("scripted_output"), in("rid"),            in("times"),
                     in("token_times"),    in("finish")};
    }();
    return n;
}

int64_t length(nb::handle h, PyObject* name) { return py::len_of(py::get(h, name)); }

bool truthy(nb::handle h) {
    const int t = PyObject_IsTrue(h.ptr());
    if (t < 0) throw nb::python_error();
    return t != 0;
}

// A request whose tokens are pure stand-ins: no stop ids, no script (CostModelRunner.tokens_at).
// `stops`: its row's (unset: it has no stop ids, not read again).
bool plain(nb::handle r, bool stops) {
    const Names& k = names();
    if (stops && truthy(py::get(py::get(r, k.sampling), k.stop_token_ids))) return false;
    return py::get(r, k.scripted_output).is_none();
}

// The stand-in tokens at positions [first, first + k) of a plain request whose rid hashes to
// `h` (sim/cost/runner.py's _stand_in: splitmix64(h ^ p * golden) mod vocab), as a list.
nb::object stand_ins(uint64_t h, int64_t first, int64_t k, uint64_t vocab) {
    nb::object out = nb::steal(PyList_New(k));
    if (!out.is_valid()) throw nb::python_error();
    for (int64_t c = 0; c < k; ++c) {
        const uint64_t p = static_cast<uint64_t>(first + c);
        const uint64_t v = radixsched::stand_in(h, p, vocab);
        // PyLong_FromLong where it fits (every vocabulary in practice): the unsigned call
        // forwards there for small values anyway, one call deeper. (A fresh int each: one
        // shared int per id, tried, cost more time than it saved: its count's write misses
        // the cache per token, twice with the release, where a fresh one is a warm block.)
        PyObject* t = v <= uint64_t(LONG_MAX) ? PyLong_FromLong(long(v))
                                              : PyLong_FromUnsignedLongLong(v);
        if (t == nullptr) throw nb::python_error();
        PyList_SET_ITEM(out.ptr(), Py_ssize_t(c), t);  // steals t
    }
    return out;
}

// `dst.extend(items)`, without the method call when dst is a list.
void extend_list(nb::handle dst, nb::handle items) {
    if (PyList_CheckExact(dst.ptr())) {
        const Py_ssize_t n = PyList_GET_SIZE(dst.ptr());
        if (PyList_SetSlice(dst.ptr(), n, n, items.ptr()) < 0) throw nb::python_error();
    } else {
        dst.attr("extend")(items);
    }
}

// The dense roofline's decode step (sim/cost/roofline.py: CostModel._dense_step_s of `b` decode
// entries, no extend, context `ctx`), its operations in their order on doubles, so each step is
// the float Python gives. What depends only on the batch size (the efficiency factor, the fixed
// seconds) is asked of Python once per size (`per_batch(b) -> (factor, fixed)`) and kept.
struct DecodeCost {
    DecodeCost(double lin, double attn, double flops, double weight, double kv, double bytes,
               nb::object per_batch)
        : rates{lin, attn, flops, weight, kv, bytes}, per_batch(std::move(per_batch)) {}

    radixsched::DenseRates rates;
    nb::object per_batch;
    std::unordered_map<int64_t, std::pair<double, double>> memo;

    std::pair<double, double> of_batch(int64_t b) {
        const auto it = memo.find(b);
        if (it != memo.end()) return it->second;
        const nb::tuple t = nb::cast<nb::tuple>(per_batch(b));
        const std::pair<double, double> v{nb::cast<double>(t[0]), nb::cast<double>(t[1])};
        memo.emplace(b, v);
        return v;
    }

    // Appends the durations of steps [out.size(), to) of `b` entries whose contexts sum to
    // `total_ctx` before step 0 (step k reads k more tokens per entry).
    void extend(std::vector<double>& out, int64_t b, int64_t total_ctx, int64_t to) {
        const auto [factor, fixed] = of_batch(b);
        for (int64_t k = int64_t(out.size()); k < to; ++k) {
            const auto ctx = double(total_ctx + k * b);
            out.push_back(rates.step(double(b), ctx, ctx, factor, fixed));
        }
    }
};

constexpr int64_t kProbeSteps = 8;  // steps timed before a whole jump is (DecodeBatch::steps)

// The columns with the requests of their rows (held, compared by identity).
struct DecodeBatch {
    explicit DecodeBatch(bool has_eos) : has_eos(has_eos) {}

    bool has_eos;
    DecodeCols cols;
    std::vector<nb::object> reqs;
    // End time of every deferred decode step, as Python floats: a settled request's token
    // times are these objects, shared by every row of the step (one float per step, not per
    // token: the memory of a long trace's token times).
    nb::list log_;
    std::vector<double> durs_, ends_;  // the steps the last `steps` or `jump` timed

    // A request's row as its Python state gives it (DecodeCols.of of the Python columns).
    DecodeRow row_of(nb::handle r) const {
        const Names& k = names();
        const nb::object s = py::get(r, k.sampling);
        const int64_t out = length(r, k.output_ids);
        const bool ignore = truthy(py::get(s, k.ignore_eos));
        return {length(r, k.prompt_ids) + out,
                length(r, k.kv_row),
                out,
                py::get_int(s, k.max_new_tokens),
                ignore,
                truthy(py::get(s, k.stop_token_ids)) || (has_eos && !ignore)};
    }

    // fill and have of a request as its Python state gives them (row_of's first two).
    static std::pair<int64_t, int64_t> fill_have_of(nb::handle r) {
        const Names& k = names();
        return {length(r, k.prompt_ids) + length(r, k.output_ids), length(r, k.kv_row)};
    }

    void extend(nb::handle more) {
        for (nb::handle r : more) {
            cols.push(row_of(r));
            reqs.push_back(nb::borrow(r));
        }
    }

    void remove_at(const std::vector<int64_t>& positions) {
        cols.remove_at(positions);  // checks the positions first
        if (positions.empty()) return;
        size_t w = size_t(positions[0]), p = 0;  // the rows before it stay
        for (size_t i = w; i < reqs.size(); ++i) {
            if (p < positions.size() && static_cast<size_t>(positions[p]) == i) {
                ++p;
                continue;
            }
            if (w != i) reqs[w] = std::move(reqs[i]);  // never onto itself: that drops it
            ++w;
        }
        reqs.resize(w);
    }

    // Ascending rows of the requests in `gone` (by identity).
    std::vector<int64_t> positions_of(nb::handle gone) const {
        std::unordered_set<PyObject*> ids;
        for (nb::handle r : gone) ids.insert(r.ptr());
        std::vector<int64_t> rows;
        for (size_t i = 0; i < reqs.size(); ++i)
            if (ids.count(reqs[i].ptr())) rows.push_back(int64_t(i));
        return rows;
    }

    nb::list req_list(const std::vector<int64_t>* rows) const {
        nb::list out;
        if (rows == nullptr)
            for (const auto& r : reqs) out.append(r);
        else
            for (int64_t i : *rows) out.append(reqs.at(size_t(i)));
        return out;
    }

    // running.py's retraction_order of the rows' requests (the columns' out_len: what the
    // requests will have once settled), sorted as Python's stable sorted(..., reverse=True):
    // descending keys, ties in row order. "length": (out_len, -len(prompt_ids)); "priority":
    // (prio_value(r, sign) * -sign, then as length); "newest": the rows' order. None (Python
    // decides) for another policy or a priority past int64 (prio_value's int()).
    nb::object retraction_order(const std::string& policy, int64_t sign) const {
        if (policy == "newest") return req_list(nullptr);
        const bool by_prio = policy == "priority";
        if (!by_prio && policy != "length") return nb::none();
        struct Key {
            __int128 prio;  // prio_value * -sign: exact for any int64 pair
            int64_t out, neg_prompt;
            bool operator>(const Key& o) const {
                if (prio != o.prio) return prio > o.prio;
                if (out != o.out) return out > o.out;
                return neg_prompt > o.neg_prompt;
            }
        };
        const Names& k = names();
        std::vector<Key> keys(reqs.size());
        for (size_t i = 0; i < reqs.size(); ++i) {
            keys[i] = {0, cols.out_len()[i], -length(reqs[i], k.prompt_ids)};
            if (!by_prio) continue;
            const std::optional<int64_t> p = priority_of(reqs[i], sign);
            if (!p) return nb::none();
            keys[i].prio = static_cast<__int128>(*p) * -static_cast<__int128>(sign);
        }
        std::vector<int64_t> rows(reqs.size());
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = int64_t(i);
        std::stable_sort(rows.begin(), rows.end(), [&keys](int64_t a, int64_t b) {
            return keys[size_t(a)] > keys[size_t(b)];
        });
        return req_list(&rows);
    }

    // policies.py's prio_value: int(r.priority), None as the least important extreme; nothing
    // for a priority past int64.
    static std::optional<int64_t> priority_of(nb::handle r, int64_t sign) {
        static PyObject* const name = PyUnicode_InternFromString("priority");
        if (name == nullptr) throw nb::python_error();
        const nb::object p = py::get(r, name);
        if (p.is_none()) return sign > 0 ? INT64_MAX : INT64_MIN;
        const nb::object v = nb::steal(PyNumber_Long(p.ptr()));
        if (!v.is_valid()) throw nb::python_error();
        int overflow = 0;
        const long long got = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
        if (overflow != 0) return std::nullopt;
        if (got == -1 && PyErr_Occurred()) throw nb::python_error();
        return int64_t(got);
    }

    // What settling `rows` owes each (from the requests' state): tokens, slots, the fill.
    struct Owed {
        std::vector<int64_t> ks, slots, fills;
    };
    Owed owed_of(const std::vector<int64_t>& rows) const {
        Owed o;
        o.ks.reserve(rows.size());
        o.slots.reserve(rows.size());
        o.fills.reserve(rows.size());
        for (int64_t i : rows) {
            const DecodeRow now = cols.row(size_t(i));
            const auto [fill, have] = fill_have_of(reqs.at(size_t(i)));
            o.ks.push_back(now.fill - fill);
            o.slots.push_back(now.have - have);
            o.fills.push_back(now.fill);
        }
        return o;
    }

    // Rows (indices into `rows`) owing the same k > 0 tokens, not `done`, form a group:
    // (indices, their requests, positions [m, k]: the owed positions [fill - k, fill) of each),
    // so that the runner is asked once per distinct k.
    nb::list groups_of(const std::vector<int64_t>& rows, const Owed& o,
                       const std::vector<uint8_t>& done) const {
        std::vector<int64_t> distinct;
        for (size_t j = 0; j < rows.size(); ++j)
            if (o.ks[j] > 0 && !done.at(j) &&
                std::find(distinct.begin(), distinct.end(), o.ks[j]) == distinct.end())
                distinct.push_back(o.ks[j]);
        nb::list groups;
        for (int64_t k : distinct) {
            std::vector<int64_t> idx;
            for (size_t j = 0; j < rows.size(); ++j)
                if (o.ks[j] == k && !done[j]) idx.push_back(int64_t(j));
            nb::list sub;
            auto grid = std::make_unique<int64_t[]>(idx.size() * size_t(k));
            for (size_t g = 0; g < idx.size(); ++g) {
                const size_t j = size_t(idx[g]);
                sub.append(reqs.at(size_t(rows[j])));
                for (int64_t c = 0; c < k; ++c) grid[g * size_t(k) + size_t(c)] = o.fills[j] - k + c;
            }
            int64_t* data = grid.get();
            nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
            grid.release();  // the capsule owns it now
            groups.append(nb::make_tuple(nb::cast(idx), sub,
                                         nb::cast(Grid(data, {idx.size(), size_t(k)}, owner),
                                                  nb::rv_policy::move)));
        }
        return groups;
    }

    // What settling `rows` writes: (requests, tokens owed, slots owed, fills, groups).
    nb::tuple owed(const std::vector<int64_t>& rows) const {
        const Owed o = owed_of(rows);
        return nb::make_tuple(req_list(&rows), nb::cast(o.ks), nb::cast(o.slots),
                              nb::cast(o.fills), groups_of(rows, o, std::vector<uint8_t>(rows.size())));
    }

    // Settles `rows` (ascending): each request gets the tokens its row is ahead by, the last
    // that many end times of the log, kv_len = fill - 1, and the slots it is owed, claimed
    // from `pool` in row order and appended to its KV row. Tokens: a plain request's (no stop
    // ids, no script) are the runner's stand-ins when `stand_in` is its (rid -> hash memo,
    // vocabulary) (CostModelRunner.native_tokens), computed here; the others are asked of
    // `tokens_at(reqs, positions)` once per distinct number owed (they depend only on request
    // and position).
    void settle(const std::vector<int64_t>& rows, nb::handle tokens_at, nb::handle stand_in,
                radixsched::Pool& pool) const {
        const Names& names_ = names();
        const Owed o = owed_of(rows);
        std::vector<nb::object> toks(rows.size());
        std::vector<uint8_t> done(rows.size(), 0);
        std::vector<uint64_t> hash(rows.size(), 0);  // a plain row's rid hash (done)
        uint64_t vocab = 0;
        size_t owing = 0, plain_rows = 0;  // rows owing tokens; those of them done here
        for (size_t j = 0; j < rows.size(); ++j) owing += o.ks[j] > 0;
        if (!stand_in.is_none()) {
            const nb::handle hashes = stand_in[0];
            vocab = nb::cast<uint64_t>(stand_in[1]);
            if (vocab == 0) throw std::invalid_argument("settle: an empty vocabulary");
            for (size_t j = 0; j < rows.size(); ++j) {
                const nb::object& r = reqs.at(size_t(rows[j]));
                if (o.ks[j] <= 0 || !plain(r, cols.stops().at(size_t(rows[j])) != 0)) continue;
                const nb::object h = nb::steal(
                    radixsched::memo_item(hashes.ptr(), py::get(r, names_.rid).ptr()));
                if (!h.is_valid()) throw nb::python_error();
                hash[j] = nb::cast<uint64_t>(h);
                done[j] = 1;
                ++plain_rows;
            }
        }
        if (plain_rows < owing) {
            for (nb::handle group : groups_of(rows, o, done)) {
                const nb::tuple g = nb::borrow<nb::tuple>(group);
                const auto idx = nb::cast<std::vector<int64_t>>(g[0]);
                const nb::object got = tokens_at(g[1], g[2]).attr("tolist")();
                for (size_t i = 0; i < idx.size(); ++i) toks.at(size_t(idx[i])) = got[i];
            }
        }
        for (size_t j = 0; j < rows.size(); ++j) {
            const nb::object& r = reqs.at(size_t(rows[j]));
            const int64_t k = o.ks[j];
            if (k > 0) {
                const nb::object out = py::get(r, names_.output_ids);
                // A list of the tokens, then one slice assignment: cheaper than an append each.
                const int64_t first = o.fills[j] - k;
                extend_list(out, done[j] ? stand_ins(hash[j], first, k, vocab) : toks[j]);
                extend_log_tail(py::get(py::get(r, names_.times), names_.token_times), k);
                py::set_int(r, names_.kv_len, o.fills[j] - 1);
            }
            // Claimed straight into its KV row (kv.cpp: an int32 row, a plain copy).
            if (o.slots[j] > 0) radixsched::append_claimed(r, pool, o.slots[j]);
        }
    }

    // `dst.extend(the last k end times of the log)` (the log's float objects): one slice, one
    // slice assignment (cheaper than an append each).
    void extend_log_tail(nb::handle dst, int64_t k) const {
        const Py_ssize_t n = PyList_GET_SIZE(log_.ptr());
        if (k > n) throw std::logic_error("settle: a row is ahead of the decode log");
        const nb::object tail = nb::steal(PyList_GetSlice(log_.ptr(), n - k, n));
        if (!tail.is_valid()) throw nb::python_error();
        extend_list(dst, tail);
    }

    // Times the first `n` steps of the batch as it stands into durs_, their end times from `t0`
    // into ends_, accumulated left to right as a clock stepped one step at a time would be.
    // `times`: a DecodeCost (its steps already timed are kept: a step's time depends only on
    // its index) or the runner (`decode_durations(reqs, fills, n)`, all n asked again).
    void time_steps(nb::handle times, int64_t n, double t0) {
        if (nb::isinstance<DecodeCost>(times)) {
            nb::cast<DecodeCost&>(times).extend(durs_, int64_t(cols.size()), cols.total_fill(), n);
        } else {
            const nb::object fills = nb::cast(copy_out<int64_t>(cols.fill()), nb::rv_policy::move);
            const nb::object got = times.attr("decode_durations")(req_list(nullptr), fills, n);
            durs_.clear();
            for (nb::handle d : got) durs_.push_back(nb::cast<double>(d));
            if (int64_t(durs_.size()) != n)
                throw std::length_error("decode_durations gave " + std::to_string(durs_.size()) +
                                        " durations for " + std::to_string(n) + " steps");
        }
        ends_.clear();
        double end = t0;
        for (double d : durs_) ends_.push_back(end += d);
    }

    // How many decode steps run at once with nothing but lengths changing: 1 unless `free`
    // (no chunked request, no prefill possible) and no row can stop early; else every row's
    // tokens to go, the KV that fits in `room`, and through the first step that ends at or
    // after `horizon` (the next arrival), timed: a few steps first (replicas that take turns
    // bound each other's jumps to a step or two), then all. Timed steps stay in durs_/ends_.
    int64_t steps(bool free, int64_t room, int64_t page, double t0, std::optional<double> horizon,
                  nb::handle times) {
        durs_.clear();
        ends_.clear();
        if (!free || cols.can_stop()) return 1;
        int64_t k = cols.min_left();
        if (k <= 1) return 1;
        k = cols.max_steps_that_fit(k, room, page);
        if (horizon && k > 1) {
            for (const int64_t n : {std::min(k, kProbeSteps), k}) {
                time_steps(times, n, t0);
                if (ends_.back() >= *horizon || n == k) {
                    const size_t at = radixsched::search_left(ends_, size_t(n), *horizon);
                    const int64_t m = std::min(n, int64_t(at) + 1);
                    durs_.resize(size_t(m));
                    ends_.resize(size_t(m));
                    return m;
                }
            }
        }
        return std::max<int64_t>(k, 1);
    }

    // A deferred decode round: None when one step's KV does not fit in `room`; else `steps`
    // steps, timed, their slots reserved in `pool` (`evict(n)` first when it is n short),
    // their end times logged, `busy` and `running_x` accumulated step by step, the columns
    // advanced: (k, end time, busy, running_x, fills before (bytes of int64, native order),
    // rows that may have finished).
    // k == 0 when the reservation failed: the second item is then the slots asked for.
    nb::object jump(bool free, int64_t room, int64_t page, double t0,
                    std::optional<double> horizon, nb::handle times, radixsched::Pool& pool,
                    nb::handle evict, double busy, double running_x) {
        int64_t total = 0;
        const int64_t k = reserve_steps(free, room, page, t0, horizon, times, pool, evict, total);
        if (k < 0) return nb::none();
        if (k == 0) return nb::make_tuple(0, total);
        nb::bytes fills = commit_steps(k, page, busy, running_x);
        return nb::make_tuple(k, ends_.back(), busy, running_x, fills, cols.maybe_finished());
    }

    // `jump`'s first half: -1 when one step's KV does not fit in `room`; 0 when the
    // reservation failed (`total`: the slots asked for); else the k steps, timed (durs_,
    // ends_), their `total` slots reserved. Nothing else changed (but `evict`'s eviction).
    int64_t reserve_steps(bool free, int64_t room, int64_t page, double t0,
                          std::optional<double> horizon, nb::handle times,
                          radixsched::Pool& pool, nb::handle evict, int64_t& total) {
        if (cols.size() == 0 || cols.need_total(1, page) > room) return -1;
        const int64_t k = steps(free, room, page, t0, horizon, times);
        if (int64_t(durs_.size()) != k) {
            durs_.clear();
            time_steps(times, k, t0);
        }
        total = cols.need_total(k, page);
        if (total > 0) {
            const int64_t short_by = total - pool.available_size();
            if (short_by > 0) evict(short_by);
            if (!pool.reserve(total)) return 0;
        }
        return k;
    }

    // `jump`'s second half, after reserve_steps gave k > 0: the end times logged, `busy` and
    // `running_x` accumulated, the columns advanced; the fills before the steps (int64 bytes).
    nb::bytes commit_steps(int64_t k, int64_t page, double& busy, double& running_x) {
        for (double e : ends_) {
            const nb::object f = nb::steal(PyFloat_FromDouble(e));
            if (!f.is_valid() || PyList_Append(log_.ptr(), f.ptr()) < 0) throw nb::python_error();
        }
        const double b = double(cols.size());
        for (double d : durs_) {  // step by step, as single steps are accounted
            busy += d;
            running_x += b * d;
        }
        // The fills before the steps as int64 bytes (np.frombuffer reads them when the jump's
        // tokens are asked for, seldom): a numpy array built here costs more than the jump.
        const std::vector<int64_t>& f = cols.fill();
        nb::bytes fills(f.data(), f.size() * sizeof(int64_t));
        cols.advance(k, page);
        return fills;
    }

    bool same_as(const DecodeBatch& o) const {
        if (reqs.size() != o.reqs.size()) return false;
        for (size_t i = 0; i < reqs.size(); ++i)
            if (reqs[i].ptr() != o.reqs[i].ptr()) return false;
        return cols.fill() == o.cols.fill() && cols.have() == o.cols.have() &&
               cols.out_len() == o.cols.out_len() && cols.max_new() == o.cols.max_new() &&
               cols.ignore_eos() == o.cols.ignore_eos() && cols.stops() == o.cols.stops();
    }

    // NativeScheduler._retire_finished in one call where no row of `rows` (ascending) can stop
    // early (`stops` unset: no stop ids, no EOS it heeds), so Scheduler.check_finish is the
    // length test. In the Python path's order: `rows` settled when `unsettled` (settle's
    // arguments); each row's request checked as check_finish does (finished: output_len >=
    // max_new_tokens, finish = `by_length` (one shared FinishState), times.finish its last
    // token time, else `now()`; an IntegrityError past the max) and the finished appended to `finished`; their
    // rows removed from `running` (the batch's list, in place) and from the columns; each
    // released (`kv`'s release, caching its KV) and forgotten (its rid popped from `by_rid`,
    // its id from `seq_of`), in order. Returns how many finished; None, with nothing changed,
    // when a row can stop, is past its max_new_tokens or is not `running`'s (Python decides).
    nb::object retire(const std::vector<int64_t>& rows, bool unsettled, nb::handle tokens_at,
                      nb::handle stand_in, radixsched::Pool& pool, nb::handle kv,
                      nb::handle running, nb::handle finished, nb::handle by_length,
                      nb::handle now, nb::handle by_rid, nb::handle seq_of) {
        if (!PyList_CheckExact(running.ptr()) || !PyList_CheckExact(finished.ptr()) ||
            !PyDict_CheckExact(by_rid.ptr()) || !PyDict_CheckExact(seq_of.ptr()) ||
            size_t(PyList_GET_SIZE(running.ptr())) != reqs.size())
            return nb::none();
        int64_t last = -1;
        for (int64_t i : rows) {
            if (i <= last || size_t(i) >= reqs.size()) return nb::none();
            last = i;
            const DecodeRow row = cols.row(size_t(i));
            if (row.stops || row.out_len > row.max_new ||
                PyList_GET_ITEM(running.ptr(), i) != reqs[size_t(i)].ptr())
                return nb::none();
        }
        if (unsettled && !rows.empty()) settle(rows, tokens_at, stand_in, pool);
        std::vector<int64_t> gone;
        std::vector<nb::object> done;
        for (int64_t i : rows) {
            const nb::object& r = reqs.at(size_t(i));
            if (finish_length(r, cols.row(size_t(i)), by_length, now)) {
                if (PyList_Append(finished.ptr(), r.ptr()) < 0) throw nb::python_error();
                gone.push_back(i);
                done.push_back(r);
            }
        }
        if (gone.empty()) return nb::int_(0);
        drop_items(running, gone);
        remove_at(gone);
        for (const nb::object& r : done) {
            radixsched::kv_release(kv, r, true);
            pop_key(by_rid, py::get(r, names().rid));
            pop_key(seq_of, nb::steal(PyLong_FromVoidPtr(r.ptr())));
        }
        return nb::int_(gone.size());
    }

    // Removes the items at `gone` (ascending, in range) from the list `lst`, the others keeping
    // their order, in one pass: the kept references move down, the tail is cut once.
    static void drop_items(nb::handle lst, const std::vector<int64_t>& gone) {
        PyObject* l = lst.ptr();
        const Py_ssize_t n = PyList_GET_SIZE(l);
        std::vector<nb::object> dropped;  // the list's references, released after the cut
        dropped.reserve(gone.size());
        Py_ssize_t w = 0;
        size_t p = 0;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* item = PyList_GET_ITEM(l, i);
            if (p < gone.size() && gone[p] == i) {
                dropped.push_back(nb::steal(item));
                ++p;
            } else {
                PyList_SET_ITEM(l, w++, item);  // moved: the list's reference goes with it
            }
        }
        if (p != gone.size()) throw std::logic_error("drop_items: rows out of range");
        for (Py_ssize_t i = w; i < n; ++i) PyList_SET_ITEM(l, i, Py_NewRef(Py_None));
        if (PyList_SetSlice(l, w, n, nullptr) < 0) throw nb::python_error();
    }

    // Scheduler.check_finish of a request that cannot stop early, its row `row` (settled: its
    // output_len is row.out_len, at most its max_new_tokens, row.max_new, as retire checked):
    // finished when its output reached max_new_tokens (or it was already).
    static bool finish_length(nb::handle r, const DecodeRow& row, nb::handle by_length,
                              nb::handle now) {
        const Names& k = names();
        if (row.out_len >= row.max_new)
            py::set(r, k.finish, by_length);
        else if (py::get(r, k.finish).is_none())
            return false;
        const nb::object times = py::get(r, k.times);
        const nb::object tt = py::get(times, k.token_times);
        const Py_ssize_t n = py::len_of(tt);
        py::set(times, k.finish, n > 0 ? nb::object(tt[n - 1]) : now());
        return true;
    }

    // dict.pop(key, None)
    static void pop_key(nb::handle d, nb::handle key) {
        const int has = PyDict_Contains(d.ptr(), key.ptr());
        if (has < 0 || (has == 1 && PyDict_DelItem(d.ptr(), key.ptr()) < 0))
            throw nb::python_error();
    }

    // None when these deferred columns are `fresh` (the requests' own state) ahead by whole
    // decode steps (at most `log_len`), owing slots that sum to `reserved`; else the message.
    nb::object deferred_error(const DecodeBatch& fresh, int64_t log_len, int64_t reserved) const {
        if (reqs.size() != fresh.reqs.size())
            return nb::str("deferred columns do not list the running batch");
        bool bad = false;
        int64_t behind_sum = 0, owed_sum = 0;
        for (size_t i = 0; i < reqs.size(); ++i) {
            const DecodeRow a = cols.row(i), b = fresh.cols.row(i);
            const int64_t behind = a.fill - b.fill, owe = a.have - b.have;
            behind_sum += behind;
            owed_sum += owe;
            bad = bad || reqs[i].ptr() != fresh.reqs[i].ptr() || behind < 0 || behind > log_len ||
                  a.out_len - b.out_len != behind || owe < 0 || a.max_new != b.max_new ||
                  a.ignore_eos != b.ignore_eos || a.stops != b.stops;
        }
        if (!bad && owed_sum == reserved) return nb::none();
        return nb::str(("deferred decode state inconsistent: " + std::to_string(behind_sum) +
                        " tokens and " + std::to_string(owed_sum) + " slots owed, " +
                        std::to_string(reserved) + " reserved")
                           .c_str());
    }
};

// fair's charge of one tenant's n requests for k decode tokens, as NativeScheduler._charge_decode
// makes it in Python: c = c + none + inc, n times, each a float addition in that order (IEEE
// doubles, round to nearest: Python's float addition; no contraction, no reassociation).
double repeat_add(double c, double none, double inc, int64_t n) {
    for (int64_t i = 0; i < n; ++i) c = (c + none) + inc;
    return c;
}

// NewTokenRatioTracker.decay_steps(n) (radixsched/ratio.py) on doubles, one step at a time as
// there: at the floor (cur <= lo and dec >= 0) it stops, else cur = max(cur - dec, lo), where
// Python's max is lo only when lo > cur - dec (a NaN difference stays).
double decay_ratio(double cur, double dec, double lo, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (cur <= lo && dec >= 0) break;
        const double d = cur - dec;
        cur = lo > d ? lo : d;
    }
    return cur;
}

// The attribute names NativeScheduler's decode round reads and writes (jump_round), interned once.
struct RoundNames {
    PyObject *clock, *t, *now, *runner, *native_decode_cost, *stats, *busy_s, *running_x_s,
        *advance_to, *ratio, *current, *decay, *min, *decay_steps, *decay_m, *decode_steps,
        *peak_kv_usage, *batch, *reqs, *decode, *unsettled, *pending, *charge_decode,
        *retire_finished, *alloc_failed, *tokens_at, *native_tokens, *kv, *native, *finished,
        *by_rid, *queue, *seq_of, *batch_is_full, *chunked_req, *may_jump, *mode, *duration_s,
        *batch_size, *num_steps, *prefill_tokens, *retracted, *tokens, *retire;
};
const RoundNames& round_names() {
    static const RoundNames n = [] {
        const auto i = [](const char* s) {
            PyObject* o = PyUnicode_InternFromString(s);
            if (o == nullptr) throw nb::python_error();
            return o;
        };
        return RoundNames{i("clock"), i("_t"), i("now"), i("runner"), i("native_decode_cost"),
                          i("stats"), i("busy_s"), i("running_x_s"), i("_advance_to"),
                          i("ratio"), i("current"), i("decay"), i("min"), i("decay_steps"),
                          i("_decay"), i("decode_steps"), i("peak_kv_usage"), i("batch"),
                          i("reqs"), i("decode"), i("unsettled"), i("pending"),
                          i("_charge_decode"), i("_retire_finished"),
                          i("_alloc_failed"), i("tokens_at"), i("native_tokens"), i("kv"),
                          i("native"), i("finished"), i("_by_rid"), i("queue"), i("_seq_of"),
                          i("batch_is_full"), i("chunked_req"), i("_may_jump"), i("mode"),
                          i("duration_s"), i("batch_size"), i("num_steps"), i("prefill_tokens"),
                          i("retracted"), i("_tokens"), i("retire")};
    }();
    return n;
}

nb::object call0(nb::handle o, PyObject* name) {  // o.name()
    PyObject* v = PyObject_CallMethodNoArgs(o.ptr(), name);
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

bool greater(nb::handle a, nb::handle b) {  // a > b, as Python compares them
    const int gt = PyObject_RichCompareBool(a.ptr(), b.ptr(), Py_GT);
    if (gt < 0) throw nb::python_error();
    return gt != 0;
}

nb::object steal_or_throw(PyObject* v) {
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

// What NativeScheduler's decode round (jump_round) holds for the scheduler's life, built once in
// its __init__: the slot pool, the tree's evictable count (bound), the cache's evict, the KV
// capacity (> 0) and page, the classes it compares or builds (VirtualClock,
// NewTokenRatioTracker, JumpOutcome: `plain_outcome` where its instances are their nine slots,
// native/scheduler.py's _plain_outcome), the shared FINISHED_BY_LENGTH, what its setup fixes
// (`defers`: NativeScheduler.defers; `preempts`: the config's enable_priority_preemption), and
// what its class and policy leave to Python: `charges` (fair's decode charge, its
// _charge_decode), `may_jump_here` and `decay_here` (its _may_jump, its _decay are
// NativeScheduler's), `retire_here` (its _retire_finished is NativeScheduler's and its finish
// hooks the reference's: native/retire.py's reference_hooks).
struct DecodeRun {
    DecodeRun(nb::object pool, nb::object evictable, nb::object evict, int64_t capacity,
              int64_t page, nb::object vclock, nb::object tracker, nb::object outcome,
              nb::object by_length, nb::dict globals, nb::object retire_fn, bool plain_outcome,
              bool defers, bool preempts, bool charges, bool may_jump_here, bool decay_here,
              bool retire_here)
        : pool_obj(std::move(pool)), pool(nb::cast<radixsched::Pool*>(pool_obj)),
          evictable(std::move(evictable)), evict(std::move(evict)), capacity(capacity),
          page(page), vclock(std::move(vclock)), tracker(std::move(tracker)),
          outcome(std::move(outcome)), by_length(std::move(by_length)),
          globals(std::move(globals)), retire_fn(std::move(retire_fn)), plain_outcome(plain_outcome && PyType_Check(this->outcome.ptr())), defers(defers),
          preempts(preempts), charges(charges), may_jump_here(may_jump_here),
          decay_here(decay_here), retire_here(retire_here) {
        if (capacity <= 0) throw std::invalid_argument("DecodeRun: capacity must be > 0");
        names();
        round_names();
    }

    nb::object pool_obj;  // kept alive: pool points into it
    radixsched::Pool* pool;
    nb::object evictable, evict;
    int64_t capacity, page;
    nb::object vclock, tracker, outcome, by_length;
    nb::dict globals;  // native/scheduler.py's: its `retire` is looked up as _retire_finished does
    nb::object retire_fn;
    bool plain_outcome, defers, preempts, charges, may_jump_here, decay_here, retire_here;

    // JumpOutcome("decode", duration, size, k): where `plain_outcome`, without its __init__
    // (what it does: each field set, in order, prefill_tokens 0, three new lists, pending
    // None), the instance allocated as object.__new__ allocates it; else the class called.
    nb::object make_outcome(nb::handle duration, nb::handle size, nb::handle k) const {
        const RoundNames& n = round_names();
        if (!plain_outcome) return outcome(nb::handle(n.decode), duration, size, k);
        auto* tp = reinterpret_cast<PyTypeObject*>(outcome.ptr());
        const nb::object o = steal_or_throw(tp->tp_alloc(tp, 0));
        const auto list = [] { return steal_or_throw(PyList_New(0)); };
        py::set(o, n.mode, n.decode);
        py::set(o, n.duration_s, duration);
        py::set(o, n.batch_size, size);
        py::set(o, n.num_steps, k);
        py::set(o, n.prefill_tokens, nb::int_(0));
        py::set(o, n.finished, list());
        py::set(o, n.retracted, list());
        py::set(o, n.tokens, list());
        py::set(o, n.pending, Py_None);
        return o;
    }

    int64_t room() const {  // NativeScheduler._room: free + evictable
        return pool->available_size() + nb::cast<int64_t>(evictable());
    }

    // Scheduler.kv_usage's (cap - room) / cap as Python's int true division gives it: the
    // doubles' quotient where both are exact doubles (|x| <= 2**53), else Python's.
    nb::object usage() const {
        const int64_t used = capacity - room();
        constexpr int64_t exact = int64_t(1) << 53;
        if (capacity <= exact && used <= exact && used >= -exact)
            return nb::float_(double(used) / double(capacity));
        return steal_or_throw(PyNumber_TrueDivide(nb::int_(used).ptr(), nb::int_(capacity).ptr()));
    }
};

// NativeScheduler._decay(k) where its class's is the reference's (`decay_here`): the tracker's
// three values read, then natively (decay_ratio) where it is a NewTokenRatioTracker of floats,
// else its decay_steps(k).
void decay_of(const DecodeRun& run, nb::handle sched, int64_t k) {
    const RoundNames& n = round_names();
    if (!run.decay_here) {
        nb::handle(sched).attr(n.decay_m)(k);
        return;
    }
    const nb::object r = py::get(sched, n.ratio);
    const nb::object cur = py::get(r, n.current), dec = py::get(r, n.decay), lo = py::get(r, n.min);
    const bool floats = PyFloat_CheckExact(cur.ptr()) && PyFloat_CheckExact(dec.ptr()) &&
                        PyFloat_CheckExact(lo.ptr());
    if (r.type().is(run.tracker) && floats) {
        const double got = decay_ratio(PyFloat_AS_DOUBLE(cur.ptr()), PyFloat_AS_DOUBLE(dec.ptr()),
                                       PyFloat_AS_DOUBLE(lo.ptr()), k);
        py::set(r, n.current, nb::float_(got));
    } else {
        r.attr(n.decay_steps)(k);
    }
}

// Whether native/scheduler.py's global `retire` (what _retire_finished calls) is still
// native/retire.py's (`retire_fn`): not replaced (a test counting its calls).
bool retire_is_native(const DecodeRun& run) {
    PyObject* got = PyDict_GetItemWithError(run.globals.ptr(), round_names().retire);  // borrowed
    if (got == nullptr && PyErr_Occurred()) throw nb::python_error();
    return got == run.retire_fn.ptr();
}

// NativeScheduler._retire_finished(maybe, out) after a jump (the batch unsettled): natively
// (DecodeBatch.retire with native/retire.py's arguments) where `retire_here`, the module's
// `retire` is native/retire.py's and the call does not decline; else the scheduler's method.
void retire_after_jump(DecodeBatch& b, const DecodeRun& run, nb::handle sched,
                       const std::vector<int64_t>& maybe, nb::handle out, nb::handle clock) {
    const RoundNames& n = round_names();
    if (run.retire_here && retire_is_native(run)) {
        const nb::object runner = py::get(sched, n.runner);
        const nb::object tokens_at = py::get(runner, n.tokens_at);
        const nb::object stand_in = call0(runner, n.native_tokens);
        const nb::object got = b.retire(
            maybe, true, tokens_at, stand_in, *run.pool, py::get(py::get(sched, n.kv), n.native),
            py::get(py::get(sched, n.batch), n.reqs), py::get(out, n.finished), run.by_length,
            py::get(clock, n.now), py::get(sched, n.by_rid),
            py::get(py::get(sched, n.queue), n.seq_of));
        if (!got.is_none()) {
            if (nb::cast<int64_t>(got) > 0) py::set(sched, n.batch_is_full, Py_False);
            return;
        }
    }
    nb::handle(sched).attr(n.retire_finished)(nb::cast(maybe), out);
}

// NativeScheduler._may_jump() where its class's is NativeScheduler's (`may_jump_here`): no chunked
// request, and an empty queue or a full batch without preemption; else the scheduler's method.
bool may_jump(const DecodeRun& run, nb::handle sched) {
    const RoundNames& n = round_names();
    if (!run.may_jump_here) return truthy(call0(sched, n.may_jump));
    if (!py::get(sched, n.chunked_req).is_none()) return false;
    if (!truthy(py::get(py::get(sched, n.queue), n.reqs))) return true;
    return truthy(py::get(sched, n.batch_is_full)) && !run.preempts;
}

// NativeScheduler._jump(cols, free, horizon) in one call: DecodeBatch.jump over the scheduler's
// state (the clock's now, the runner's step timer, the room, the stats' sums), then what
// _jump's Python did after it, in its order: the clock at the end (a VirtualClock's _t as
// its jump_to sets it, max(_t, end); another clock through _advance_to), the ratio decayed
// (decay_of), stats.decode_steps += k, stats.peak_kv_usage = max(peak, kv usage), the
// JumpOutcome("decode", end - t0, len(reqs), k), unsettled set, its pending (reqs, runner,
// fills, k), the tenants charged (the scheduler's _charge_decode), the rows that may have
// finished retired (retire_after_jump). None, nothing changed, where the scheduler does not
// defer or a row can stop (decode_round's test: Python decides) or one step does not fit (room
// must be made); the scheduler's _alloc_failed raised when the reservation failed. `free`:
// _may_jump's answer, None to ask it here (may_jump).
nb::object jump_round(DecodeBatch& b, const DecodeRun& run, nb::handle sched,
                      std::optional<bool> free_, std::optional<double> horizon) {
    const RoundNames& n = round_names();
    if (!run.defers || b.cols.can_stop()) return nb::none();
    const bool free = free_ ? *free_ : may_jump(run, sched);
    const int64_t room = run.room();
    // reserve_steps's first test, asked before the reads below (all without side effects):
    // a round that must make room first reads nothing else.
    if (b.cols.size() == 0 || b.cols.need_total(1, run.page) > room) return nb::none();
    const nb::object st = py::get(sched, n.stats), clock = py::get(sched, n.clock);
    const bool virt = clock.type().is(run.vclock);
    const nb::object t0 = virt ? py::get(clock, n.t) : call0(clock, n.now);  // clock.now()
    const nb::object runner = py::get(sched, n.runner);
    const nb::object timer = call0(runner, n.native_decode_cost);
    double busy = nb::cast<double>(py::get(st, n.busy_s));
    double running_x = nb::cast<double>(py::get(st, n.running_x_s));
    int64_t total = 0;
    const int64_t k = b.reserve_steps(free, room, run.page, nb::cast<double>(t0), horizon,
                                      timer.is_none() ? runner : timer, *run.pool, run.evict,
                                      total);
    if (k < 0) return nb::none();
    if (k == 0) {  // raise self._alloc_failed(total)
        const nb::object err = nb::handle(sched).attr(n.alloc_failed)(total);
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
        throw nb::python_error();
    }
    const nb::bytes fills = b.commit_steps(k, run.page, busy, running_x);
    const std::vector<int64_t> maybe = b.cols.maybe_finished();
    const nb::object end = nb::float_(b.ends_.back());
    py::set(st, n.busy_s, nb::float_(busy));
    py::set(st, n.running_x_s, nb::float_(running_x));
    if (!virt) {
        const nb::object total_s = steal_or_throw(PyNumber_Subtract(end.ptr(), t0.ptr()));
        nb::handle(sched).attr(n.advance_to)(end, total_s);
    } else if (greater(end, py::get(clock, n.t))) {  // jump_to: _t = max(_t, end)
        py::set(clock, n.t, end);
    }
    decay_of(run, sched, k);
    const nb::object k_obj = nb::int_(k);
    py::set(st, n.decode_steps,
            steal_or_throw(PyNumber_InPlaceAdd(py::get(st, n.decode_steps).ptr(), k_obj.ptr())));
    const nb::object usage = run.usage();
    if (greater(usage, py::get(st, n.peak_kv_usage)))  // max(peak, usage)
        py::set(st, n.peak_kv_usage, usage);
    const nb::object reqs =
        steal_or_throw(PySequence_List(py::get(py::get(sched, n.batch), n.reqs).ptr()));
    const nb::object duration = steal_or_throw(PyNumber_Subtract(end.ptr(), t0.ptr()));
    const nb::object out =
        run.make_outcome(duration, nb::int_(PyList_GET_SIZE(reqs.ptr())), k_obj);
    py::set(sched, n.unsettled, Py_True);
    py::set(out, n.pending, nb::make_tuple(reqs, runner, fills, k_obj));
    if (run.charges) nb::handle(sched).attr(n.charge_decode)(reqs, k_obj);
    if (!maybe.empty()) retire_after_jump(b, run, sched, maybe, out, clock);
    return out;
}

// The token times of finished requests end to end (results/requests.py's _joined): each
// sequence a list of Python floats, copied into `out` in order; false (`out` partly written)
// where an item is not exactly a float or the lengths do not add up to out's, and the caller
// converts them as numpy does.
bool join_floats(nb::handle seqs, nb::ndarray<double, nb::ndim<1>, nb::c_contig> out) {
    double* dst = out.data();
    const size_t size = out.shape(0);
    size_t at = 0;
    for (nb::handle seq : seqs) {
        if (!PyList_CheckExact(seq.ptr())) return false;
        const Py_ssize_t n = PyList_GET_SIZE(seq.ptr());
        if (size - at < static_cast<size_t>(n)) return false;
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* v = PyList_GET_ITEM(seq.ptr(), i);
            if (!PyFloat_CheckExact(v)) return false;
            dst[at++] = PyFloat_AS_DOUBLE(v);
        }
    }
    return at == size;
}

}  // namespace

void bind_decode(nb::module_& m) {
    m.def("join_floats", &join_floats, "seqs"_a, "out"_a.noconvert(),
          "the float lists `seqs` end to end into `out`; False where an item is not a float "
          "or the sizes differ (decode.cpp)");
    m.def("repeat_add", &repeat_add, "c"_a.noconvert(), "none"_a.noconvert(),
          "inc"_a.noconvert(), "n"_a,
          "c + none + inc, n times over (float additions in that order): fair's decode charge");
    m.def("decay_ratio", &decay_ratio, "cur"_a.noconvert(), "dec"_a.noconvert(),
          "lo"_a.noconvert(), "n"_a,
          "NewTokenRatioTracker.decay_steps(n) on floats: the new current ratio");
    nb::class_<DecodeCost>(m, "DecodeCost")
        .def(nb::init<double, double, double, double, double, double, nb::object>(), "lin"_a, "attn"_a, "flops"_a, "weight"_a, "kv"_a, "bytes"_a, "per_batch"_a)
        .def("durations",
             [](DecodeCost& c, int64_t b, int64_t total_ctx, int64_t steps) {
                 std::vector<double> out;
                 c.extend(out, b, total_ctx, steps);
                 return copy_out<double>(out);
             },
             "b"_a, "total_ctx"_a, "steps"_a, nb::rv_policy::move);
    m.def("stand_ins", &stand_ins, "rid_hash"_a, "first"_a, "count"_a, "vocab"_a);
    // py_attr.hpp's table entry for (type(o), name) as an access fills it (for its tests):
    // (slot offset read, slot offset written, whether the instance's own attributes are read
    // in place, the name's index in the type's shared keys), -1 where none.
    m.def("_attr_entry", [](nb::handle o, nb::str name) {
        PyObject* n = Py_NewRef(name.ptr());
        PyUnicode_InternInPlace(&n);
        const nb::object key = nb::steal(n);
        const py::detail::SlotEntry& e = py::detail::slot_entry(o.ptr(), key.ptr());
        return nb::make_tuple(e.get_at, e.set_at, e.managed, e.value_at);
    });
    nb::class_<DecodeRun>(m, "DecodeRun")
        .def(nb::init<nb::object, nb::object, nb::object, int64_t, int64_t, nb::object, nb::object,
                      nb::object, nb::object, nb::dict, nb::object, bool, bool, bool, bool, bool,
                      bool, bool>(),
             "pool"_a, "evictable"_a, "evict"_a, "capacity"_a, "page"_a, "vclock"_a,
             "tracker"_a, "outcome"_a, "by_length"_a, "globals"_a, "retire_fn"_a,
             "plain_outcome"_a, "defers"_a, "preempts"_a, "charges"_a,
             "may_jump_here"_a, "decay_here"_a, "retire_here"_a)
        .def("usage", &DecodeRun::usage, "the KV usage, (capacity - room) / capacity")
        .def("make_outcome", &DecodeRun::make_outcome, "duration"_a, "size"_a, "k"_a,
             "JumpOutcome('decode', duration, size, k)");
    nb::class_<DecodeBatch>(m, "DecodeBatch")
        .def(nb::init<bool>(), "has_eos"_a)
        .def("__len__", [](const DecodeBatch& b) { return b.cols.size(); })
        .def("extend", &DecodeBatch::extend, "reqs"_a)
        .def("remove_at", &DecodeBatch::remove_at, "positions"_a)
        .def("positions_of", &DecodeBatch::positions_of, "reqs"_a)
        .def_prop_ro("reqs", [](const DecodeBatch& b) { return b.req_list(nullptr); })
        .def_prop_ro("can_stop", [](const DecodeBatch& b) { return b.cols.can_stop(); })
        .def_prop_ro("fill", [](const DecodeBatch& b) { return copy_out<int64_t>(b.cols.fill()); }, nb::rv_policy::move)
        .def_prop_ro("have", [](const DecodeBatch& b) { return copy_out<int64_t>(b.cols.have()); }, nb::rv_policy::move)
        .def_prop_ro("out_len", [](const DecodeBatch& b) { return copy_out<int64_t>(b.cols.out_len()); }, nb::rv_policy::move)
        .def_prop_ro("max_new", [](const DecodeBatch& b) { return copy_out<int64_t>(b.cols.max_new()); }, nb::rv_policy::move)
        .def_prop_ro("ignore_eos",
                     [](const DecodeBatch& b) { return copy_out<bool>(b.cols.ignore_eos()); }, nb::rv_policy::move)
        .def_prop_ro("stops",
                     [](const DecodeBatch& b) { return copy_out<bool>(b.cols.stops()); }, nb::rv_policy::move)
        .def("need",
             [](const DecodeBatch& b, int64_t steps, int64_t page) {
                 std::vector<int64_t> out(b.cols.size());
                 for (size_t i = 0; i < out.size(); ++i) out[i] = b.cols.need(i, steps, page);
                 return out;
             },
             "steps"_a, "page"_a)
        .def("need_total",
             [](const DecodeBatch& b, int64_t steps, int64_t page) {
                 return b.cols.need_total(steps, page);
             },
             "steps"_a, "page"_a)
        .def("max_steps_that_fit",
             [](const DecodeBatch& b, int64_t limit, int64_t room, int64_t page) {
                 return b.cols.max_steps_that_fit(limit, room, page);
             },
             "limit"_a, "room"_a, "page"_a)
        .def("decode_tokens",
             [](const DecodeBatch& b, int64_t clip) { return b.cols.decode_tokens(clip); },
             "clip"_a)
        .def("progress", [](const DecodeBatch& b) { return b.cols.progress(); })
        .def("to_go",
             [](const DecodeBatch& b) {
                 std::vector<int64_t> out(b.cols.size());
                 for (size_t i = 0; i < out.size(); ++i) out[i] = b.cols.to_go(i);
                 return out;
             })
        .def("min_left", [](const DecodeBatch& b) { return b.cols.min_left(); })
        .def("maybe_finished", [](const DecodeBatch& b) { return b.cols.maybe_finished(); })
        .def("advance",
             [](DecodeBatch& b, int64_t k, int64_t page) { return b.cols.advance(k, page); },
             "k"_a, "page"_a)
        .def("owed", &DecodeBatch::owed, "rows"_a)
        .def("retraction_order", &DecodeBatch::retraction_order, "policy"_a, "sign"_a)
        .def("settle", &DecodeBatch::settle, "rows"_a, "tokens_at"_a, "stand_in"_a.none(),
             "pool"_a)
        .def("steps", &DecodeBatch::steps, "free"_a, "room"_a, "page"_a, "t0"_a,
             "horizon"_a.none(), "times"_a)
        .def("jump", &DecodeBatch::jump, "free"_a, "room"_a, "page"_a, "t0"_a,
             "horizon"_a.none(), "times"_a, "pool"_a, "evict"_a, "busy"_a, "running_x"_a)
        .def("retire", &DecodeBatch::retire, "rows"_a, "unsettled"_a, "tokens_at"_a.none(),
             "stand_in"_a.none(), "pool"_a, "kv"_a, "running"_a, "finished"_a, "by_length"_a,
             "now"_a, "by_rid"_a, "seq_of"_a)
        .def("jump_round", &jump_round, "run"_a, "sched"_a, "free"_a.none(), "horizon"_a.none())
        .def_prop_ro("log_len", [](const DecodeBatch& b) { return nb::len(b.log_); })
        .def("clear_log", [](DecodeBatch& b) { b.log_.clear(); })
        .def("same_as", &DecodeBatch::same_as, "other"_a)
        .def("deferred_error", &DecodeBatch::deferred_error, "fresh"_a, "log_len"_a,
             "reserved"_a);
}
