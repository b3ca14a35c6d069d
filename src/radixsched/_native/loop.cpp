// See loop.hpp. `steps_until` is _run_lean's inner `while` (radixsched/sim/deploy/open_loop.py):
// the same reads and calls in the same order, each through the same Python operation (truth
// values, `<` on the clock's reading, the KV usage's arithmetic on the objects), so every
// value sampled is the one the Python loop samples.
#include "loop.hpp"

#include <nanobind/nanobind.h>

#include <cstdint>
#include <vector>

#include "py_attr.hpp"
#include "vclock.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

using py::get;

struct Names {
    PyObject *chunked_req, *cached_prompt_tokens, *prompt_tokens, *finished, *frombytes;
};

const Names& names() {  // interned once, never released
    static const Names n = [] {
        auto i = [](const char* s) { return PyUnicode_InternFromString(s); };
        return Names{i("chunked_req"), i("cached_prompt_tokens"), i("prompt_tokens"),
                     i("finished"), i("frombytes")};
    }();
    return n;
}

nb::object checked(PyObject* v) {
    if (v == nullptr) throw nb::python_error();
    return nb::steal(v);
}

bool truth(nb::handle o) {
    const int t = PyObject_IsTrue(o.ptr());
    if (t < 0) throw nb::python_error();
    return t != 0;
}

// A value as array('d') stores it (its setitem converts with PyFloat_AsDouble).
double as_double(nb::handle v) {
    const double d = PyFloat_AsDouble(v.ptr());
    if (d == -1.0 && PyErr_Occurred()) throw nb::python_error();
    return d;
}

// The samples of the steps taken so far, appended to the series' array('d') when the loop
// stops, however it stops: a step that raises leaves the samples of the steps before it, as
// the Python loop's one `extend` per step does.
class Samples {
public:
    explicit Samples(nb::handle rows) : rows_(rows) {}
    Samples(const Samples&) = delete;
    Samples& operator=(const Samples&) = delete;
    ~Samples() {  // an error in flight stays the one raised
        if (buf_.empty()) return;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (!flush()) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    void add(double v) { buf_.push_back(v); }
    void done() {  // the normal end: a failure to append raises
        if (!flush()) throw nb::python_error();
    }

private:
    bool flush() {
        if (buf_.empty()) return true;
        PyObject* bytes = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(buf_.data()),
                                                    Py_ssize_t(buf_.size() * sizeof(double)));
        buf_.clear();
        if (bytes == nullptr) return false;
        PyObject* r = PyObject_CallMethodOneArg(rows_.ptr(), names().frombytes, bytes);
        Py_DECREF(bytes);
        Py_XDECREF(r);
        return r != nullptr;
    }
    nb::handle rows_;
    std::vector<double> buf_;
};

// One step's sample: (start, len(waiting), len(running) + (1 if the scheduler has a chunked
// request), (cap - (free() + evictable())) / cap, stats.cached_prompt_tokens,
// stats.prompt_tokens), read in that order.
void sample(Samples& rows, nb::handle start, nb::handle sched, nb::handle waiting,
            nb::handle running, nb::handle free, nb::handle evictable, nb::handle cap,
            nb::handle stats) {
    const Names& n = names();
    rows.add(as_double(start));
    rows.add(double(py::len_of(waiting)));
    const int64_t run = py::len_of(running) + (get(sched, n.chunked_req).is_none() ? 0 : 1);
    rows.add(double(run));
    nb::object f = checked(PyObject_CallNoArgs(free.ptr()));
    nb::object e = checked(PyObject_CallNoArgs(evictable.ptr()));
    nb::object used = checked(PyNumber_Add(f.ptr(), e.ptr()));
    nb::object left = checked(PyNumber_Subtract(cap.ptr(), used.ptr()));
    rows.add(as_double(checked(PyNumber_TrueDivide(left.ptr(), cap.ptr()))));
    rows.add(as_double(get(stats, n.cached_prompt_tokens)));
    rows.add(as_double(get(stats, n.prompt_tokens)));
}

// Steps `sched` (its bound `step`, the clock's bound `now`: a VirtualClock's read in place,
// vclock.hpp) while it has work (waiting or running requests, or a chunked one) and its
// clock reads before `ta`, each step with `horizon` and sampled into `rows`; after a step
// that finished requests, `done` grows by their count and `on_progress(done, total)` is told
// (when given). Returns (whether a step came back None: the caller raises, done).
nb::tuple steps_until(nb::handle step, nb::handle now, nb::handle sched, nb::handle waiting,
                      nb::handle running, nb::handle free, nb::handle evictable, nb::handle cap,
                      nb::handle stats, nb::handle rows, nb::handle ta, nb::handle horizon,
                      nb::handle on_progress, int64_t done, nb::handle total) {
    const Names& n = names();
    Samples samples(rows);
    bool stuck = false;
    while (truth(waiting) || truth(running) || !get(sched, n.chunked_req).is_none()) {
        nb::object start = vclock::call_bound_now(now);
        const int before = PyObject_RichCompareBool(start.ptr(), ta.ptr(), Py_LT);
        if (before < 0) throw nb::python_error();
        if (!before) break;
        nb::object out = checked(PyObject_CallOneArg(step.ptr(), horizon.ptr()));
        if (out.is_none()) {
            stuck = true;
            break;
        }
        sample(samples, start, sched, waiting, running, free, evictable, cap, stats);
        nb::object finished = get(out, n.finished);
        if (truth(finished) && !on_progress.is_none()) {
            done += py::len_of(finished);
            checked(PyObject_CallFunctionObjArgs(on_progress.ptr(), nb::int_(done).ptr(),
                                                 total.ptr(), nullptr));
        }
    }
    samples.done();
    return nb::make_tuple(stuck, done);
}

}  // namespace

void bind_loop(nb::module_& m) {
    m.def("steps_until", &steps_until, "step"_a, "now"_a, "sched"_a, "waiting"_a, "running"_a,
          "free"_a, "evictable"_a, "cap"_a, "stats"_a, "rows"_a, "ta"_a, "horizon"_a.none(),
          "on_progress"_a.none(), "done"_a, "total"_a);
}

}  // namespace radixsched
