// See dedup.hpp.
#include "dedup.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <utility>

namespace radixsched {

namespace {

// Python's prefill_work(r) with r.num_matched_prefix_tokens as the queue sets it from the
// memo (min(n, fill_len - 1)): uncached tokens a prefill computes, at least 1.
int64_t prefill_work(int64_t fill_len, int64_t n) {
    return std::max<int64_t>(1, fill_len - std::min(n, fill_len - 1));
}

}  // namespace

size_t Dedup::KeyHash::operator()(const GroupKey& g) const {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ static_cast<uint32_t>(g.ns);
    for (int32_t t : g.head) {  // a 64-bit multiply-xorshift mix per token
        h ^= static_cast<uint32_t>(t);
        h *= 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    return static_cast<size_t>(h);
}

Dedup::Dedup(int64_t check, int64_t width) : check_(check), width_(std::max<int64_t>(width, 0)) {}

void Dedup::put(int64_t k, const int32_t* tokens, int64_t fill_len, int32_t ns, RepInputs rep) {
    drop(k);
    Member m;
    m.tokens = tokens;
    m.fill_len = fill_len;
    m.ns = ns;
    m.k = k;
    auto was = gone_.find(k);  // the same request back (same rid) keeps its uid
    const bool back = was != gone_.end() && was->second.second == rep.rid;
    m.rep = std::move(rep);
    const uint64_t u = back ? was->second.first : next_uid_++;
    uid_of_.emplace(k, u);
    members_.emplace(u, std::move(m));
}

void Dedup::matched(int64_t k, int64_t n) {
    const uint64_t u = uid_of_.at(k);
    Member& m = members_.at(u);
    if (m.n == n) return;  // neither its membership nor its representative key moved
    leave(u, m);
    m.n = n;
    join(u, m);
}

void Dedup::drop(int64_t k) {
    auto at = uid_of_.find(k);
    if (at == uid_of_.end()) return;
    auto it = members_.find(at->second);
    leave(at->second, it->second);
    gone_.insert_or_assign(k, std::make_pair(at->second, std::move(it->second.rep.rid)));
    members_.erase(it);
    uid_of_.erase(at);
}

void Dedup::touch(Group& g) {
    if (g.touched) return;
    g.touched = true;
    touched_.push_back(&g);
}

void Dedup::leave(uint64_t u, Member& m) {
    if (m.group == nullptr) return;
    m.group->members.erase(u);
    touch(*m.group);  // an emptied group lives on until decide() reads its last verdict
    m.group = nullptr;
}

void Dedup::join(uint64_t u, Member& m) {
    if (m.n > check_ || m.fill_len < width_) return;  // shares fewer than width tokens
    GroupKey key{m.ns, std::vector<int32_t>(m.tokens, m.tokens + width_)};
    auto it = groups_.try_emplace(std::move(key)).first;
    Group& g = it->second;
    g.key = &it->first;
    g.members.insert(u);
    m.group = &g;
    touch(g);
}

bool Dedup::less(const Member& a, const Member& b) const {
    // Python's tuple order on (work, entry, arrival, rid): the first unequal element decides.
    const int64_t wa = prefill_work(a.fill_len, a.n), wb = prefill_work(b.fill_len, b.n);
    if (wa != wb) return wa < wb;
    if (a.rep.entry != b.rep.entry) return a.rep.entry < b.rep.entry;
    if (a.rep.arrival != b.rep.arrival) return a.rep.arrival < b.rep.arrival;
    return a.rep.rid < b.rep.rid;  // bytewise: code point order
}

std::vector<uint64_t> Dedup::non_reps(const Group& g) const {
    std::vector<uint64_t> out;
    if (g.members.size() < 2) return out;
    uint64_t rep = 0;
    const Member* best = nullptr;
    for (uint64_t u : g.members) {
        const Member& m = members_.at(u);
        if (best == nullptr || less(m, *best)) {
            best = &m;
            rep = u;
        }
    }
    out.reserve(g.members.size() - 1);
    for (uint64_t u : g.members)
        if (u != rep) out.push_back(u);
    std::sort(out.begin(), out.end());
    return out;
}

DedupOutcome Dedup::decide(bool afresh) {
    DedupOutcome out;
    if (afresh) {  // every member's status counts as flipped from "kept"
        for (auto& item : groups_) {
            item.second.dup.clear();
            touch(item.second);
        }
        deferred_.clear();
    }
    std::vector<std::vector<uint64_t>> now;
    now.reserve(touched_.size());
    std::vector<uint64_t> flips;
    std::unordered_map<uint64_t, std::string> out_of;  // old verdicts out first: a member may
    for (Group* g : touched_) {                        // change groups
        now.push_back(non_reps(*g));
        if (now.back() == g->dup) continue;
        std::set_symmetric_difference(g->dup.begin(), g->dup.end(), now.back().begin(),
                                      now.back().end(), std::back_inserter(flips));
        for (uint64_t u : g->dup) {
            auto it = deferred_.find(u);
            if (it == deferred_.end()) throw std::logic_error("dedup: a deferred key is lost");
            out_of.emplace(u, std::move(it->second));
            deferred_.erase(it);
        }
    }
    for (size_t i = 0; i < touched_.size(); ++i) {
        Group* g = touched_[i];
        g->touched = false;
        if (now[i] != g->dup) {
            for (uint64_t u : now[i]) enter(u, out_of, out);
            g->dup = std::move(now[i]);
        }
        if (g->members.empty()) groups_.erase(groups_.find(*g->key));
    }
    touched_.clear();
    gone_.clear();
    for (auto& item : out_of) out.left.push_back(std::move(item.second));
    std::sort(flips.begin(), flips.end());
    flips.erase(std::unique(flips.begin(), flips.end()), flips.end());
    for (uint64_t u : flips) {  // those still in a group (as the Python index reported them)
        auto it = members_.find(u);
        if (it != members_.end() && it->second.group != nullptr) out.flipped.push_back(it->second.k);
    }
    std::sort(out.flipped.begin(), out.flipped.end());
    return out;
}

void Dedup::enter(uint64_t u, std::unordered_map<uint64_t, std::string>& out_of,
                  DedupOutcome& out) {
    const std::string& rid = members_.at(u).rep.rid;
    auto was = out_of.find(u);
    if (was != out_of.end() && was->second == rid) {  // deferred before and now: no change
        deferred_.emplace(u, std::move(was->second));
        out_of.erase(was);
        return;
    }
    out.entered.push_back(&rid);
    deferred_.emplace(u, rid);
}

}  // namespace radixsched
