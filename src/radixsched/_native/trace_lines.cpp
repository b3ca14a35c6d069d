// See trace_lines.hpp.
#include "trace_lines.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstring>
#include <stdexcept>

namespace nb = nanobind;
using namespace nb::literals;

namespace radixsched {
namespace {

constexpr uint64_t kExact = uint64_t{1} << 53;  // integers up to here are exact doubles

// A cursor over one line [p, end): each read advances past what it took, or fails.
struct Cursor {
    const char* p;
    const char* end;

    void skip_space() {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) ++p;
    }
    bool take(char c) {
        skip_space();
        if (p == end || *p != c) return false;
        ++p;
        return true;
    }
    // A JSON integer of digits only, at most 2^53: "0" alone, or digits from 1 to 9 first.
    // What may follow is the caller's next token (',', ']' or '}'), so a fraction, an
    // exponent or a digit after a leading zero fails there.
    bool integer(uint64_t& v) {
        skip_space();
        v = 0;
        if (p == end || *p < '0' || *p > '9') return false;
        if (*p == '0') {
            ++p;
            return true;
        }
        while (p < end && *p >= '0' && *p <= '9') {
            v = v * 10 + static_cast<uint64_t>(*p - '0');  // v <= 2^53 before: no wrap
            if (v > kExact) return false;
            ++p;
        }
        return true;
    }
    // The key "name" (no escapes), then its colon: which of the four keys, or -1.
    int key() {
        static const char* const kKeys[] = {"timestamp", "input_length", "output_length",
                                            "hash_ids"};
        if (!take('"')) return -1;
        const char* q = static_cast<const char*>(std::memchr(p, '"', static_cast<size_t>(end - p)));
        if (q == nullptr) return -1;
        const size_t n = static_cast<size_t>(q - p);
        int which = -1;
        for (int k = 0; k < 4; ++k)
            if (std::strlen(kKeys[k]) == n && std::memcmp(kKeys[k], p, n) == 0) which = k;
        p = q + 1;
        return which >= 0 && take(':') ? which : -1;
    }
};

// One line into row `row`; its ids appended at ids[at, cap). False where it is not taken.
bool parse_line(Cursor c, const TraceColumns& out, size_t row, size_t& at) {
    if (!c.take('{')) return false;
    bool seen[4] = {false, false, false, false};
    for (int k = 0; k < 4; ++k) {
        if (k > 0 && !c.take(',')) return false;
        const int which = c.key();
        if (which < 0 || seen[which]) return false;
        seen[which] = true;
        uint64_t v = 0;
        if (which == 3) {
            const size_t first = at;
            if (!c.take('[')) return false;
            c.skip_space();
            if (c.p < c.end && *c.p == ']') {
                ++c.p;
            } else {
                do {
                    if (at == out.cap || !c.integer(v)) return false;
                    out.ids[at++] = static_cast<int64_t>(v);
                } while (c.take(','));
                if (!c.take(']')) return false;
            }
            out.counts[row] = static_cast<int64_t>(at - first);
            continue;
        }
        if (!c.integer(v)) return false;
        if (which == 0) out.stamps[row] = static_cast<double>(v);
        if (which == 1) out.inputs[row] = static_cast<int64_t>(v);
        if (which == 2) out.outputs[row] = static_cast<int64_t>(v);
    }
    if (!c.take('}')) return false;
    c.skip_space();
    return c.p == c.end;
}

// A bytes-like object's contiguous bytes, held for the scope (bytes, a bytearray, a
// memoryview of one: a buffer exported cannot be resized while held).
class LineBuffer {
public:
    explicit LineBuffer(nb::handle o) {
        if (PyObject_GetBuffer(o.ptr(), &view_, PyBUF_SIMPLE) != 0) throw nb::python_error();
    }
    ~LineBuffer() { PyBuffer_Release(&view_); }
    LineBuffer(const LineBuffer&) = delete;
    LineBuffer& operator=(const LineBuffer&) = delete;
    const char* data() const { return static_cast<const char*>(view_.buf); }
    size_t size() const { return static_cast<size_t>(view_.len); }

private:
    Py_buffer view_{};
};

}  // namespace

int64_t parse_mooncake_lines(const char* data, size_t size, const TraceColumns& out) {
    const char* p = data;
    const char* const end = data + size;
    size_t row = 0;
    size_t at = 0;
    while (true) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
        const char* line_end = nl == nullptr ? end : nl;
        if (row == out.rows || !parse_line(Cursor{p, line_end}, out, row, at)) return -1;
        ++row;
        if (nl == nullptr) break;
        p = nl + 1;
    }
    return row == out.rows ? static_cast<int64_t>(at) : -1;
}

void bind_trace_lines(nb::module_& m) {
    using F64 = nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    using I64 = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    m.def(
        "mooncake_lines",
        [](nb::handle block, F64 stamps, I64 inputs, I64 outputs, I64 counts, I64 ids) {
            const size_t rows = stamps.shape(0);
            if (inputs.shape(0) != rows || outputs.shape(0) != rows || counts.shape(0) != rows)
                throw std::invalid_argument("mooncake_lines: one row a line in every column");
            const TraceColumns out{stamps.data(), inputs.data(), outputs.data(), counts.data(),
                                   rows, ids.data(), ids.shape(0)};
            const LineBuffer lines(block);  // held (the block cannot change) until the return
            const nb::gil_scoped_release unlocked;  // only the block and the columns are read
            return parse_mooncake_lines(lines.data(), lines.size(), out);
        },
        "block"_a, "stamps"_a.noconvert(), "inputs"_a.noconvert(), "outputs"_a.noconvert(),
        "counts"_a.noconvert(), "ids"_a.noconvert(),
        "Parse a block of plain Mooncake trace lines (any bytes-like object) into the columns "
        "(one row a line) and `ids`, without the GIL: the number of ids, or -1 where a line is "
        "not plain (trace_lines.hpp)");
}

}  // namespace radixsched
