// Tests for runtime/kv/block_hash and the prefix-cache side of runtime/kv/kv_manager: hash primitives
// against published vectors, chain properties, public prefixes, tenant isolation and hit accounting
// against numbers worked out by hand.
#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_manager.h"

using steward::BlockHash;
using steward::KvManager;
using steward::SeqId;

namespace {

using Tokens = std::vector<int32_t>;

Tokens concat(std::initializer_list<Tokens> parts) {
    Tokens out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

Tokens iota_tokens(int n, int32_t first) {
    Tokens t(n);
    for (int i = 0; i < n; ++i) t[i] = first + i;
    return t;
}

// One request's prefill: look up, allocate the rest, "compute" it, publish. Returns the sequence and its hit.
struct Served {
    SeqId id;
    int n_hit;
};
Served serve(KvManager& m, int32_t tenant, const Tokens& prompt) {
    const SeqId id = m.add_seq(tenant, prompt);
    const int n_hit = m.get_computed_blocks(id);
    const int n_rest = static_cast<int>(prompt.size()) - n_hit;
    auto copies = m.allocate_slots(id, n_rest);
    REQUIRE(copies.has_value());
    REQUIRE(copies->empty());
    m.commit_computed(id, n_rest);
    m.publish_full_blocks(id);
    return {id, n_hit};
}

// Inverse of splitmix64's output function, written from its definition: undo each xor-shift and multiply.
uint64_t undo_xorshift(uint64_t y, int s) {
    uint64_t x = y;
    for (int i = 0; i < 64 / s + 1; ++i) x = y ^ (x >> s);
    return x;
}
uint64_t mul_inverse(uint64_t m) {
    uint64_t inv = m;  // Newton: each step doubles the correct low bits (m is odd)
    for (int i = 0; i < 6; ++i) inv *= 2 - m * inv;
    return inv;
}
uint64_t splitmix64_inverse(uint64_t z) {
    uint64_t x = undo_xorshift(z, 31);
    x *= mul_inverse(0x94d049bb133111ebull);
    x = undo_xorshift(x, 27);
    x *= mul_inverse(0xbf58476d1ce4e5b9ull);
    x = undo_xorshift(x, 30);
    return x - 0x9e3779b97f4a7c15ull;
}

void put_le(std::vector<uint8_t>& out, uint64_t v, int n_bytes) {
    for (int i = 0; i < n_bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace

TEST_CASE("The hash primitives match their published test vectors", "[kv]") {
    auto fnv = [](const char* s) {
        std::vector<uint8_t> b(s, s + std::char_traits<char>::length(s));
        return steward::fnv1a_64(b);
    };
    // FNV-1a 64 vectors from the FNV reference test suite.
    REQUIRE(fnv("") == 0xcbf29ce484222325ull);
    REQUIRE(fnv("a") == 0xaf63dc4c8601ec8cull);
    REQUIRE(fnv("foobar") == 0x85944171f73967e8ull);
    // splitmix64 seeded with 0 (Vigna's reference generator): outputs k = splitmix64(k * golden ratio).
    REQUIRE(steward::splitmix64(0) == 0xe220a8397b1dcdafull);
    REQUIRE(steward::splitmix64(0x9e3779b97f4a7c15ull) == 0x6e789e6aa1b965f4ull);
    REQUIRE(steward::splitmix64(0x9e3779b97f4a7c15ull * 2) == 0x06c45d188009454full);
}

TEST_CASE("A block hash is splitmix64 of FNV-1a over the little-endian parent, salt, count and tokens", "[kv]") {
    const Tokens block{7, -1, 65536, 3};
    std::vector<uint8_t> bytes;
    put_le(bytes, 0x1122334455667788ull, 8);
    put_le(bytes, 0xdeadbeefull, 8);
    put_le(bytes, block.size(), 4);
    for (int32_t t : block) put_le(bytes, static_cast<uint32_t>(t), 4);
    REQUIRE(bytes.size() == 36);
    REQUIRE(steward::hash_block(0x1122334455667788ull, block, 0xdeadbeefull) ==
            steward::splitmix64(steward::fnv1a_64(bytes)));
}

TEST_CASE("No tenant salt is the public salt and distinct tenants get distinct salts", "[kv]") {
    // splitmix64 is a bijection; tenant_salt feeds it 2^32 | tenant. The one input mapping to 0 must lie
    // outside that range.
    const uint64_t zero_preimage = splitmix64_inverse(steward::k_public_salt);
    REQUIRE(steward::splitmix64(zero_preimage) == 0);
    REQUIRE((zero_preimage >> 32) != 1);
    std::unordered_set<uint64_t> salts;
    for (int32_t t : {0, 1, 2, 3, -1, 1000, INT32_MAX, INT32_MIN}) {
        REQUIRE(steward::tenant_salt(t) != steward::k_public_salt);
        salts.insert(steward::tenant_salt(t));
    }
    REQUIRE(salts.size() == 8);
}

TEST_CASE("A block hash depends on its parent chain and tokens, not on the blocks after it", "[kv]") {
    const int bs = 4;
    Tokens t = iota_tokens(16, 100);
    const auto base = steward::hash_block_chain(t, bs, 77, {});
    REQUIRE(base.size() == 4);
    // Extending the sequence (with a partial block) leaves every existing hash alone.
    Tokens longer = concat({t, {1, 2, 3, 4, 5}});
    auto ext = steward::hash_block_chain(longer, bs, 77, {});
    REQUIRE(ext.size() == 5);
    REQUIRE(std::vector<BlockHash>(ext.begin(), ext.begin() + 4) == base);
    // One token changed in block 1 changes block 1 and every later hash, not block 0.
    Tokens changed = t;
    changed[5] = 9999;
    auto ch = steward::hash_block_chain(changed, bs, 77, {});
    REQUIRE(ch[0] == base[0]);
    for (int b = 1; b < 4; ++b) REQUIRE(ch[b] != base[b]);
    // Two blocks with equal tokens at different depths hash differently (their parents differ).
    Tokens twice = concat({iota_tokens(4, 5), iota_tokens(4, 5)});
    auto tw = steward::hash_block_chain(twice, bs, 77, {});
    REQUIRE(tw[0] != tw[1]);
    // The chain is hash_block applied block by block from the root.
    REQUIRE(base[0] == steward::hash_block(steward::k_root_block_hash, std::span(t).first(4), 77));
    REQUIRE(base[1] == steward::hash_block(base[0], std::span(t).subspan(4, 4), 77));
    // Another salt changes every hash.
    auto other = steward::hash_block_chain(t, bs, 78, {});
    for (int b = 0; b < 4; ++b) REQUIRE(other[b] != base[b]);
}

TEST_CASE("Block hashes do not collide and a one-bit change flips about half the bits", "[kv]") {
    std::mt19937_64 rng(12345);
    std::uniform_int_distribution<int32_t> tok(0, 31999);
    std::unordered_set<BlockHash> seen;
    Tokens block(16);
    const int n = 100000;
    for (int i = 0; i < n; ++i) {
        for (auto& x : block) x = tok(rng);
        seen.insert(steward::hash_block(rng(), block, rng() & 3));
    }
    REQUIRE(seen.size() == static_cast<size_t>(n));
    // Avalanche: mean Hamming distance after flipping one input bit should be near 32 of 64.
    double total = 0;
    const int trials = 4000;
    for (int i = 0; i < trials; ++i) {
        for (auto& x : block) x = tok(rng);
        const uint64_t parent = rng();
        const BlockHash h0 = steward::hash_block(parent, block, 5);
        Tokens flipped = block;
        flipped[rng() % 16] ^= 1 << (rng() % 15);
        total += std::popcount(h0 ^ steward::hash_block(parent, flipped, 5));
    }
    const double mean = total / trials;
    REQUIRE(mean > 31.0);
    REQUIRE(mean < 33.0);
}

TEST_CASE("Blocks inside a whole public prefix hash alike for every tenant, later ones never", "[kv]") {
    const int bs = 4;
    const Tokens pub = iota_tokens(10, 500);  // 2.5 blocks: two public blocks, the third straddles
    const std::vector<Tokens> publics{pub};
    const Tokens prompt = concat({pub, {1, 2, 3, 4, 5, 6}});  // 16 tokens, 4 blocks
    const auto a = steward::hash_block_chain(prompt, bs, steward::tenant_salt(1), publics);
    const auto b = steward::hash_block_chain(prompt, bs, steward::tenant_salt(2), publics);
    REQUIRE(a.size() == 4);
    REQUIRE(a[0] == b[0]);
    REQUIRE(a[1] == b[1]);
    REQUIRE(a[2] != b[2]);  // holds pub[8..10) but also private tokens: tenant-salted
    REQUIRE(a[3] != b[3]);
    // Public blocks use salt 0.
    REQUIRE(a[0] == steward::hash_block(steward::k_root_block_hash, std::span(prompt).first(4), 0));
    REQUIRE(steward::public_prefix_length(prompt, publics) == 10);

    // A prompt holding only 9 of the 10 public tokens does not start with the public prefix: all private.
    Tokens partial = prompt;
    partial[9] = 42;
    REQUIRE(steward::public_prefix_length(partial, publics) == 0);
    const auto pa = steward::hash_block_chain(partial, bs, steward::tenant_salt(1), publics);
    const auto pb = steward::hash_block_chain(partial, bs, steward::tenant_salt(2), publics);
    for (int i = 0; i < 4; ++i) REQUIRE(pa[i] != pb[i]);

    // With nested public prefixes the longest one the prompt starts with counts.
    const std::vector<Tokens> nested{iota_tokens(8, 500), concat({iota_tokens(10, 500), {1, 2}})};
    REQUIRE(steward::public_prefix_length(prompt, nested) == 12);
    const auto na = steward::hash_block_chain(prompt, bs, steward::tenant_salt(1), nested);
    const auto nb = steward::hash_block_chain(prompt, bs, steward::tenant_salt(2), nested);
    REQUIRE(na[2] == nb[2]);
    REQUIRE(na[3] != nb[3]);
}

TEST_CASE("Tenant B never hits tenant A's private blocks, only the declared-public prefix", "[kv]") {
    const int bs = 4;
    KvManager m(64, bs);
    const Tokens pub = iota_tokens(8, 1000);  // 2 public blocks
    const Tokens doc = iota_tokens(8, 2000);  // private to whoever writes it
    m.set_public_prefixes({pub});
    const Tokens x = concat({pub, doc, {1}});  // 17 tokens: at most 4 blocks can hit
    const Tokens y = concat({doc, {2}});       // 9 tokens: at most 2 blocks can hit
    const int32_t A = 1, B = 2, C = 3;

    // Worked by hand (hits, public cross-tenant hits):
    auto s1 = serve(m, A, x);  // cold cache: 0; publishes 2 public + 2 A blocks
    REQUIRE(s1.n_hit == 0);
    auto s2 = serve(m, B, x);  // the 2 public blocks only: 8 (cross 8); block 2 is B-salted: miss
    REQUIRE(s2.n_hit == 8);
    auto s3 = serve(m, A, x);  // A's own chain: 16 (cross 0)
    REQUIRE(s3.n_hit == 16);
    auto s4 = serve(m, B, y);  // doc at the start, B-salted, never published that way: 0
    REQUIRE(s4.n_hit == 0);
    auto s5 = serve(m, A, y);  // A never had doc at the start either: 0
    REQUIRE(s5.n_hit == 0);
    auto s6 = serve(m, C, x);  // public blocks only: 8 (cross 8)
    REQUIRE(s6.n_hit == 8);
    auto s7 = serve(m, B, y);  // B's own doc blocks from s4: 8
    REQUIRE(s7.n_hit == 8);

    // Block tables: public blocks are shared across tenants, private ones never.
    const auto& t1 = m.seq(s1.id).blocks;
    const auto& t2 = m.seq(s2.id).blocks;
    const auto& t3 = m.seq(s3.id).blocks;
    REQUIRE(t2[0] == t1[0]);
    REQUIRE(t2[1] == t1[1]);
    REQUIRE(t2[2] != t1[2]);
    REQUIRE(t2[3] != t1[3]);
    REQUIRE(std::vector<int32_t>(t3.begin(), t3.begin() + 4) == std::vector<int32_t>(t1.begin(), t1.begin() + 4));
    REQUIRE(m.seq(s5.id).blocks[0] != m.seq(s4.id).blocks[0]);
    REQUIRE(m.seq(s7.id).blocks[0] == m.seq(s4.id).blocks[0]);
    // Who wrote what: the pool records the first writer and whether it is public.
    REQUIRE(m.pool().info(t1[0]).tenant == A);
    REQUIRE(m.pool().info(t1[0]).is_public);
    REQUIRE_FALSE(m.pool().info(t1[2]).is_public);
    REQUIRE(m.pool().info(t2[2]).tenant == B);

    const auto st = m.stats();
    REQUIRE(st.n_tenant_boundary_hit_tokens == 0);
    REQUIRE(st.n_public_cross_tenant_hit_tokens == 16);
    REQUIRE(st.per_tenant.at(A).n_query_tokens == 17 + 17 + 9);
    REQUIRE(st.per_tenant.at(A).n_hit_tokens == 0 + 16 + 0);
    REQUIRE(st.per_tenant.at(B).n_query_tokens == 17 + 9 + 9);
    REQUIRE(st.per_tenant.at(B).n_hit_tokens == 8 + 0 + 8);
    REQUIRE(st.per_tenant.at(C).n_query_tokens == 17);
    REQUIRE(st.per_tenant.at(C).n_hit_tokens == 8);
    REQUIRE(st.n_prefix_query_tokens == 43 + 35 + 17);
    REQUIRE(st.n_prefix_hit_tokens == 16 + 16 + 8);
}

TEST_CASE("N requests sharing an aligned prefix hit (N-1) times the prefix length", "[kv]") {
    const int bs = 16;
    const int n_req = 10;
    const int l_prefix = 64;
    const Tokens prefix = iota_tokens(l_prefix, 100);
    for (bool free_after : {false, true}) {
        KvManager m(256, bs);
        int64_t n_query = 0;
        for (int i = 0; i < n_req; ++i) {
            // Unique tails, some spanning full blocks of their own (published, never hit).
            const Tokens prompt = concat({prefix, iota_tokens(1 + 5 * i, 10000 + 1000 * i)});
            n_query += static_cast<int64_t>(prompt.size());
            auto s = serve(m, /*tenant=*/1, prompt);
            REQUIRE(s.n_hit == (i == 0 ? 0 : l_prefix));
            if (free_after) m.free(s.id);
        }
        const auto st = m.stats();
        // The analytical h * L_prefix * N with h = (N-1)/N: every request but the first hits the prefix.
        REQUIRE(st.n_prefix_hit_tokens == static_cast<int64_t>(n_req - 1) * l_prefix);
        REQUIRE(st.n_prefix_query_tokens == n_query);
        REQUIRE(st.n_evictions == 0);
    }
}

TEST_CASE("A prefix that is not block-aligned only hits its full blocks", "[kv]") {
    const int bs = 16;
    KvManager m(64, bs);
    const Tokens prefix = iota_tokens(70, 100);  // 4 full blocks + 6 tokens
    for (int i = 0; i < 5; ++i) {
        auto s = serve(m, 1, concat({prefix, iota_tokens(3, 9000 + 10 * i)}));
        REQUIRE(s.n_hit == (i == 0 ? 0 : 64));
    }
    REQUIRE(m.stats().n_prefix_hit_tokens == 4 * 64);
}

TEST_CASE("A fully cached prompt still leaves its last block to compute", "[kv]") {
    const int bs = 4;
    KvManager m(16, bs);
    const Tokens prompt = iota_tokens(8, 1);  // exactly 2 blocks
    auto first = serve(m, 1, prompt);
    REQUIRE(m.pool().n_cached() == 2);
    auto second = serve(m, 1, prompt);
    REQUIRE(second.n_hit == 4);  // (8 - 1) / 4 = 1 block, never all 8
    REQUIRE(m.seq(second.id).n_cached_tokens == 4);
    // A 9-token prompt over the same 8 can hit both blocks.
    auto third = serve(m, 1, concat({prompt, {77}}));
    REQUIRE(third.n_hit == 8);
    // A 1-token prompt never hits.
    auto fourth = serve(m, 1, Tokens{1});
    REQUIRE(fourth.n_hit == 0);
    REQUIRE(m.seq(first.id).n_computed == 8);
}

TEST_CASE("Evictable cached prefixes are found again until the pool needs their blocks", "[kv]") {
    const int bs = 4;
    KvManager m(4, bs);
    const Tokens p = iota_tokens(9, 1);  // 2 full blocks + 1 token: 3 blocks
    auto s1 = serve(m, 1, p);
    m.free(s1.id);
    REQUIRE(m.pool().n_evictable() == 2);
    auto s2 = serve(m, 1, p);  // found again
    REQUIRE(s2.n_hit == 8);
    m.free(s2.id);
    // A 16-token prompt of other tokens needs all 4 blocks: both cached blocks get evicted.
    auto s3 = serve(m, 1, iota_tokens(16, 100));
    REQUIRE(s3.n_hit == 0);
    REQUIRE(m.stats().n_evictions == 2);
    m.free(s3.id);
    auto s4 = serve(m, 1, p);
    REQUIRE(s4.n_hit == 0);
}
