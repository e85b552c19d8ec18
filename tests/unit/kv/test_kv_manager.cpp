// Tests for runtime/kv/kv_manager: copy-on-write, rollback, fork, fragmentation worked by hand, and a
// seeded property test that drives random operation sequences against the test's own shadow model
// (block tables, ref counts, a token-keyed prefix cache, simulated KV slots) and checks every invariant
// after every operation.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kv/kv_manager.h"

using steward::BlockCopy;
using steward::KvManager;
using steward::SeqId;

namespace {

using Tokens = std::vector<int32_t>;

Tokens iota_tokens(int n, int32_t first) {
    Tokens t(n);
    for (int i = 0; i < n; ++i) t[i] = first + i;
    return t;
}

// Appends tokens and computes them (allocate, commit); returns the copies allocate_slots asked for.
std::vector<BlockCopy> extend(KvManager& m, SeqId id, const Tokens& more) {
    m.append_tokens(id, more);
    auto copies = m.allocate_slots(id, static_cast<int>(more.size()));
    REQUIRE(copies.has_value());
    m.commit_computed(id, static_cast<int>(more.size()));
    return *copies;
}

SeqId start(KvManager& m, int32_t tenant, const Tokens& prompt) {
    const SeqId id = m.add_seq(tenant, prompt);
    const int hit = m.get_computed_blocks(id);
    const int rest = static_cast<int>(prompt.size()) - hit;
    REQUIRE(m.allocate_slots(id, rest).has_value());
    m.commit_computed(id, rest);
    return id;
}

bool same_copy(const BlockCopy& a, const BlockCopy& b) {
    return a.src_block == b.src_block && a.dst_block == b.dst_block && a.n_slots == b.n_slots;
}

}  // namespace

TEST_CASE("A fork shares blocks and each side's first write into the shared last block is copied", "[kv]") {
    const int bs = 4;
    KvManager m(16, bs);
    const SeqId a = start(m, 1, iota_tokens(6, 10));  // blocks x (full), y (2 of 4)
    const auto ta = m.seq(a).blocks;
    REQUIRE(ta.size() == 2);
    const SeqId c = m.fork(a);
    REQUIRE(m.seq(c).blocks == ta);
    REQUIRE(m.seq(c).tokens == m.seq(a).tokens);
    REQUIRE(m.pool().ref_count(ta[0]) == 2);
    REQUIRE(m.pool().ref_count(ta[1]) == 2);
    REQUIRE(m.stats().n_branches == 1);

    // a appends: its partly filled block is shared, so it gets a fresh one and 2 slots to copy.
    REQUIRE(m.n_blocks_needed(a, 1) == 1);
    const auto copies = extend(m, a, {99});
    const auto ta2 = m.seq(a).blocks;
    REQUIRE(ta2[0] == ta[0]);
    REQUIRE(ta2[1] != ta[1]);
    REQUIRE(copies.size() == 1);
    REQUIRE(same_copy(copies[0], BlockCopy{ta[1], ta2[1], 2}));
    REQUIRE(m.pool().ref_count(ta[0]) == 2);
    REQUIRE(m.pool().ref_count(ta[1]) == 1);  // now c's alone
    // c appends: y is no longer shared, so no copy.
    REQUIRE(extend(m, c, {98}).empty());
    REQUIRE(m.seq(c).blocks == ta);
    // Growing past the block boundary needs no copy either: the full block stays shared.
    REQUIRE(extend(m, c, {1, 2, 3}).empty());
    REQUIRE(m.seq(c).blocks.size() == 3);
    REQUIRE(m.stats().n_cow_blocks == 1);

    m.free(a);
    REQUIRE(m.stats().n_branches == 1);  // c is still alive
    m.free(c);
    REQUIRE(m.stats().n_branches == 0);
    REQUIRE(m.pool().n_free() == 16);
}

TEST_CASE("Truncation frees the blocks past the new length and keeps a partly filled last block", "[kv]") {
    const int bs = 4;
    KvManager m(16, bs);
    const SeqId s = start(m, 1, iota_tokens(11, 0));  // 3 blocks: 4, 4, 3
    const auto t = m.seq(s).blocks;
    m.truncate(s, 5);
    REQUIRE(m.seq(s).blocks == std::vector<int32_t>{t[0], t[1]});
    REQUIRE(m.seq(s).n_computed == 5);
    REQUIRE(m.seq(s).n_tokens() == 5);
    REQUIRE(m.pool().ref_count(t[2]) == 0);
    REQUIRE(m.pool().n_free() == 14);
    // Writing on into the kept block (exclusively ours, uncached) needs no copy.
    REQUIRE(extend(m, s, {50, 51}).empty());
    REQUIRE(m.seq(s).blocks == std::vector<int32_t>{t[0], t[1]});
    m.truncate(s, 4);  // exactly one full block: the second goes
    REQUIRE(m.seq(s).blocks == std::vector<int32_t>{t[0]});
    m.truncate(s, 0);
    REQUIRE(m.seq(s).blocks.empty());
    REQUIRE(m.pool().n_free() == 16);
}

TEST_CASE("Rolling back into a published block copies it before writing, so the cache stays intact", "[kv]") {
    const int bs = 4;
    KvManager m(16, bs);
    const SeqId s = start(m, 1, iota_tokens(9, 0));
    REQUIRE(m.publish_full_blocks(s) == 2);
    const auto t = m.seq(s).blocks;
    m.truncate(s, 6);  // back into the cached second block
    const auto copies = extend(m, s, {70, 71});
    REQUIRE(copies.size() == 1);
    REQUIRE(same_copy(copies[0], BlockCopy{t[1], m.seq(s).blocks[1], 2}));
    REQUIRE(m.seq(s).blocks[1] != t[1]);
    // The old block is still cached (now evictable) and another request finds the original prefix.
    REQUIRE(m.pool().is_cached(t[1]));
    REQUIRE(m.pool().ref_count(t[1]) == 0);
    const SeqId other = m.add_seq(1, iota_tokens(9, 0));
    REQUIRE(m.get_computed_blocks(other) == 8);
    REQUIRE(m.seq(other).blocks == std::vector<int32_t>{t[0], t[1]});
}

TEST_CASE("A failed allocation changes nothing and succeeds once blocks are freed", "[kv]") {
    const int bs = 4;
    KvManager m(4, bs);
    const SeqId a = start(m, 1, iota_tokens(10, 0));  // 3 blocks
    const SeqId b = m.add_seq(2, iota_tokens(8, 100));
    REQUIRE(m.get_computed_blocks(b) == 0);
    REQUIRE(m.n_blocks_needed(b, 8) == 2);
    const auto before_free = m.pool().n_free();
    REQUIRE_FALSE(m.allocate_slots(b, 8).has_value());
    REQUIRE(m.seq(b).blocks.empty());
    REQUIRE(m.pool().n_free() == before_free);
    REQUIRE(m.stats().n_alloc_failures == 1);
    // One block fits.
    auto one = m.allocate_slots(b, 4);
    REQUIRE(one.has_value());
    m.commit_computed(b, 4);
    REQUIRE_FALSE(m.allocate_slots(b, 4).has_value());
    REQUIRE(m.seq(b).blocks.size() == 1);
    m.free(a);  // the scheduler's answer: preempt someone
    REQUIRE(m.allocate_slots(b, 4).has_value());
    REQUIRE(m.seq(b).blocks.size() == 2);
}

TEST_CASE("Freeing a sequence queues its tail blocks for eviction before its head", "[kv]") {
    const int bs = 4;
    KvManager m(8, bs);
    const SeqId s = start(m, 1, iota_tokens(12, 0));
    REQUIRE(m.publish_full_blocks(s) == 3);
    const auto t = m.seq(s).blocks;
    m.free(s);
    // A chain is only useful up to its first missing block, so its last block should go first.
    REQUIRE(m.pool().evictable_lru() == std::vector<int32_t>{t[2], t[1], t[0]});
}

TEST_CASE("Fragmentation counts the empty slots of allocated blocks, a shared block once", "[kv]") {
    const int bs = 4;
    KvManager m(16, bs);
    REQUIRE(m.fragmentation() == 0.0);
    const SeqId a = start(m, 1, iota_tokens(6, 0));    // 4 + 2
    const SeqId b = start(m, 2, iota_tokens(9, 100));  // 4 + 4 + 1
    // 5 blocks = 20 slots, 15 hold a token: 5 / 20.
    REQUIRE(m.fragmentation() == Approx(5.0 / 20.0));
    const SeqId c = m.fork(a);  // shares both of a's blocks: nothing new allocated
    REQUIRE(m.fragmentation() == Approx(5.0 / 20.0));
    extend(m, c, {7});  // c copies a's half block into its own: 4(shared) 2 | 3 | 4 4 1 -> 24 slots, 18 held
    REQUIRE(m.fragmentation() == Approx(6.0 / 24.0));
    m.truncate(b, 8);  // b drops its 1-token block: 20 slots, 17 held
    REQUIRE(m.fragmentation() == Approx(3.0 / 20.0));
    m.free(a);  // a's half block goes; the full one is still c's: 4 3 | 4 4 -> 16 slots, 15 held
    REQUIRE(m.fragmentation() == Approx(1.0 / 16.0));
    // Slots allocated but not yet computed are empty slots too.
    m.append_tokens(b, Tokens{1, 2, 3});
    REQUIRE(m.allocate_slots(b, 3).has_value());  // a new block for b: 20 slots, 15 held
    REQUIRE(m.fragmentation() == Approx(5.0 / 20.0));
    m.commit_computed(b, 3);  // 18 held
    REQUIRE(m.fragmentation() == Approx(2.0 / 20.0));
    REQUIRE(m.stats().fragmentation == Approx(2.0 / 20.0));
    REQUIRE(m.stats().n_blocks_in_use == 5);
}

TEST_CASE("A sequence that grows into the public prefix publishes its later blocks as public", "[kv]") {
    const int bs = 4;
    KvManager m(32, bs);
    const Tokens pub = iota_tokens(8, 500);
    m.set_public_prefixes({pub});
    // Tenant 1 starts with half of the public prefix: not public yet.
    const SeqId s = start(m, 1, Tokens(pub.begin(), pub.begin() + 4));
    REQUIRE(m.publish_full_blocks(s) == 1);
    const int32_t private_block = m.seq(s).blocks[0];
    REQUIRE_FALSE(m.pool().info(private_block).is_public);
    // It generates the rest of the public prefix and more: block 0 keeps its private hash, block 1 is public
    // but chained from the public hash of block 0, which nobody holds; so other tenants hit nothing.
    extend(m, s, Tokens(pub.begin() + 4, pub.end()));
    extend(m, s, {1});
    REQUIRE(m.publish_full_blocks(s) == 1);
    REQUIRE(m.pool().info(m.seq(s).blocks[1]).is_public);
    Tokens pub_and_more = pub;
    pub_and_more.push_back(9);
    const SeqId other = m.add_seq(2, pub_and_more);
    REQUIRE(m.get_computed_blocks(other) == 0);
    REQUIRE(m.stats().n_tenant_boundary_hit_tokens == 0);
}

namespace {

// The property test's own model of what the KV manager should be doing. It never hashes: its prefix cache
// is keyed by (domain, token prefix through the block), where domain is -1 for a block inside the public
// prefix and the tenant id otherwise. It simulates KV storage slot by slot: each slot records the token
// and tenant that wrote it, so a wrong cache hit, a missed copy-on-write or a reused live block shows up
// as a sequence reading back tokens that are not its own.
#define SHADOW_EXPECT(cond, what)                                                                   \
    do {                                                                                            \
        if (!(cond)) return std::string(what) + " [" #cond "] at line " + std::to_string(__LINE__); \
    } while (0)

class Shadow {
public:
    struct Seq {
        int32_t tenant = 0;
        Tokens tokens;
        int n_computed = 0;
        std::vector<int32_t> blocks;
        bool is_fork = false;
    };
    using Key = std::pair<int64_t, Tokens>;
    struct Cached {
        Key key;
        int32_t writer = 0;
    };
    struct Totals {
        int64_t n_ops = 0, n_hit_tokens = 0, n_public_cross = 0, n_cow_copies = 0, n_evictions = 0;
        int64_t n_alloc_failures = 0, n_dedupes = 0, n_forks = 0, n_public_status_changes = 0, n_commits = 0;
        int64_t n_forks_with_reserved = 0;
    };

    Shadow(uint32_t seed, int n_blocks, int bs)
        : rng_(seed),
          n_blocks_(n_blocks),
          bs_(bs),
          m_(n_blocks, bs),
          slot_token_(n_blocks, std::vector<int32_t>(bs, -1)),
          slot_tenant_(n_blocks, std::vector<int32_t>(bs, -1)) {
        pub_ = iota_tokens(10, 100);  // 2 full public blocks; the third block straddles its end
        m_.set_public_prefixes({pub_});
        Tokens pub_ext = pub_;
        for (int32_t t : iota_tokens(6, 200)) pub_ext.push_back(t);
        prefixes_ = {pub_, pub_ext, iota_tokens(12, 300), iota_tokens(7, 400), Tokens(pub_.begin(), pub_.begin() + 6),
                     {}};
    }

    // One random operation followed by the full invariant check; "" when all is well.
    std::string step() {
        ++totals_.n_ops;
        const int r = pick(0, 99);
        std::string err;
        if (r < 16)
            err = op_new();
        else if (r < 40)
            err = op_allocate(/*then_commit=*/true);
        else if (r < 47)
            err = op_allocate(/*then_commit=*/false);  // reserve slots, commit later (or never)
        else if (r < 54)
            err = op_commit();
        else if (r < 68)
            err = op_append();
        else if (r < 78)
            err = op_publish();
        else if (r < 86)
            err = op_truncate();
        else if (r < 93)
            err = op_fork();
        else
            err = op_free(random_seq());
        if (!err.empty()) return last_op_ + ": " + err;
        err = check();
        return err.empty() ? err : "after " + last_op_ + ": " + err;
    }

    // Frees everything in random order, checking after each, then the pool must be entirely free.
    std::string drain() {
        while (!seqs_.empty()) {
            std::string err = op_free(random_seq());
            if (err.empty()) err = check();
            if (!err.empty()) return "drain: " + err;
        }
        const auto& pool = m_.pool();
        SHADOW_EXPECT(pool.n_free() == pool.n_total(), "free blocks == total blocks after freeing everything");
        SHADOW_EXPECT(pool.n_used() == 0, "no block in use");
        for (int32_t b = 0; b < n_blocks_; ++b) SHADOW_EXPECT(pool.ref_count(b) == 0, "every ref count is 0");
        SHADOW_EXPECT(pool.check_invariants().empty(), pool.check_invariants());
        SHADOW_EXPECT(m_.stats().fragmentation == 0.0, "no allocation, no fragmentation");
        return "";
    }

    const Totals& totals() const { return totals_; }

private:
    int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

    SeqId random_seq() {
        auto it = seqs_.begin();
        if (seqs_.empty()) return -1;
        std::advance(it, pick(0, static_cast<int>(seqs_.size()) - 1));
        return it->first;
    }

    int pub_len(const Tokens& t) const {
        return t.size() >= pub_.size() && std::equal(pub_.begin(), pub_.end(), t.begin())
                   ? static_cast<int>(pub_.size())
                   : 0;
    }
    Key key(const Seq& s, int b) const {
        const int64_t domain = (b + 1) * bs_ <= pub_len(s.tokens) ? -1 : s.tenant;
        return {domain, Tokens(s.tokens.begin(), s.tokens.begin() + (b + 1) * bs_)};
    }
    std::map<int32_t, int> refs() const {
        std::map<int32_t, int> r;
        for (const auto& [id, s] : seqs_)
            for (int32_t b : s.blocks) ++r[b];
        return r;
    }

    std::string op_new() {
        last_op_ = "new";
        if (seqs_.size() >= 12) return "";
        Seq s;
        s.tenant = pick(1, 3);
        s.tokens = prefixes_[pick(0, static_cast<int>(prefixes_.size()) - 1)];
        const int n_tail = pick(0, 9);
        for (int i = 0; i < n_tail; ++i) s.tokens.push_back(pick(0, 7));
        if (s.tokens.empty()) s.tokens.push_back(pick(0, 7));
        const int n = static_cast<int>(s.tokens.size());
        std::vector<int32_t> expected;
        for (int b = 0; b < (n - 1) / bs_; ++b) {
            auto it = cache_.find(key(s, b));
            if (it == cache_.end()) break;
            expected.push_back(it->second);
        }
        const SeqId id = m_.add_seq(s.tenant, s.tokens);
        const int hit = m_.get_computed_blocks(id);
        SHADOW_EXPECT(hit == static_cast<int>(expected.size()) * bs_,
                      "hit tokens == longest cached chain in the model");
        SHADOW_EXPECT(m_.seq(id).blocks == expected, "hit blocks are the model's cached blocks");
        SHADOW_EXPECT(hit < n, "never the whole prompt");
        s.blocks = expected;
        s.n_computed = hit;
        query_[s.tenant] += n;
        hits_[s.tenant] += hit;
        totals_.n_hit_tokens += hit;
        int lookup_public = 0;
        for (int32_t b : expected) {
            const Cached& c = cached_.at(b);
            if (c.writer != s.tenant) {
                SHADOW_EXPECT(c.key.first == -1, "a hit on another tenant's block must be public");
                public_cross_ += bs_;
                totals_.n_public_cross += bs_;
                lookup_public += bs_;
            }
        }
        SHADOW_EXPECT(m_.seq(id).n_cached_tokens == hit, "the sequence's cached tokens == this lookup's hits");
        SHADOW_EXPECT(m_.seq(id).n_cached_public_tokens == lookup_public,
                      "the sequence's public share == this lookup's hits on other tenants' public blocks");
        SHADOW_EXPECT(m_.seq(id).n_cached_cross_tenant_tokens == 0, "no hit on another tenant's private block");
        seqs_.emplace(id, std::move(s));
        return "";
    }

    // allocate_slots for some pending tokens, checked against the model's own count of fresh and
    // copy-on-write blocks; then, if asked, the commit of those tokens.
    std::string op_allocate(bool then_commit) {
        last_op_ = then_commit ? "compute" : "reserve";
        std::vector<SeqId> pending;
        for (const auto& [id, s] : seqs_)
            if (s.n_computed < static_cast<int>(s.tokens.size())) pending.push_back(id);
        if (pending.empty()) return "";
        const SeqId id = pending[pick(0, static_cast<int>(pending.size()) - 1)];
        Seq& s = seqs_.at(id);
        const int n = pick(1, static_cast<int>(s.tokens.size()) - s.n_computed);
        const int nc = s.n_computed;
        const int have = static_cast<int>(s.blocks.size());
        const int total = (nc + n + bs_ - 1) / bs_;
        const auto r = refs();
        std::vector<int> cow;
        for (int b = nc / bs_; b < std::min(have, total); ++b)
            if (r.at(s.blocks[b]) > 1 || cached_.count(s.blocks[b])) cow.push_back(b);
        const int needed = static_cast<int>(cow.size()) + std::max(0, total - have);
        const int n_free = n_blocks_ - static_cast<int>(r.size());
        SHADOW_EXPECT(m_.n_blocks_needed(id, n) == needed, "n_blocks_needed agrees with the model");
        const int64_t evictions_before = m_.pool().stats().n_evictions;
        const auto copies = m_.allocate_slots(id, n);
        if (needed > n_free) {
            last_op_ += " (no room)";
            SHADOW_EXPECT(!copies.has_value(), "allocation fails exactly when the model has too few free blocks");
            SHADOW_EXPECT(m_.seq(id).blocks == s.blocks, "a failed allocation leaves the block table alone");
            SHADOW_EXPECT(m_.pool().n_free() == n_free, "a failed allocation leaves the pool alone");
            SHADOW_EXPECT(m_.pool().stats().n_evictions == evictions_before, "a failed allocation evicts nothing");
            ++totals_.n_alloc_failures;
            return op_free(random_seq());  // the scheduler preempts someone (maybe this very sequence)
        }
        SHADOW_EXPECT(copies.has_value(), "allocation succeeds when the model has enough free blocks");
        const std::vector<int32_t>& t2 = m_.seq(id).blocks;
        SHADOW_EXPECT(static_cast<int>(t2.size()) == std::max(have, total), "block table grows to cover the slots");
        std::set<int32_t> fresh;
        for (int b = 0; b < static_cast<int>(t2.size()); ++b) {
            const bool is_fresh = b >= have || std::find(cow.begin(), cow.end(), b) != cow.end();
            if (!is_fresh) {
                SHADOW_EXPECT(t2[b] == s.blocks[b], "blocks outside the write range stay");
                continue;
            }
            SHADOW_EXPECT(r.count(t2[b]) == 0, "a fresh block was free before");
            SHADOW_EXPECT(fresh.insert(t2[b]).second, "fresh blocks are distinct");
        }
        std::vector<BlockCopy> expected;
        for (int b : cow)
            if (nc - b * bs_ > 0) expected.push_back({s.blocks[b], t2[b], nc - b * bs_});
        SHADOW_EXPECT(copies->size() == expected.size(), "copy-on-write list has the expected length");
        for (size_t i = 0; i < expected.size(); ++i)
            SHADOW_EXPECT(same_copy((*copies)[i], expected[i]), "copy-on-write (src, dst, slots) as the model says");
        for (int32_t b : fresh) {
            auto it = cached_.find(b);
            if (it == cached_.end()) continue;
            cache_.erase(it->second.key);  // evicted to make room
            cached_.erase(it);
            ++evictions_;
            ++totals_.n_evictions;
        }
        for (const BlockCopy& c : *copies) {
            for (int slot = 0; slot < c.n_slots; ++slot) {
                slot_token_[c.dst_block][slot] = slot_token_[c.src_block][slot];
                slot_tenant_[c.dst_block][slot] = slot_tenant_[c.src_block][slot];
            }
            ++totals_.n_cow_copies;
        }
        s.blocks = t2;
        if (then_commit) commit(id, s, n);
        return "";
    }

    // Commits tokens into slots reserved earlier, when the model says that is legal: every block written is
    // this sequence's alone and uncached (a fork or publish since the reservation calls for allocate_slots).
    std::string op_commit() {
        last_op_ = "commit";
        std::vector<SeqId> ready;
        for (const auto& [id, s] : seqs_)
            if (s.n_computed < static_cast<int>(std::min(s.tokens.size(), s.blocks.size() * bs_))) ready.push_back(id);
        if (ready.empty()) return "";
        const SeqId id = ready[pick(0, static_cast<int>(ready.size()) - 1)];
        Seq& s = seqs_.at(id);
        const int room = static_cast<int>(std::min(s.tokens.size(), s.blocks.size() * bs_)) - s.n_computed;
        const int n = pick(1, room);
        const auto r = refs();
        for (int b = s.n_computed / bs_; b < (s.n_computed + n + bs_ - 1) / bs_; ++b)
            if (r.at(s.blocks[b]) > 1 || cached_.count(s.blocks[b])) return "";  // would abort: not legal
        commit(id, s, n);
        return "";
    }

    void commit(SeqId id, Seq& s, int n) {
        m_.commit_computed(id, n);
        for (int p = s.n_computed; p < s.n_computed + n; ++p) {
            slot_token_[s.blocks[p / bs_]][p % bs_] = s.tokens[p];
            slot_tenant_[s.blocks[p / bs_]][p % bs_] = s.tenant;
        }
        s.n_computed += n;
        ++totals_.n_commits;
    }

    std::string op_append() {
        last_op_ = "append";
        const SeqId id = random_seq();
        if (id < 0) return "";
        Seq& s = seqs_.at(id);
        if (s.tokens.size() >= 40) return "";
        Tokens more;
        const bool inside_pub =
            s.tokens.size() < pub_.size() && std::equal(s.tokens.begin(), s.tokens.end(), pub_.begin());
        if (inside_pub && pick(0, 1) == 0) {
            more.assign(pub_.begin() + s.tokens.size(), pub_.end());  // generates the rest of the public prefix
            ++totals_.n_public_status_changes;
        } else {
            const int k = pick(1, 6);
            for (int i = 0; i < k; ++i) more.push_back(pick(0, 7));
        }
        m_.append_tokens(id, more);
        s.tokens.insert(s.tokens.end(), more.begin(), more.end());
        return "";
    }

    std::string op_publish() {
        last_op_ = "publish";
        const SeqId id = random_seq();
        if (id < 0) return "";
        const Seq& s = seqs_.at(id);
        int expected = 0;
        const int64_t dedupes_before = m_.stats().n_publish_dedupes;
        int n_dedupes = 0;
        for (int b = 0; b < s.n_computed / bs_; ++b) {
            const int32_t blk = s.blocks[b];
            if (cached_.count(blk)) continue;  // a cached block keeps the key it has
            Key k = key(s, b);
            if (cache_.count(k)) {
                ++n_dedupes;
                continue;
            }
            cache_[k] = blk;
            cached_[blk] = {std::move(k), s.tenant};
            ++expected;
        }
        SHADOW_EXPECT(m_.publish_full_blocks(id) == expected, "publish maps the blocks the model maps");
        SHADOW_EXPECT(m_.stats().n_publish_dedupes == dedupes_before + n_dedupes, "dedupes as the model counts");
        totals_.n_dedupes += n_dedupes;
        return "";
    }

    std::string op_truncate() {
        last_op_ = "truncate";
        const SeqId id = random_seq();
        if (id < 0) return "";
        Seq& s = seqs_.at(id);
        const int len = static_cast<int>(s.tokens.size());
        const int n = pick(std::max(0, len - 8), len);
        m_.truncate(id, n);
        s.tokens.resize(n);
        s.n_computed = std::min(s.n_computed, n);
        s.blocks.resize(std::min(s.blocks.size(), static_cast<size_t>((n + bs_ - 1) / bs_)));
        return "";
    }

    std::string op_fork() {
        last_op_ = "fork";
        const SeqId id = random_seq();
        if (id < 0 || seqs_.size() >= 12) return "";
        Seq child = seqs_.at(id);
        child.blocks.resize(std::min(child.blocks.size(), static_cast<size_t>((child.n_computed + bs_ - 1) / bs_)));
        child.is_fork = true;
        if (child.blocks.size() < seqs_.at(id).blocks.size()) ++totals_.n_forks_with_reserved;
        const SeqId c = m_.fork(id);
        SHADOW_EXPECT(m_.seq(c).blocks == child.blocks, "a fork shares the blocks holding computed tokens");
        seqs_.emplace(c, std::move(child));
        ++totals_.n_forks;
        return "";
    }

    std::string op_free(SeqId id) {
        if (id < 0) return "";
        m_.free(id);
        seqs_.erase(id);
        return "";
    }

    std::string check() const {
        const auto& pool = m_.pool();
        SHADOW_EXPECT(pool.check_invariants().empty(), pool.check_invariants());
        const auto r = refs();
        for (int32_t b = 0; b < n_blocks_; ++b) {
            auto it = r.find(b);
            SHADOW_EXPECT(pool.ref_count(b) == (it == r.end() ? 0 : it->second),
                          "pool ref count == model's references");
            const bool cached = cached_.count(b) != 0;
            SHADOW_EXPECT(pool.is_cached(b) == cached, "pool caches exactly the model's cached blocks");
            if (cached) {
                const auto info = pool.info(b);
                const Cached& c = cached_.at(b);
                SHADOW_EXPECT(info.tenant == c.writer, "first writer recorded");
                SHADOW_EXPECT(info.is_public == (c.key.first == -1), "public flag recorded");
                SHADOW_EXPECT(pool.peek_cached(*info.hash) == b, "hash map finds the block by its hash");
            }
        }
        SHADOW_EXPECT(pool.n_used() == static_cast<int>(r.size()), "blocks in use == referenced blocks");
        SHADOW_EXPECT(pool.n_free() == n_blocks_ - static_cast<int>(r.size()), "no block both free and referenced");
        SHADOW_EXPECT(pool.n_cached() == static_cast<int>(cached_.size()), "cached count");

        std::map<int32_t, int> filled;
        int n_forks = 0;
        for (const auto& [id, s] : seqs_) {
            const auto& ms = m_.seq(id);
            SHADOW_EXPECT(ms.blocks == s.blocks, "block table == model");
            SHADOW_EXPECT(ms.tokens == s.tokens, "tokens == model");
            SHADOW_EXPECT(ms.n_computed == s.n_computed, "n_computed == model");
            SHADOW_EXPECT(static_cast<int>(s.blocks.size()) * bs_ >= s.n_computed, "computed tokens have slots");
            // Slots another tenant wrote may only hold public content: inside the public prefix's full blocks,
            // with everything up to them equal to the public prefix (a rollback may have cut the prefix short
            // since, so the sequence need not hold all of it now).
            int public_end = 0;
            while (public_end < static_cast<int>(pub_.size()) / bs_ * bs_ &&
                   public_end < static_cast<int>(s.tokens.size()) && s.tokens[public_end] == pub_[public_end])
                ++public_end;
            for (int p = 0; p < s.n_computed; ++p) {
                const int32_t blk = s.blocks[p / bs_];
                SHADOW_EXPECT(slot_token_[blk][p % bs_] == s.tokens[p], "a sequence reads back its own tokens");
                if (slot_tenant_[blk][p % bs_] != s.tenant)
                    SHADOW_EXPECT(p < public_end, "another tenant's KV is read only inside the public prefix");
            }
            for (size_t i = 0; i < s.blocks.size(); ++i) {
                int& f = filled[s.blocks[i]];
                f = std::max(f, std::clamp(s.n_computed - static_cast<int>(i) * bs_, 0, bs_));
            }
            n_forks += s.is_fork;
        }
        int64_t n_filled = 0;
        for (const auto& [b, f] : filled) n_filled += f;
        const double frag = filled.empty() ? 0.0 : 1.0 - static_cast<double>(n_filled) / (filled.size() * bs_);

        const auto st = m_.stats();
        SHADOW_EXPECT(st.n_tenant_boundary_hit_tokens == 0, "no tenant-boundary hit");
        SHADOW_EXPECT(st.n_public_cross_tenant_hit_tokens == public_cross_, "public cross-tenant hits == model");
        SHADOW_EXPECT(st.n_evictions == evictions_, "evictions == the model's evicted cached blocks");
        SHADOW_EXPECT(st.n_blocks_in_use == static_cast<int>(r.size()), "stats: blocks in use");
        SHADOW_EXPECT(st.n_branches == n_forks, "branch count == live forks");
        SHADOW_EXPECT(st.n_seqs == static_cast<int>(seqs_.size()), "sequence count");
        SHADOW_EXPECT(std::abs(st.fragmentation - frag) < 1e-12, "fragmentation == model");
        for (const auto& [tenant, q] : query_) {
            auto it = st.per_tenant.find(tenant);
            SHADOW_EXPECT(it != st.per_tenant.end(), "per-tenant counters exist");
            SHADOW_EXPECT(it->second.n_query_tokens == q, "per-tenant query tokens");
            SHADOW_EXPECT(it->second.n_hit_tokens == hits_.at(tenant), "per-tenant hit tokens");
        }
        return "";
    }

    std::mt19937 rng_;
    int n_blocks_;
    int bs_;
    KvManager m_;
    Tokens pub_;
    std::vector<Tokens> prefixes_;
    std::map<SeqId, Seq> seqs_;
    std::map<Key, int32_t> cache_;
    std::map<int32_t, Cached> cached_;
    std::vector<std::vector<int32_t>> slot_token_;   // [n_blocks][bs]
    std::vector<std::vector<int32_t>> slot_tenant_;  // [n_blocks][bs]
    std::map<int32_t, int64_t> query_, hits_;
    int64_t public_cross_ = 0;
    int64_t evictions_ = 0;
    std::string last_op_;
    Totals totals_;
};

#undef SHADOW_EXPECT

}  // namespace

TEST_CASE("Random operation sequences keep the KV manager equal to an independent model", "[kv]") {
    const int n_seeds = 40;
    const int n_ops = 2500;
    Shadow::Totals sum;
    for (uint32_t seed = 1; seed <= n_seeds; ++seed) {
        Shadow sh(seed, /*n_blocks=*/32, /*bs=*/4);
        for (int i = 0; i < n_ops; ++i) {
            const std::string err = sh.step();
            if (!err.empty()) {
                INFO("seed " << seed << ", op " << i);
                FAIL(err);
            }
        }
        const std::string err = sh.drain();
        INFO("seed " << seed);
        REQUIRE(err.empty());
        const auto& t = sh.totals();
        sum.n_ops += t.n_ops;
        sum.n_hit_tokens += t.n_hit_tokens;
        sum.n_public_cross += t.n_public_cross;
        sum.n_cow_copies += t.n_cow_copies;
        sum.n_evictions += t.n_evictions;
        sum.n_alloc_failures += t.n_alloc_failures;
        sum.n_dedupes += t.n_dedupes;
        sum.n_forks += t.n_forks;
        sum.n_public_status_changes += t.n_public_status_changes;
        sum.n_commits += t.n_commits;
        sum.n_forks_with_reserved += t.n_forks_with_reserved;
    }
    // The workload must actually exercise what it claims to.
    INFO("ops " << sum.n_ops << " hits " << sum.n_hit_tokens << " public cross " << sum.n_public_cross << " cow "
                << sum.n_cow_copies << " evictions " << sum.n_evictions << " alloc failures " << sum.n_alloc_failures
                << " dedupes " << sum.n_dedupes << " forks " << sum.n_forks << " public status changes "
                << sum.n_public_status_changes << " commits " << sum.n_commits << " forks with reserved slots "
                << sum.n_forks_with_reserved);
    CHECK(sum.n_hit_tokens > 1000);
    CHECK(sum.n_public_cross > 100);
    CHECK(sum.n_cow_copies > 100);
    CHECK(sum.n_evictions > 100);
    CHECK(sum.n_alloc_failures > 100);
    CHECK(sum.n_dedupes > 10);
    CHECK(sum.n_forks > 100);
    CHECK(sum.n_public_status_changes > 10);
    CHECK(sum.n_forks_with_reserved > 10);
}
