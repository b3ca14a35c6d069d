// A map keyed by a request's id (Python's id(): an object's address, a multiple of 16) whose
// values keep their addresses while present (each in its own allocation, as a node-based map's
// do), indexed by an open-addressing table: linear probing over a power of two of cells, at most
// half full, the home cell from the key's Fibonacci hash (its high bits: the id's zero low bits
// do not matter), deletion by backward shift (no tombstones). Nothing iterates it, so its order
// is never observed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace radixsched {

template <class V>
class IdMap {
public:
    IdMap() = default;
    IdMap(const IdMap&) = delete;  // its values are owned once
    IdMap& operator=(const IdMap&) = delete;
    IdMap(IdMap&&) noexcept = default;
    IdMap& operator=(IdMap&&) noexcept = default;

    V* find(int64_t k) const {
        if (size_ == 0) return nullptr;
        for (size_t i = home(k);; i = (i + 1) & mask_) {
            const Cell& c = cells_[i];
            if (!c.val) return nullptr;
            if (c.key == k) return c.val.get();
        }
    }
    V& at(int64_t k) const {
        V* v = find(k);
        if (v == nullptr) throw std::out_of_range("IdMap::at: absent key");
        return *v;
    }
    // k's value; made from `args` when absent (a present value is left as it is).
    template <class... A>
    V& try_emplace(int64_t k, A&&... args) {
        if (2 * (size_ + 1) > cells_.size()) grow();
        size_t i = home(k);
        for (; cells_[i].val; i = (i + 1) & mask_)
            if (cells_[i].key == k) return *cells_[i].val;
        cells_[i].key = k;
        cells_[i].val = std::make_unique<V>(std::forward<A>(args)...);
        ++size_;
        return *cells_[i].val;
    }
    bool erase(int64_t k) {
        if (size_ == 0) return false;
        size_t hole = home(k);
        for (;; hole = (hole + 1) & mask_) {
            if (!cells_[hole].val) return false;
            if (cells_[hole].key == k) break;
        }
        cells_[hole].val.reset();
        --size_;
        // Every cell after the hole in its run whose home is not cyclically in (hole, j] moves
        // into it, so that each key stays reachable from its home without a gap.
        for (size_t j = (hole + 1) & mask_; cells_[j].val; j = (j + 1) & mask_) {
            if (((j - home(cells_[j].key)) & mask_) >= ((j - hole) & mask_)) {
                cells_[hole] = std::move(cells_[j]);
                hole = j;
            }
        }
        return true;
    }
    void clear() {
        if (size_ == 0) return;
        for (Cell& c : cells_) c.val.reset();
        size_ = 0;
    }
    bool empty() const { return size_ == 0; }
    size_t size() const { return size_; }

private:
    struct Cell {
        int64_t key = 0;
        std::unique_ptr<V> val;  // null: an empty cell
    };
    size_t home(int64_t k) const {
        return static_cast<size_t>((static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ULL) >> shift_);
    }
    void grow() {
        std::vector<Cell> old = std::move(cells_);
        const size_t n = old.empty() ? 64 : 2 * old.size();
        cells_ = std::vector<Cell>(n);
        mask_ = n - 1;
        shift_ = 64;
        for (size_t m = n; m > 1; m >>= 1) --shift_;
        for (Cell& c : old) {
            if (!c.val) continue;
            size_t i = home(c.key);
            while (cells_[i].val) i = (i + 1) & mask_;
            cells_[i] = std::move(c);
        }
    }

    std::vector<Cell> cells_;
    size_t size_ = 0;
    size_t mask_ = 0;
    unsigned shift_ = 64;
};

}  // namespace radixsched
