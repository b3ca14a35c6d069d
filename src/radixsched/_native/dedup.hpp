// The in-batch prefix dedup of the waiting queue (the reference: WaitingQueue.dedup in
// radixsched/queue.py), kept across rounds inside the native matcher: a round re-decides only
// the groups whose members joined, left or were re-matched since the last round.
//
// A tracked request is a member of a group when its device match (the matcher's memo n) is at
// most `check` tokens and its fill has at least `width` tokens; the group's key is (namespace
// id, its first `width` fill tokens), hashed, and compared in full on a collision. A group's
// representative is its least member by the reference's dedup_rep_key (radixsched.policies):
// (uncached work, queue entry time, arrival time, rid), a total order; every other member is
// deferred.
//
// Invariant (after decide()): each group's `dup` is its non-representatives and `deferred_`
// holds them all; between rounds, `touched_` holds every group whose members or their keys
// changed since (a left group keeps its `dup` until then, so that the round can tell whose
// status flipped). Pure C++ (no Python here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace radixsched {

// What of a request the representative's choice reads, besides its match: fixed while it waits
// (a requeue tracks it again). `rid` is the request id's code points in UTF-8 (surrogates too):
// bytewise order is Python's str order.
struct RepInputs {
    double entry = 0.0;  // queue_entry_time
    double arrival = 0.0;  // arrival_time
    std::string rid;
};

// A round's verdict as a change to the last one's deferred rids (afresh: to none): the rids
// that `left` it and those that `entered` it (valid until the next change), and the members
// whose status flipped in a group (`flipped`, keys ascending).
struct DedupOutcome {
    std::vector<std::string> left;
    std::vector<const std::string*> entered;
    std::vector<int64_t> flipped;
};

class Dedup {
public:
    Dedup(int64_t check, int64_t width);

    // `k` is tracked with these (borrowed: alive and unchanged until drop or the next put) fill
    // tokens; its match follows (matched()).
    void put(int64_t k, const int32_t* tokens, int64_t fill_len, int32_t ns, RepInputs rep);
    void matched(int64_t k, int64_t n);  // k's device match is now n tokens
    void drop(int64_t k);  // k is no longer tracked
    // The round's verdict; `afresh`: forget the last round's statuses (every member's status
    // counts as flipped from "kept").
    DedupOutcome decide(bool afresh);

private:
    struct GroupKey {
        int32_t ns;
        std::vector<int32_t> head;
        bool operator==(const GroupKey& o) const { return ns == o.ns && head == o.head; }
    };
    struct KeyHash {
        size_t operator()(const GroupKey& g) const;
    };
    struct Group;
    struct Member {
        const int32_t* tokens = nullptr;
        int64_t fill_len = 0;
        int32_t ns = 0;
        int64_t n = -1;  // -1: not matched yet
        int64_t k = 0;  // the caller's key (id(req)): reused once the request is gone
        RepInputs rep;
        Group* group = nullptr;  // null: in no group
    };
    struct Group {
        std::unordered_set<uint64_t> members;  // uids
        std::vector<uint64_t> dup;  // the last round's non-representatives (uids), ascending
        const GroupKey* key = nullptr;  // its key in groups_
        bool touched = false;
    };
    using Groups = std::unordered_map<GroupKey, Group, KeyHash>;  // nodes: stable addresses

    bool less(const Member& a, const Member& b) const;
    std::vector<uint64_t> non_reps(const Group& g) const;
    void touch(Group& g);
    void leave(uint64_t u, Member& m);
    void join(uint64_t u, Member& m);
    void enter(uint64_t u, std::unordered_map<uint64_t, std::string>& out_of, DedupOutcome& out);

    int64_t check_;
    int64_t width_;
    // Members by a serial number of their own, given at put(): the caller's key may come back
    // for another request before the round that lets the first one go (CPython reuses ids), and
    // a group's last verdict must still name the one that left.
    uint64_t next_uid_ = 0;
    std::unordered_map<int64_t, uint64_t> uid_of_;  // caller's key -> its member's uid
    // Members dropped since the last round: caller's key -> (uid, rid). A request tracked again
    // under its key before the round (a requeue) is the same member: it gets its uid back, so
    // that the round compares its status with its own last one (not a stranger's).
    std::unordered_map<int64_t, std::pair<uint64_t, std::string>> gone_;
    std::unordered_map<uint64_t, Member> members_;
    Groups groups_;
    std::vector<Group*> touched_;
    std::unordered_map<uint64_t, std::string> deferred_;  // uid -> rid (it may have left since)
};

}  // namespace radixsched
