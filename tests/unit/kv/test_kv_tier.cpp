// Tests for runtime/kv/kv_tier: the host and disk tiers below a pool (round trips, restarts, the
// identity check, corrupted and planted files, the directory's checks, eviction policies) and a
// randomized run against a shadow model of what each tier holds.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_tier.h"

using namespace steward;
namespace fs = std::filesystem;

namespace {

// A directory of its own per test (prefix + pid + counter), removed with its contents at the end.
class TempDir {
public:
    TempDir() {
        static std::atomic<int> n{0};
        root_ =
            fs::temp_directory_path() / ("steward-kv-tier-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
        fs::remove_all(root_);
        fs::create_directories(root_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(root_, ec);
    }
    const fs::path& root() const { return root_; }
    std::string tier_dir() const { return (root_ / "tier").string(); }  // created by KvTiers::open

private:
    fs::path root_;
};

const KvTierIdentity k_id{0x1a1a1a1a00000001ull, 0x5a175a175a170001ull, 64};
constexpr int64_t k_file = (int64_t)k_tier_header_bytes + 64;  // one block file of k_id

// Bytes of a block: a pure function of (hash, identity), so a block served to the wrong hash or the
// wrong identity never has the expected bytes.
std::vector<uint8_t> block_bytes(BlockHash hash, const KvTierIdentity& id) {
    std::vector<uint8_t> b((size_t)id.payload_bytes);
    uint64_t x = hash ^ splitmix64(id.layout) ^ splitmix64(id.salts + 1) ^ (uint64_t)id.payload_bytes;
    for (size_t i = 0; i < b.size(); i += 8) {
        x = splitmix64(x);
        for (size_t j = 0; j < 8 && i + j < b.size(); j++) b[i + j] = (uint8_t)(x >> (8 * j));
    }
    return b;
}

// The hash of tenant's block number seq (public blocks: tenant -1, the public salt).
BlockHash hash_of(int32_t tenant, int32_t seq) {
    const std::vector<int32_t> tokens = {seq, seq * 7 + 1, seq * 13 + 2, 5};
    return hash_block(k_root_block_hash, tokens, tenant < 0 ? k_public_salt : tenant_salt(tenant));
}

TierBlockMeta meta_of(int32_t tenant, int32_t seq) {
    TierBlockMeta m;
    m.hash = hash_of(tenant, seq);
    m.tenant = tenant;
    m.is_public = tenant < 0;
    m.depth = seq % 5;
    m.n_hits = seq % 3;
    return m;
}

std::unique_ptr<KvTiers> open_tiers(int64_t host, int64_t disk, const std::string& dir,
                                    const KvTierIdentity& id = k_id) {
    auto t = KvTiers::open({host, disk, dir}, id);
    REQUIRE(t.ok());
    return std::move(*t);
}

void demote(KvTiers& t, const TierBlockMeta& m, EvictionPolicy* policy = nullptr,
            const EvictionContext* ctx = nullptr) {
    const auto b = block_bytes(m.hash, t.identity());
    t.demote(m, b, policy, ctx);
}

std::string file_of(const std::string& dir, BlockHash h, const KvTierIdentity& id = k_id) {
    return dir + "/" + tier_file_name(id.layout, h);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write((const char*)b.data(), (std::streamsize)b.size());
}

// Takes hash and checks the answer is exactly its block of t's identity.
std::optional<KvTier> take_checked(KvTiers& t, const TierBlockMeta& want) {
    std::vector<uint8_t> out((size_t)t.identity().payload_bytes, 0xee);
    KvTier from = KvTier::POOL;
    const auto got = t.take(want.hash, out, &from);
    if (!got) return std::nullopt;
    CHECK(got->hash == want.hash);
    CHECK(got->tenant == want.tenant);
    CHECK(got->is_public == want.is_public);
    CHECK(got->depth == want.depth);
    CHECK(out == block_bytes(want.hash, t.identity()));
    return from;
}

}  // namespace

TEST_CASE("kv tier header encodes and parses back, and each inconsistency is refused", "[kv_tier]") {
    TierFileHeader h;
    h.layout = k_id.layout, h.salts = k_id.salts;
    h.meta = meta_of(3, 9);
    h.payload_bytes = 64;
    h.payload_crc32 = 0xdeadbeef;
    const auto b = encode_tier_header(h);
    REQUIRE(b.size() == k_tier_header_bytes);
    CHECK(std::string(b.begin(), b.begin() + 8) == "STKVBLK1");
    CHECK(b[8] == 1);    // version, little-endian
    CHECK(b[12] == 96);  // header_bytes
    CHECK(b[16] == (k_id.layout & 0xff));
    auto p = parse_tier_header(b);
    REQUIRE(p.ok());
    CHECK(p->layout == h.layout);
    CHECK(p->salts == h.salts);
    CHECK(p->meta.hash == h.meta.hash);
    CHECK(p->meta.tenant == 3);
    CHECK(p->meta.depth == h.meta.depth);
    CHECK(p->meta.n_hits == h.meta.n_hits);
    CHECK(p->payload_bytes == 64);
    CHECK(p->payload_crc32 == 0xdeadbeef);

    CHECK_FALSE(parse_tier_header(std::span(b).first(95)).ok());
    for (size_t i = 0; i < b.size(); i++) {  // any flipped byte: the header CRC (or the CRC field itself) fails
        auto c = b;
        c[i] ^= 0x10;
        CHECK_FALSE(parse_tier_header(c).ok());
    }
    TierFileHeader neg = h;
    neg.payload_bytes = -1;
    CHECK_FALSE(parse_tier_header(encode_tier_header(neg)).ok());
    neg = h;
    neg.meta.depth = -3;
    CHECK_FALSE(parse_tier_header(encode_tier_header(neg)).ok());
    CHECK(tier_file_name(0x1f, 0xab) == "000000000000001f-00000000000000ab.kvb");
}

TEST_CASE("kv tier file check refuses other layouts, salts, sizes and payload CRCs", "[kv_tier]") {
    const auto payload = block_bytes(42, k_id);
    TierFileHeader h;
    h.layout = k_id.layout, h.salts = k_id.salts;
    h.meta.hash = 42;
    h.payload_bytes = 64;
    auto file = encode_tier_header(h);
    file.insert(file.end(), payload.begin(), payload.end());
    auto bad_crc = check_tier_file(file, k_id);
    REQUIRE_FALSE(bad_crc.ok());
    CHECK_THAT(bad_crc.error().message, Catch::Contains("payload CRC"));

    // With the right CRC (taken from the encoder's own file written by a tier).
    TempDir d;
    auto t = open_tiers(0, 10 * k_file, d.tier_dir());
    t->demote({42, 1, false, 0, 0}, payload);
    file = read_bytes(file_of(d.tier_dir(), 42));
    REQUIRE(check_tier_file(file, k_id).ok());
    KvTierIdentity other = k_id;
    other.layout ^= 1;
    CHECK_THAT(check_tier_file(file, other).error().message, Catch::Contains("layout"));
    other = k_id;
    other.salts ^= 1;
    CHECK_THAT(check_tier_file(file, other).error().message, Catch::Contains("salt"));
    other = k_id;
    other.payload_bytes = 65;
    CHECK_THAT(check_tier_file(file, other).error().message, Catch::Contains("payload_bytes"));
    auto longer = file;
    longer.push_back(0);
    CHECK_FALSE(check_tier_file(longer, k_id).ok());
    CHECK_FALSE(check_tier_file(std::span(file).first(file.size() - 1), k_id).ok());
}

TEST_CASE("A block demoted to the host tier comes back with its bytes and leaves the tier", "[kv_tier]") {
    auto t = open_tiers(4 * 64, 0, "");
    t->set_record_events(true);
    const auto m = meta_of(1, 1);
    demote(*t, m);
    CHECK(t->peek(m.hash) == KvTier::HOST);
    CHECK(t->stats().tier[(int)KvTier::HOST].bytes == 64);
    CHECK(take_checked(*t, m) == KvTier::HOST);
    CHECK_FALSE(t->peek(m.hash));  // exclusive: the pool holds it now
    std::vector<uint8_t> out(64);
    CHECK_FALSE(t->take(m.hash, out));
    const auto& s = t->stats().tier[(int)KvTier::HOST];
    CHECK(s.n_stores == 1);
    CHECK(s.n_lookups == 2);
    CHECK(s.n_hits == 1);
    CHECK(s.n_blocks == 0);
    CHECK(t->take_events() == std::vector<KvEvent>{{KvEventKind::STORED, m.hash, KvTier::HOST},
                                                   {KvEventKind::REMOVED, m.hash, KvTier::HOST}});
    CHECK(t->check_invariants() == "");
}

TEST_CASE("Host overflow goes to disk least recently used first and comes back from there", "[kv_tier]") {
    TempDir d;
    auto t = open_tiers(2 * 64, 10 * k_file, d.tier_dir());
    t->set_record_events(true);
    const auto a = meta_of(0, 1), b = meta_of(0, 2), c = meta_of(1, 3);
    demote(*t, a);
    demote(*t, b);
    demote(*t, a);  // refreshed: b is now the least recently used
    demote(*t, c);
    CHECK(t->peek(a.hash) == KvTier::HOST);
    CHECK(t->peek(b.hash) == KvTier::DISK);
    CHECK(t->peek(c.hash) == KvTier::HOST);
    CHECK(fs::exists(file_of(d.tier_dir(), b.hash)));
    CHECK((fs::status(file_of(d.tier_dir(), b.hash)).permissions() & fs::perms::all) ==
          (fs::perms::owner_read | fs::perms::owner_write));
    CHECK(t->take_events() == std::vector<KvEvent>{{KvEventKind::STORED, a.hash, KvTier::HOST},
                                                   {KvEventKind::STORED, b.hash, KvTier::HOST},
                                                   {KvEventKind::REMOVED, b.hash, KvTier::HOST},
                                                   {KvEventKind::STORED, b.hash, KvTier::DISK},
                                                   {KvEventKind::STORED, c.hash, KvTier::HOST}});
    CHECK(take_checked(*t, b) == KvTier::DISK);
    CHECK(t->peek(b.hash) == KvTier::DISK);  // inclusive: the file stays
    CHECK(take_checked(*t, b) == KvTier::DISK);
    CHECK(t->stats().n_disk_reads == 2);
    CHECK(t->stats().disk_read_bytes == 2 * k_file);
    CHECK(t->stats().n_disk_writes == 1);
    CHECK(t->stats().tier[(int)KvTier::DISK].n_hits == 2);
    // Demoted again while its file is there: the file is refreshed, the host tier does not take it.
    demote(*t, b);
    CHECK(t->peek(b.hash) == KvTier::DISK);
    CHECK(t->stats().n_disk_writes == 1);
    CHECK(t->check_invariants() == "");
}

TEST_CASE("A block bigger than a tier's whole budget skips that tier", "[kv_tier]") {
    TempDir d;
    auto t = open_tiers(63, 10 * k_file, d.tier_dir());
    const auto m = meta_of(2, 2);
    demote(*t, m);
    CHECK(t->peek(m.hash) == KvTier::DISK);
    auto none = open_tiers(0, k_file - 1, (d.root() / "small").string());
    demote(*none, m);
    CHECK_FALSE(none->peek(m.hash));
    CHECK(none->check_invariants() == "");
}

TEST_CASE("A restart with the same identity finds persisted blocks, another identity drops them", "[kv_tier]") {
    TempDir d;
    std::vector<TierBlockMeta> blocks;
    for (int i = 0; i < 5; i++) blocks.push_back(meta_of(i % 3 - 1, i));
    {
        auto t = open_tiers(8 * 64, 10 * k_file, d.tier_dir());
        demote(*t, blocks[0]);  // host only: lost at exit
        for (int i = 1; i < 5; i++) t->persist(blocks[i], block_bytes(blocks[i].hash, k_id));
        t->persist(blocks[1], block_bytes(blocks[1].hash, k_id));  // already there: skipped
        CHECK(t->stats().n_disk_writes == 4);
        CHECK(t->peek(blocks[0].hash) == KvTier::HOST);
    }
    {
        auto t = open_tiers(8 * 64, 10 * k_file, d.tier_dir());
        CHECK(t->stats().tier[(int)KvTier::DISK].n_blocks == 4);
        CHECK(t->held().size() == 4);
        CHECK_FALSE(t->peek(blocks[0].hash));
        for (int i = 1; i < 5; i++) CHECK(take_checked(*t, blocks[i]) == KvTier::DISK);
        CHECK(t->stats().n_dropped_files == 0);
    }
    for (int which = 0; which < 3; which++) {
        KvTierIdentity other = k_id;
        if (which == 0) other.layout ^= 0x100;
        if (which == 1) other.salts ^= 0x100;
        if (which == 2) other.payload_bytes = 32;
        {
            auto t = open_tiers(0, 10 * k_file, d.tier_dir());  // put k_id's files back
            for (int i = 1; i < 5; i++) t->persist(blocks[i], block_bytes(blocks[i].hash, k_id));
        }
        auto t = open_tiers(0, 10 * k_file, d.tier_dir(), other);
        CHECK(t->stats().n_dropped_files == 4);
        CHECK(t->held().empty());
        std::vector<uint8_t> out((size_t)other.payload_bytes);
        for (int i = 1; i < 5; i++) CHECK_FALSE(t->take(blocks[i].hash, out));
        CHECK(fs::is_empty(d.tier_dir()));
    }
}

TEST_CASE("Reopening orders the disk tier by file age and trims the oldest to the budget", "[kv_tier]") {
    TempDir d;
    std::vector<TierBlockMeta> blocks;
    for (int i = 0; i < 4; i++) blocks.push_back(meta_of(0, i));
    {
        auto t = open_tiers(0, 10 * k_file, d.tier_dir());
        for (const auto& m : blocks) demote(*t, m);
    }
    // Ages: block 2 oldest, then 0, 3, 1.
    const int age_rank[4] = {1, 3, 0, 2};
    for (int i = 0; i < 4; i++) {
        const timespec ts[2] = {{1000000 + age_rank[i] * 10, 0}, {1000000 + age_rank[i] * 10, 0}};
        REQUIRE(::utimensat(AT_FDCWD, file_of(d.tier_dir(), blocks[i].hash).c_str(), ts, 0) == 0);
    }
    auto t = open_tiers(0, 2 * k_file + 5, d.tier_dir());
    CHECK(t->stats().tier[(int)KvTier::DISK].n_removals == 2);
    CHECK_FALSE(t->peek(blocks[2].hash));
    CHECK_FALSE(t->peek(blocks[0].hash));
    CHECK(t->held() ==
          std::vector<std::pair<BlockHash, KvTier>>{{blocks[3].hash, KvTier::DISK}, {blocks[1].hash, KvTier::DISK}});
    CHECK_FALSE(fs::exists(file_of(d.tier_dir(), blocks[2].hash)));
    CHECK(t->check_invariants() == "");
}

TEST_CASE("A corrupted, truncated or misplaced block file is never served and is deleted", "[kv_tier]") {
    TempDir d;
    const auto m = meta_of(1, 7), other = meta_of(2, 8);
    auto t = open_tiers(0, 10 * k_file, d.tier_dir());
    demote(*t, m);
    demote(*t, other);
    const std::string path = file_of(d.tier_dir(), m.hash);
    const auto good = read_bytes(path);
    std::vector<uint8_t> out(64);
    auto broken = [&](const std::vector<uint8_t>& bytes) {
        write_bytes(path, bytes);
        const int64_t dropped = t->stats().n_dropped_files;
        CHECK_FALSE(t->take(m.hash, out));
        CHECK(t->stats().n_dropped_files == dropped + 1);
        CHECK_FALSE(fs::exists(path));
        CHECK_FALSE(t->peek(m.hash));
        CHECK(t->check_invariants() == "");
        demote(*t, m);  // back for the next case
        REQUIRE(read_bytes(path) == good);
    };
    SECTION("a payload byte flipped") {
        auto b = good;
        b[k_tier_header_bytes + 10] ^= 1;
        broken(b);
    }
    SECTION("truncated") {
        broken(std::vector<uint8_t>(good.begin(), good.end() - 1));
    }
    SECTION("a header with a wrong CRC") {
        auto b = good;
        b[92] ^= 0xff;
        broken(b);
    }
    SECTION("another block's valid file under this name") {
        broken(read_bytes(file_of(d.tier_dir(), other.hash)));
    }
    SECTION("the file removed behind the tier's back") {
        fs::remove(path);
        CHECK_FALSE(t->take(m.hash, out));
        CHECK(t->stats().n_dropped_files == 1);
        CHECK(t->check_invariants() == "");
    }
    CHECK(take_checked(*t, other) == KvTier::DISK);
}

TEST_CASE("Reopening drops bad block files, deletes stale temporaries and leaves foreign files", "[kv_tier]") {
    TempDir d;
    std::vector<TierBlockMeta> blocks;
    for (int i = 0; i < 4; i++) blocks.push_back(meta_of(3, i));
    {
        auto t = open_tiers(0, 10 * k_file, d.tier_dir());
        for (const auto& m : blocks) demote(*t, m);
    }
    const std::string dir = d.tier_dir();
    auto b1 = read_bytes(file_of(dir, blocks[1].hash));
    b1[20] ^= 1;  // header: dropped at open
    write_bytes(file_of(dir, blocks[1].hash), b1);
    auto b2 = read_bytes(file_of(dir, blocks[2].hash));
    b2.pop_back();  // truncated: dropped at open
    write_bytes(file_of(dir, blocks[2].hash), b2);
    auto b3 = read_bytes(file_of(dir, blocks[3].hash));
    b3.back() ^= 1;  // payload: found at open, dropped at take
    write_bytes(file_of(dir, blocks[3].hash), b3);
    const std::string tmp = file_of(dir, 77) + ".123-4.tmp";
    write_bytes(tmp, {1, 2, 3});
    write_bytes(dir + "/notes.txt", {'h', 'i'});
    write_bytes(dir + "/" + tier_file_name(k_id.layout, 5).substr(0, 20), {0});  // not our pattern either

    auto t = open_tiers(0, 10 * k_file, dir);
    CHECK(t->stats().n_dropped_files == 2);
    CHECK_FALSE(fs::exists(tmp));
    CHECK(fs::exists(dir + "/notes.txt"));
    CHECK(t->held().size() == 2);
    CHECK(take_checked(*t, blocks[0]) == KvTier::DISK);
    CHECK_FALSE(take_checked(*t, blocks[3]));
    CHECK(t->stats().n_dropped_files == 3);
    CHECK(t->check_invariants() == "");
}

TEST_CASE("A symlink planted at a block's name is replaced, never written through", "[kv_tier]") {
    TempDir d;
    auto t = open_tiers(0, 10 * k_file, d.tier_dir());
    const auto m = meta_of(0, 3);
    const std::string victim = (d.root() / "victim").string();
    write_bytes(victim, {'k', 'e', 'e', 'p'});
    const std::string path = file_of(d.tier_dir(), m.hash);
    fs::create_symlink(victim, path);
    demote(*t, m);
    CHECK(read_bytes(victim) == std::vector<uint8_t>{'k', 'e', 'e', 'p'});
    CHECK_FALSE(fs::is_symlink(path));
    CHECK(take_checked(*t, m) == KvTier::DISK);

    // A link planted after the write is not followed at read either: the block is dropped.
    fs::remove(path);
    fs::create_symlink(victim, path);
    std::vector<uint8_t> out(64);
    CHECK_FALSE(t->take(m.hash, out));
    CHECK(read_bytes(victim) == std::vector<uint8_t>{'k', 'e', 'e', 'p'});
    CHECK(t->stats().n_dropped_files == 1);
}

TEST_CASE("The disk directory must be private, real and owned, else open names the fix", "[kv_tier]") {
    TempDir d;
    const std::string dir = d.tier_dir();
    SECTION("created with mode 0700") {
        auto t = open_tiers(0, k_file, dir);
        CHECK((fs::status(dir).permissions() & fs::perms::all) == fs::perms::owner_all);
    }
    SECTION("group or other permissions") {
        fs::create_directory(dir);
        ::chmod(dir.c_str(), 0755);
        auto t = KvTiers::open({0, k_file, dir}, k_id);
        REQUIRE_FALSE(t.ok());
        CHECK_THAT(t.error().message, Catch::Contains("chmod 700 " + dir));
        CHECK_THAT(t.error().message, Catch::Contains("0755"));
    }
    SECTION("a symlink to a private directory") {
        const std::string real = (d.root() / "real").string();
        fs::create_directory(real);
        ::chmod(real.c_str(), 0700);
        fs::create_directory_symlink(real, dir);
        for (const std::string& p : {dir, dir + "/"}) {
            auto t = KvTiers::open({0, k_file, p}, k_id);
            REQUIRE_FALSE(t.ok());
            CHECK_THAT(t.error().message, Catch::Contains("symbolic link"));
        }
    }
    SECTION("a file") {
        write_bytes(dir, {1});
        auto t = KvTiers::open({0, k_file, dir}, k_id);
        REQUIRE_FALSE(t.ok());
        CHECK_THAT(t.error().message, Catch::Contains("not a directory"));
    }
    SECTION("a missing parent") {
        auto t = KvTiers::open({0, k_file, dir + "/a/b"}, k_id);
        REQUIRE_FALSE(t.ok());
        CHECK_THAT(t.error().message, Catch::Contains(dir + "/a"));
    }
    SECTION("no disk_dir or a negative budget") {
        CHECK_FALSE(KvTiers::open({0, k_file, ""}, k_id).ok());
        CHECK_FALSE(KvTiers::open({-1, 0, ""}, k_id).ok());
    }
}

namespace {

// Logs off for a test's duration (the warnings are expected; the counters are checked instead).
struct QuietLogs {
    spdlog::level::level_enum was = spdlog::get_level();
    QuietLogs() { spdlog::set_level(spdlog::level::off); }
    ~QuietLogs() { spdlog::set_level(was); }
};

// A policy that answers a valid index, an index out of range or no victim at random, and records what
// it saw (the candidates, least recently used first, and its answer).
class RandomPolicy : public EvictionPolicy {
public:
    struct Call {
        KvTier tier;
        std::vector<EvictionCandidate> cands;
        BlockHash victim;  // the hash it picked; LRU's when it answered out of range or no victim
    };
    explicit RandomPolicy(uint32_t seed) : rng_(seed) {}
    size_t choose_victim(const EvictionContext& ctx, std::span<const EvictionCandidate> cands) override {
        CHECK((ctx.tier == KvTier::HOST || ctx.tier == KvTier::DISK));
        CHECK(ctx.requesting_tenant == 7);  // the caller's context reaches the policy
        REQUIRE_FALSE(cands.empty());
        for (size_t i = 1; i < cands.size(); i++) CHECK(cands[i - 1].last_access_tick < cands[i].last_access_tick);
        CHECK(cands.back().last_access_tick <= ctx.now_tick);
        const int r = (int)(rng_() % 10);
        size_t pick = 0;
        if (r < 4)
            pick = rng_() % cands.size();
        else if (r < 6)
            pick = cands.size() + rng_() % 3;
        else if (r < 8)
            pick = k_no_victim;
        calls.push_back(
            {ctx.tier, {cands.begin(), cands.end()}, pick < cands.size() ? cands[pick].hash : cands[0].hash});
        return pick;
    }
    std::vector<Call> calls;

private:
    std::mt19937 rng_;
};

// What each tier should hold, worked out independently of the implementation: an LRU list per tier,
// the policy's recorded choices as victims, the files on disk (with the identity that wrote them and
// whether they were damaged), and the events the tiers must have reported.
struct Shadow {
    struct File {
        TierBlockMeta meta;
        KvTierIdentity id;
        int damage = 0;  // 0 none; 1 payload (found at open, refused at take); 2 header/size/name (dropped at open)
    };
    KvTierIdentity id = k_id;
    int64_t host_cap = 0, disk_cap = 0;  // in blocks (budgets are these times a block, plus slack)
    std::list<BlockHash> host_lru, disk_lru;
    std::map<BlockHash, TierBlockMeta> host;
    std::map<BlockHash, File> files;  // every block file in the directory (the disk tier's when it is on)
    int64_t n_dropped = 0;
    RandomPolicy* policy = nullptr;  // its calls are consumed in order
    size_t n_calls_used = 0;

    bool disk_on() const { return disk_cap > 0; }
    static void to_back(std::list<BlockHash>& l, BlockHash h) {
        l.remove(h);
        l.push_back(h);
    }
    BlockHash victim(KvTier tier, const std::list<BlockHash>& lru, bool with_policy) {
        if (!with_policy) return lru.front();
        REQUIRE(n_calls_used < policy->calls.size());
        const auto& call = policy->calls[n_calls_used++];
        CHECK(call.tier == tier);
        std::vector<BlockHash> seen;
        for (const auto& c : call.cands) seen.push_back(c.hash);
        CHECK(seen == std::vector<BlockHash>(lru.begin(), lru.end()));
        for (const auto& c : call.cands) {
            const TierBlockMeta& m = tier == KvTier::HOST ? host.at(c.hash) : files.at(c.hash).meta;
            CHECK(c.tenant == m.tenant);
            CHECK(c.is_public == m.is_public);
            CHECK(c.depth == m.depth);
            CHECK(c.block == -1);
        }
        return call.victim;
    }
    void store_disk(const TierBlockMeta& m, bool with_policy) {
        if (!disk_on()) return;
        if (files.count(m.hash)) return to_back(disk_lru, m.hash);
        while ((int64_t)disk_lru.size() + 1 > disk_cap) {
            const BlockHash v = victim(KvTier::DISK, disk_lru, with_policy);
            disk_lru.remove(v);
            files.erase(v);
        }
        disk_lru.push_back(m.hash);
        files[m.hash] = {m, id, 0};
    }
    void demote(const TierBlockMeta& m, bool with_policy) {
        if (host.count(m.hash)) {
            host[m.hash] = m;
            return to_back(host_lru, m.hash);
        }
        if (disk_on() && files.count(m.hash)) return to_back(disk_lru, m.hash);
        if (host_cap == 0) return store_disk(m, with_policy);
        while ((int64_t)host_lru.size() + 1 > host_cap) {
            const BlockHash v = victim(KvTier::HOST, host_lru, with_policy);
            const TierBlockMeta vm = host.at(v);
            host_lru.remove(v);
            host.erase(v);
            store_disk(vm, with_policy);
        }
        host_lru.push_back(m.hash);
        host[m.hash] = m;
    }
    void persist(const TierBlockMeta& m) {
        if (!disk_on() || files.count(m.hash)) return;
        if (host.count(m.hash)) {
            host_lru.remove(m.hash);
            host.erase(m.hash);
        }
        store_disk(m, false);
    }
    // The tier take() must answer from (nullopt: a miss), and the state after it.
    std::optional<KvTier> take(BlockHash h) {
        if (host.count(h)) {
            host_lru.remove(h);
            host.erase(h);
            return KvTier::HOST;
        }
        if (!disk_on() || !files.count(h)) return std::nullopt;
        if (files[h].damage) {
            disk_lru.remove(h);
            files.erase(h);
            n_dropped++;
            return std::nullopt;
        }
        to_back(disk_lru, h);
        return KvTier::DISK;
    }
    // A restart: the host tier is gone; with a disk tier, files of another identity or with a damaged
    // header are dropped. The order of the survivors is their age, which the caller reads back.
    void reopen(const KvTierIdentity& new_id, int64_t new_host_cap, int64_t new_disk_cap) {
        id = new_id;
        host_cap = new_host_cap;
        disk_cap = new_disk_cap;
        host.clear();
        host_lru.clear();
        disk_lru.clear();
        if (!disk_on()) return;
        for (auto it = files.begin(); it != files.end();) {
            const KvTierIdentity& f = it->second.id;
            const bool same = f.layout == id.layout && f.salts == id.salts && f.payload_bytes == id.payload_bytes;
            if (!same || it->second.damage == 2) {
                n_dropped++;
                it = files.erase(it);
            } else {
                ++it;
            }
        }
    }
    std::set<std::pair<BlockHash, KvTier>> held() const {
        std::set<std::pair<BlockHash, KvTier>> s;
        for (BlockHash h : host_lru) s.insert({h, KvTier::HOST});
        if (disk_on())
            for (BlockHash h : disk_lru) s.insert({h, KvTier::DISK});
        return s;
    }
};

}  // namespace

TEST_CASE("Randomized tiers agree with a shadow model and never serve a wrong block", "[kv_tier]") {
    QuietLogs quiet;  // a few hundred dropped files, each warned about
    TempDir d;
    const std::string dir = d.tier_dir();
    std::mt19937 rng(20240611);
    auto pick = [&](int n) { return (int)(rng() % (uint32_t)n); };
    // Identities: ours, another salt set, another layout, another block size.
    KvTierIdentity ids[4] = {k_id, k_id, k_id, k_id};
    ids[1].salts ^= 0x77;
    ids[2].layout ^= 0x77;
    ids[3].payload_bytes = 40;
    const int n_tenants = 4, n_seqs = 14;  // about 70 distinct blocks (public ones: tenant -1)
    RandomPolicy policy(99);
    EvictionContext ctx;
    ctx.requesting_tenant = 7;
    ctx.tier = KvTier::POOL;  // the tiers set it

    Shadow sh;
    sh.policy = &policy;
    auto budgets = [&](const KvTierIdentity& id, int64_t host_cap, int64_t disk_cap) {
        const int64_t file = (int64_t)k_tier_header_bytes + id.payload_bytes;
        // Slack below one more block: the budget is bytes, the shadow counts whole blocks.
        return KvTierOptions{host_cap ? host_cap * id.payload_bytes + id.payload_bytes - 1 : 0,
                             disk_cap ? disk_cap * file + file - 1 : 0, dir};
    };
    sh.host_cap = 5, sh.disk_cap = 12;
    auto t = open_tiers(budgets(k_id, 5, 12).host_bytes, budgets(k_id, 5, 12).disk_bytes, dir);
    t->set_record_events(true);
    std::set<std::pair<BlockHash, KvTier>> replica;  // what the events say the tiers hold

    int n_take_hits[3] = {0, 0, 0}, n_restarts = 0, n_other_identity = 0, n_corrupt = 0;
    const int n_ops = 4000;
    for (int op = 0; op < n_ops; op++) {
        INFO("op " << op);
        const int r = pick(100);
        const int32_t tenant = pick(n_tenants + 1) - 1;
        const TierBlockMeta m = meta_of(tenant, pick(n_seqs));
        if (r < 45) {  // a block leaves the pool
            const bool with_policy = pick(2) == 0;
            demote(*t, m, with_policy ? &policy : nullptr, with_policy ? &ctx : nullptr);
            sh.demote(m, with_policy);
        } else if (r < 75) {  // a lookup, maybe of a block no one ever stored
            const TierBlockMeta q = pick(10) == 0 ? meta_of(tenant, 1000 + pick(50)) : m;
            const auto want = sh.take(q.hash);
            const auto got = take_checked(*t, q);
            CHECK(got == want);
            if (got) n_take_hits[(int)*got]++;
        } else if (r < 83) {  // shutdown persistence of a pool block
            t->persist(m, block_bytes(m.hash, t->identity()));
            sh.persist(m);
        } else if (r < 92) {  // damage a block file (payload, header, size, or another block's file)
            if (sh.files.empty() || !sh.disk_on()) continue;
            auto it = sh.files.begin();
            std::advance(it, pick((int)sh.files.size()));
            if (it->second.damage == 2) continue;  // already refused at open; keep the size check below
            const std::string path = file_of(dir, it->first, it->second.id);
            auto b = read_bytes(path);
            REQUIRE(b.size() == k_tier_header_bytes + (size_t)it->second.id.payload_bytes);
            const int kind = pick(4);
            if (kind == 0) {
                b[k_tier_header_bytes + pick((int)it->second.id.payload_bytes)] ^= (uint8_t)(1 + pick(255));
            } else if (kind == 1) {
                b[pick((int)k_tier_header_bytes)] ^= (uint8_t)(1 + pick(255));
            } else if (kind == 2) {
                b.resize(pick((int)b.size()));
            } else {
                auto other = sh.files.begin();
                std::advance(other, pick((int)sh.files.size()));
                if (other == it) continue;
                b = read_bytes(file_of(dir, other->first, other->second.id));
            }
            write_bytes(path, b);
            it->second.damage = std::max(it->second.damage, kind == 0 ? 1 : 2);
            n_corrupt++;
        } else if (r < 95) {  // a restart, sometimes with another identity or without a tier
            const KvTierIdentity& id = pick(3) == 0 ? ids[pick(4)] : sh.id;
            const int64_t host_cap = pick(4) == 0 ? 0 : 5, disk_cap = pick(6) == 0 ? 0 : 12;
            const bool other =
                id.layout != sh.id.layout || id.salts != sh.id.salts || id.payload_bytes != sh.id.payload_bytes;
            n_other_identity += other;
            t.reset();
            const auto o = budgets(id, host_cap, disk_cap);
            t = open_tiers(o.host_bytes, o.disk_bytes, dir, id);
            t->set_record_events(true);
            sh.n_dropped = 0;  // the count is the instance's
            sh.reopen(id, host_cap, disk_cap);
            // The survivors' order is their files' age (same-tick writes tie): adopt it, check the set.
            for (const auto& [h, tier] : t->held()) {
                REQUIRE(tier == KvTier::DISK);
                sh.disk_lru.push_back(h);
            }
            replica.clear();
            for (const auto& e : t->held()) replica.insert(e);
            n_restarts++;
        } else {  // a lookup of a hash the tiers hold, to exercise hits
            const auto held = t->held();
            if (held.empty()) continue;
            const BlockHash h = held[pick((int)held.size())].first;
            const auto it = sh.host.count(h) ? sh.host.find(h) : sh.host.end();
            const TierBlockMeta want = it != sh.host.end() ? it->second : sh.files.at(h).meta;
            const auto expect = sh.take(h);
            const auto got = take_checked(*t, want);
            CHECK(got == expect);
            if (got) n_take_hits[(int)*got]++;
        }
        // After every operation: the structures, the budgets, the content and the events agree.
        REQUIRE(t->check_invariants() == "");
        const auto& s = t->stats();
        CHECK(s.tier[(int)KvTier::HOST].bytes <= t->options().host_bytes);
        CHECK(s.tier[(int)KvTier::DISK].bytes <= t->options().disk_bytes);
        CHECK(s.n_write_errors == 0);
        CHECK(s.n_dropped_files == sh.n_dropped);
        const auto held = t->held();
        REQUIRE(std::set<std::pair<BlockHash, KvTier>>(held.begin(), held.end()) == sh.held());
        for (const KvEvent& e : t->take_events()) {
            if (e.kind == KvEventKind::STORED)
                CHECK(replica.insert({e.hash, e.tier}).second);
            else
                CHECK(replica.erase({e.hash, e.tier}) == 1);
        }
        REQUIRE(replica == sh.held());
        REQUIRE(sh.n_calls_used == policy.calls.size());
        // Only blocks of the current identity are on disk under its layout's names.
        if (sh.disk_on())
            for (const auto& [h, f] : sh.files) CHECK(f.id.layout == sh.id.layout);
    }
    // The run exercised what it is meant to.
    CHECK(n_take_hits[(int)KvTier::HOST] > 50);
    CHECK(n_take_hits[(int)KvTier::DISK] > 50);
    CHECK(n_restarts > 50);
    CHECK(n_other_identity > 5);
    CHECK(n_corrupt > 50);
    CHECK(policy.calls.size() > 100);
}
