// KV tiers below a pool: a host-memory LRU of evicted blocks and a directory of checked block files
// (kv/kv_tier.h). The file format's encoder and parser live here too (the fuzz target reads them).
#include "kv/kv_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <list>
#include <tuple>

namespace steward {

const char* kv_tier_name(KvTier t) {
    switch (t) {
        case KvTier::POOL: return "pool";
        case KvTier::HOST: return "host";
        case KvTier::DISK: return "disk";
    }
    return "?";
}

// ---- file format

namespace {

constexpr char k_magic[8] = {'S', 'T', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t k_version = 1;
// Offsets in the header (kv_tier.h). Bytes 76..91 are reserved (zero: a reader refuses anything
// else, so one header has one encoding); the header CRC covers 0..91. Bytes 52..55 hold the reuse
// priority (0 or 1; zero in files written before it had a meaning).
constexpr size_t o_version = 8, o_header_bytes = 12, o_layout = 16, o_salts = 24, o_hash = 32, o_tenant = 40,
                 o_is_public = 44, o_depth = 48, o_reuse_priority = 52, o_n_hits = 56, o_payload_bytes = 64,
                 o_payload_crc = 72, o_reserved_b = 76, o_header_crc = 92;

void put_u32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
uint64_t get_u64(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

// zlib's crc32 takes a uInt length: big payloads go in chunks.
uint32_t crc32_of(std::span<const uint8_t> bytes) {
    uLong crc = crc32(0L, Z_NULL, 0);
    size_t off = 0;
    while (off < bytes.size()) {
        const size_t n = std::min<size_t>(bytes.size() - off, 1u << 30);
        crc = crc32(crc, bytes.data() + off, (uInt)n);
        off += n;
    }
    return (uint32_t)crc;
}

std::string hex64(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return buf;
}

}  // namespace

std::vector<uint8_t> encode_tier_header(const TierFileHeader& h) {
    std::vector<uint8_t> b(k_tier_header_bytes, 0);
    std::memcpy(b.data(), k_magic, sizeof k_magic);
    put_u32(&b[o_version], k_version);
    put_u32(&b[o_header_bytes], (uint32_t)k_tier_header_bytes);
    put_u64(&b[o_layout], h.layout);
    put_u64(&b[o_salts], h.salts);
    put_u64(&b[o_hash], h.meta.hash);
    put_u32(&b[o_tenant], (uint32_t)h.meta.tenant);
    put_u32(&b[o_is_public], h.meta.is_public ? 1u : 0u);
    put_u32(&b[o_depth], (uint32_t)h.meta.depth);
    put_u32(&b[o_reuse_priority], h.meta.reuse_priority > 0 ? 1u : 0u);
    put_u64(&b[o_n_hits], (uint64_t)h.meta.n_hits);
    put_u64(&b[o_payload_bytes], (uint64_t)h.payload_bytes);
    put_u32(&b[o_payload_crc], h.payload_crc32);
    put_u32(&b[o_header_crc], crc32_of(std::span(b).first(o_header_crc)));
    return b;
}

Expected<TierFileHeader> parse_tier_header(std::span<const uint8_t> bytes) {
    if (bytes.size() < k_tier_header_bytes)
        return make_error("kv tier file: ", bytes.size(), " bytes, shorter than its ", k_tier_header_bytes,
                          "-byte header (truncated)");
    const uint8_t* p = bytes.data();
    if (std::memcmp(p, k_magic, sizeof k_magic) != 0)
        return make_error("kv tier file: bad magic (not a KV block file)");
    if (const uint32_t v = get_u32(p + o_version); v != k_version)
        return make_error("kv tier file: version ", v, ", this build reads version ", k_version);
    if (const uint32_t n = get_u32(p + o_header_bytes); n != k_tier_header_bytes)
        return make_error("kv tier file: header_bytes ", n, ", expected ", k_tier_header_bytes);
    if (const uint32_t crc = crc32_of(bytes.first(o_header_crc)), want = get_u32(p + o_header_crc); crc != want)
        return make_error("kv tier file: header CRC-32 ", crc, " differs from the stored ", want, " (corrupted)");
    for (size_t i = 0; i < o_header_crc; i++) {
        const bool reserved = i >= o_reserved_b;
        if (reserved && p[i] != 0)
            return make_error("kv tier file: reserved header byte ", i, " is ", (int)p[i], ", expected 0");
    }
    TierFileHeader h;
    h.layout = get_u64(p + o_layout);
    h.salts = get_u64(p + o_salts);
    h.meta.hash = get_u64(p + o_hash);
    h.meta.tenant = (int32_t)get_u32(p + o_tenant);
    const uint32_t is_public = get_u32(p + o_is_public);
    if (is_public > 1) return make_error("kv tier file: is_public ", is_public, ", expected 0 or 1");
    h.meta.is_public = is_public == 1;
    h.meta.depth = (int32_t)get_u32(p + o_depth);
    if (h.meta.depth < 0) return make_error("kv tier file: negative depth ", h.meta.depth);
    const uint32_t priority = get_u32(p + o_reuse_priority);
    if (priority > 1) return make_error("kv tier file: reuse_priority ", priority, ", expected 0 or 1");
    h.meta.reuse_priority = (int32_t)priority;
    h.meta.n_hits = (int64_t)get_u64(p + o_n_hits);
    if (h.meta.n_hits < 0) return make_error("kv tier file: negative n_hits ", h.meta.n_hits);
    h.payload_bytes = (int64_t)get_u64(p + o_payload_bytes);
    // The bound keeps header + payload representable in every size type it meets.
    if (h.payload_bytes < 0 || h.payload_bytes > (int64_t(1) << 48))
        return make_error("kv tier file: payload_bytes ", h.payload_bytes, " out of range [0, 2^48]");
    h.payload_crc32 = get_u32(p + o_payload_crc);
    return h;
}

Expected<TierFileHeader> check_tier_file(std::span<const uint8_t> bytes, const KvTierIdentity& id) {
    auto h = parse_tier_header(bytes);
    if (!h) return h;
    if (h->layout != id.layout)
        return make_error("kv tier file: layout ", hex64(h->layout), " is not this pool's ", hex64(id.layout),
                          " (another model, block size or KV types)");
    if (h->salts != id.salts)
        return make_error("kv tier file: salt set ", hex64(h->salts), " is not this pool's ", hex64(id.salts));
    if (h->payload_bytes != id.payload_bytes)
        return make_error("kv tier file: payload_bytes ", h->payload_bytes, ", this pool's blocks hold ",
                          id.payload_bytes);
    if (bytes.size() - k_tier_header_bytes != (uint64_t)h->payload_bytes)
        return make_error("kv tier file: ", bytes.size(), " bytes, expected ", k_tier_header_bytes, " + ",
                          h->payload_bytes, " (truncated or extended)");
    if (const uint32_t crc = crc32_of(bytes.subspan(k_tier_header_bytes)); crc != h->payload_crc32)
        return make_error("kv tier file: payload CRC-32 ", crc, " differs from the stored ", h->payload_crc32,
                          " (corrupted)");
    return h;
}

std::string tier_file_name(uint64_t layout, BlockHash hash) {
    return hex64(layout) + "-" + hex64(hash) + ".kvb";
}

// ---- the tiers

namespace {

constexpr int H = (int)KvTier::HOST, D = (int)KvTier::DISK;
constexpr size_t k_name_len = 16 + 1 + 16 + 4;  // tier_file_name's length
constexpr const char* k_tmp_suffix = ".tmp";

bool is_lower_hex(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
// A block file's name: layout and hash out of it.
std::optional<std::pair<uint64_t, uint64_t>> parse_file_name(std::string_view n) {
    if (n.size() != k_name_len || n[16] != '-' || n.substr(33) != ".kvb") return std::nullopt;
    if (!is_lower_hex(n.substr(0, 16)) || !is_lower_hex(n.substr(17, 16))) return std::nullopt;
    return std::pair{std::stoull(std::string(n.substr(0, 16)), nullptr, 16),
                     std::stoull(std::string(n.substr(17, 16)), nullptr, 16)};
}
// A temporary of ours: a block file's name, '.', digits (the writer's pid and a counter), ".tmp".
bool is_temp_name(std::string_view n) {
    return n.size() > k_name_len + 1 + 4 && parse_file_name(n.substr(0, k_name_len)) && n[k_name_len] == '.' &&
           n.ends_with(k_tmp_suffix);
}

std::string errno_text(int e) {
    return std::strerror(e);
}

// Whole-buffer write and positional read, retrying short transfers and EINTR. false with errno set.
bool write_all(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w, n -= (size_t)w;
    }
    return true;
}
bool read_all(int fd, uint8_t* p, size_t n) {
    size_t off = 0;
    while (off < n) {
        const ssize_t r = ::pread(fd, p + off, n - off, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        if (r == 0) {
            errno = EIO;  // the file shrank under us
            return false;
        }
        off += (size_t)r;
    }
    return true;
}

}  // namespace

struct KvTiers::Impl {
    struct HostBlock {
        TierBlockMeta meta;
        std::vector<uint8_t> bytes;  // [payload_bytes]
        int64_t tick = 0;
        std::list<BlockHash>::iterator lru;
    };
    struct DiskBlock {
        TierBlockMeta meta;
        int64_t file_bytes = 0;  // header + payload
        int64_t tick = 0;
        std::list<BlockHash>::iterator lru;
    };

    KvTierOptions opt;
    KvTierIdentity id;
    int dir_fd = -1;  // the checked disk_dir: every file operation is relative to it (no path re-walk)
    std::unordered_map<BlockHash, HostBlock> host;
    std::unordered_map<BlockHash, DiskBlock> disk;
    std::list<BlockHash> host_lru, disk_lru;  // least recently used first
    int64_t tick = 0;
    int64_t n_temp = 0;  // temporary-file counter
    KvTierStats stats;
    bool record_events = false;
    std::vector<KvEvent> events;

    ~Impl() {
        if (dir_fd >= 0) ::close(dir_fd);
    }

    bool has_host() const { return opt.host_bytes > 0; }
    bool has_disk() const { return opt.disk_bytes > 0; }
    int64_t file_bytes() const { return (int64_t)k_tier_header_bytes + id.payload_bytes; }
    std::string path_of(const std::string& name) const { return opt.disk_dir + "/" + name; }

    void event(KvEventKind kind, BlockHash hash, KvTier tier) {
        if (record_events) events.push_back({kind, hash, tier});
    }

    // The victim of a tier's LRU list: the policy's pick among its blocks, least recently used first;
    // without a policy the least recently used block without reuse priority (the first with it when
    // every block has it: a walk past the priority blocks at the head); LRU when the policy declines
    // or answers out of range (a tier must always make room, unlike the pool, whose caller can wait:
    // here the block being demoted has nowhere else to go).
    template <typename Map>
    BlockHash choose_victim(const Map& map, const std::list<BlockHash>& lru, KvTier tier, EvictionPolicy* policy,
                            const EvictionContext* ctx) {
        if (!policy) {
            for (BlockHash h : lru)
                if (map.at(h).meta.reuse_priority == 0) return h;
            return lru.front();
        }
        std::vector<EvictionCandidate> cands;
        cands.reserve(lru.size());
        for (BlockHash h : lru) {
            const auto& b = map.at(h);
            cands.push_back({-1, h, b.meta.tenant, b.meta.is_public, b.tick, b.meta.n_hits, b.meta.depth, b.meta.reuse_priority});
        }
        // The pool's context (tenants, quotas, names) with the tier's clock: the candidates' ticks are
        // the tier's.
        EvictionContext c = ctx ? *ctx : EvictionContext{};
        c.tier = tier;
        c.now_tick = tick;
        const size_t i = policy->choose_victim(c, cands);
        return i < cands.size() ? cands[i].hash : lru.front();
    }

    HostBlock erase_host(BlockHash h) {
        auto it = host.find(h);
        stats.tier[H].bytes -= (int64_t)it->second.bytes.size();
        stats.tier[H].n_blocks--;
        host_lru.erase(it->second.lru);
        HostBlock b = std::move(it->second);
        host.erase(it);
        return b;
    }
    void erase_disk(BlockHash h) {
        auto it = disk.find(h);
        stats.tier[D].bytes -= it->second.file_bytes;
        stats.tier[D].n_blocks--;
        disk_lru.erase(it->second.lru);
        disk.erase(it);
    }
    void unlink_file(BlockHash h) {
        const std::string name = tier_file_name(id.layout, h);
        if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT)
            spdlog::warn("kv tier: cannot delete {}: {}", path_of(name), errno_text(errno));
    }
    // A block file that failed at read: deleted, never served.
    void drop_disk(BlockHash h, const std::string& why) {
        const std::string name = tier_file_name(id.layout, h);
        spdlog::warn("kv tier: dropping {}: {}", path_of(name), why);
        unlink_file(h);
        erase_disk(h);
        stats.n_dropped_files++;
        event(KvEventKind::REMOVED, h, KvTier::DISK);
    }

    static bool holds_key(const TierBlockMeta& m, std::span<const uint64_t> keys) {
        if (!m.reuse_keys) return false;
        for (uint64_t k : *m.reuse_keys)
            if (std::find(keys.begin(), keys.end(), k) != keys.end()) return true;
        return false;
    }

    void touch(std::list<BlockHash>& lru, std::list<BlockHash>::iterator& it, int64_t& t) {
        lru.splice(lru.end(), lru, it);
        t = ++tick;
    }

    void store_host(const TierBlockMeta& meta, std::span<const uint8_t> payload, EvictionPolicy* policy,
                    const EvictionContext* ctx) {
        while (stats.tier[H].bytes + (int64_t)payload.size() > opt.host_bytes) {
            const BlockHash v = choose_victim(host, host_lru, KvTier::HOST, policy, ctx);
            const HostBlock victim = erase_host(v);
            stats.tier[H].n_removals++;
            event(KvEventKind::REMOVED, v, KvTier::HOST);
            if (has_disk()) store_disk(victim.meta, victim.bytes, policy, ctx);
        }
        HostBlock& b = host[meta.hash];
        b.meta = meta;
        b.bytes.assign(payload.begin(), payload.end());
        b.tick = ++tick;
        b.lru = host_lru.insert(host_lru.end(), meta.hash);
        stats.tier[H].bytes += (int64_t)payload.size();
        stats.tier[H].n_blocks++;
        stats.tier[H].n_stores++;
        event(KvEventKind::STORED, meta.hash, KvTier::HOST);
    }

    void store_disk(const TierBlockMeta& meta, std::span<const uint8_t> payload, EvictionPolicy* policy,
                    const EvictionContext* ctx) {
        if (!has_disk() || file_bytes() > opt.disk_bytes) return;
        if (auto it = disk.find(meta.hash); it != disk.end()) {  // inclusive: the file is already there
            touch(disk_lru, it->second.lru, it->second.tick);
            return;
        }
        while (stats.tier[D].bytes + file_bytes() > opt.disk_bytes) {
            const BlockHash v = choose_victim(disk, disk_lru, KvTier::DISK, policy, ctx);
            unlink_file(v);
            erase_disk(v);
            stats.tier[D].n_removals++;
            event(KvEventKind::REMOVED, v, KvTier::DISK);
        }
        if (!write_file(meta, payload)) return;
        DiskBlock& b = disk[meta.hash];
        b.meta = meta;
        b.file_bytes = file_bytes();
        b.tick = ++tick;
        b.lru = disk_lru.insert(disk_lru.end(), meta.hash);
        stats.tier[D].bytes += b.file_bytes;
        stats.tier[D].n_blocks++;
        stats.tier[D].n_stores++;
        stats.n_disk_writes++;
        stats.disk_write_bytes += b.file_bytes;
        event(KvEventKind::STORED, meta.hash, KvTier::DISK);
    }

    // Writes a block's file: a fresh temporary (O_EXCL | O_NOFOLLOW: nothing planted in the directory
    // is followed or reused), then rename() over the final name, which replaces a link planted there
    // rather than writing through it. No fsync: a file torn by a crash fails its size or CRC check and
    // is dropped, so durability would only buy blocks back, at a sync per eviction.
    bool write_file(const TierBlockMeta& meta, std::span<const uint8_t> payload) {
        TierFileHeader h;
        h.layout = id.layout;
        h.salts = id.salts;
        h.meta = meta;
        h.payload_bytes = (int64_t)payload.size();
        h.payload_crc32 = crc32_of(payload);
        const std::vector<uint8_t> head = encode_tier_header(h);
        const std::string name = tier_file_name(id.layout, meta.hash);
        const std::string tmp = name + "." + std::to_string(::getpid()) + "-" + std::to_string(++n_temp) + k_tmp_suffix;
        const int fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) return write_failed(tmp, "create", errno, false);
        const bool ok = write_all(fd, head.data(), head.size()) && write_all(fd, payload.data(), payload.size());
        const int e = errno;
        if (::close(fd) != 0 && ok) return write_failed(tmp, "close", errno, true);
        if (!ok) return write_failed(tmp, "write", e, true);
        if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) return write_failed(tmp, "rename", errno, true);
        return true;
    }
    bool write_failed(const std::string& tmp, const char* what, int e, bool created) {
        if (created) ::unlinkat(dir_fd, tmp.c_str(), 0);
        // A full disk fails every write: the first and then every 1024th is enough to see it.
        if (stats.n_write_errors++ % 1024 == 0)
            spdlog::warn("kv tier: {} of {} failed: {} (the block is dropped; {} write errors so far)", what,
                         path_of(tmp), errno_text(e), stats.n_write_errors);
        return false;
    }

    // The whole file of a disk block, checked; nullopt (and the file dropped) when it fails.
    std::optional<TierFileHeader> read_disk(BlockHash hash, std::span<uint8_t> out) {
        const std::string name = tier_file_name(id.layout, hash);
        // O_NONBLOCK: a FIFO planted under the name fails the regular-file check instead of blocking.
        const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
            drop_disk(hash, "cannot open: " + errno_text(errno));
            return std::nullopt;
        }
        struct stat st {};
        std::vector<uint8_t> bytes;
        std::string err;
        if (::fstat(fd, &st) != 0) {
            err = "cannot stat: " + errno_text(errno);
        } else if (!S_ISREG(st.st_mode)) {
            err = "not a regular file";
        } else if (st.st_size != file_bytes()) {
            err = std::to_string(st.st_size) + " bytes, expected " + std::to_string(file_bytes()) +
                  " (truncated or extended)";
        } else {
            bytes.resize((size_t)st.st_size);
            if (!read_all(fd, bytes.data(), bytes.size())) err = "cannot read: " + errno_text(errno);
        }
        ::close(fd);
        if (err.empty()) {
            stats.n_disk_reads++;
            stats.disk_read_bytes += (int64_t)bytes.size();
            auto h = check_tier_file(bytes, id);
            if (!h) {
                err = h.error().message;
            } else if (h->meta.hash != hash) {
                err = "holds block " + hex64(h->meta.hash) + ", not " + hex64(hash);
            } else {
                std::copy(bytes.begin() + k_tier_header_bytes, bytes.end(), out.begin());
                return *h;
            }
        }
        drop_disk(hash, err);
        return std::nullopt;
    }

    Expected<bool> open_dir();
    void index_files();
};

// The directory: created (0700) or checked, then held open so every later operation is relative to it.
Expected<bool> KvTiers::Impl::open_dir() {
    const std::string& dir = opt.disk_dir;
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        const int e = errno;
        const auto slash = dir.find_last_of('/');
        const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
        if (e == ENOENT)
            return make_error("kv tier disk_dir ", dir, ": its parent directory ", parent,
                              " does not exist: create it (mkdir -p ", parent, ") or choose another disk_dir");
        return make_error("kv tier disk_dir ", dir, ": cannot create it: ", errno_text(e),
                          ": check the permissions of ", parent, " or choose another disk_dir");
    }
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0)
        return make_error("kv tier disk_dir ", dir, ": cannot stat it: ", errno_text(errno));
    if (S_ISLNK(st.st_mode))
        return make_error("kv tier disk_dir ", dir,
                          ": is a symbolic link (KV blocks hold prompts: the tier "
                          "only uses a real directory it owns): give the link's target or another path");
    if (!S_ISDIR(st.st_mode))
        return make_error("kv tier disk_dir ", dir,
                          ": exists and is not a directory: remove it or choose another path");
    if (st.st_uid != ::geteuid())
        return make_error("kv tier disk_dir ", dir, ": owned by uid ", (int64_t)st.st_uid, ", not this user (uid ",
                          (int64_t)::geteuid(), "): chown ", (int64_t)::geteuid(), " ", dir,
                          " or choose a directory of your own");
    if ((st.st_mode & 077) != 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", (unsigned)(st.st_mode & 07777));
        return make_error("kv tier disk_dir ", dir, ": mode ", mode,
                          " lets group or others read it (KV blocks hold prompts): chmod 700 ", dir);
    }
    dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir_fd < 0) return make_error("kv tier disk_dir ", dir, ": cannot open it: ", errno_text(errno));
    struct stat fst {};
    // The directory checked above is the one opened (not swapped in between).
    if (::fstat(dir_fd, &fst) != 0 || fst.st_dev != st.st_dev || fst.st_ino != st.st_ino)
        return make_error("kv tier disk_dir ", dir, ": changed while being opened: try again");
    return true;
}

// The index from the files: ours kept (oldest mtime first in the LRU list), the rest dropped or left.
void KvTiers::Impl::index_files() {
    const int fd = ::dup(dir_fd);
    DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
    if (!d) {
        if (fd >= 0) ::close(fd);
        spdlog::warn("kv tier: cannot list {}: {} (the disk tier starts empty)", opt.disk_dir, errno_text(errno));
        return;
    }
    struct Found {
        struct timespec mtime;
        std::string name;
        TierFileHeader h;
    };
    std::vector<Found> found;
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
    int64_t n_foreign = 0;
    std::string first_foreign;
    for (const std::string& name : names) {
        if (name == "." || name == "..") continue;
        if (is_temp_name(name)) {  // a write cut short by a crash
            ::unlinkat(dir_fd, name.c_str(), 0);
            continue;
        }
        const auto parsed = parse_file_name(name);
        if (!parsed) {
            if (n_foreign++ == 0) first_foreign = name;
            continue;
        }
        auto drop = [&](const std::string& why) {
            spdlog::warn("kv tier: dropping {}: {}", path_of(name), why);
            ::unlinkat(dir_fd, name.c_str(), 0);
            stats.n_dropped_files++;
        };
        const int f = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (f < 0) {
            drop("cannot open: " + errno_text(errno));
            continue;
        }
        struct stat st {};
        uint8_t head[k_tier_header_bytes];
        std::string err;
        Expected<TierFileHeader> h = Error{};
        if (::fstat(f, &st) != 0) {
            err = "cannot stat: " + errno_text(errno);
        } else if (!S_ISREG(st.st_mode)) {
            err = "not a regular file";
        } else if (st.st_size < (off_t)k_tier_header_bytes) {
            err = std::to_string(st.st_size) + " bytes, shorter than the header (truncated)";
        } else if (!read_all(f, head, sizeof head)) {
            err = "cannot read: " + errno_text(errno);
        } else {
            h = parse_tier_header(head);
        }
        ::close(f);
        if (err.empty()) {
            if (!h)
                err = h.error().message;
            else if (h->layout != id.layout)
                err = "layout " + hex64(h->layout) + " is not this pool's " + hex64(id.layout);
            else if (h->salts != id.salts)
                err = "salt set " + hex64(h->salts) + " is not this pool's " + hex64(id.salts) +
                      " (the tenant salts changed)";
            else if (h->payload_bytes != id.payload_bytes)
                err = "payload_bytes " + std::to_string(h->payload_bytes) + ", this pool's blocks hold " +
                      std::to_string(id.payload_bytes);
            else if (st.st_size != file_bytes())
                err = std::to_string(st.st_size) + " bytes, expected " + std::to_string(file_bytes());
            else if (parsed->first != h->layout || parsed->second != h->meta.hash)
                err = "its name does not match the block it holds (" + tier_file_name(h->layout, h->meta.hash) + ")";
        }
        if (!err.empty()) {
            drop(err);
            continue;
        }
        found.push_back({st.st_mtim, name, *h});
    }
    if (n_foreign > 0)
        spdlog::warn("kv tier: {} holds {} file(s) that are not KV blocks (first: {}); left alone", opt.disk_dir,
                     n_foreign, first_foreign);
    std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
        return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.name) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.name);
    });
    for (const Found& f : found) {
        DiskBlock& b = disk[f.h.meta.hash];
        b.meta = f.h.meta;
        b.file_bytes = file_bytes();
        b.tick = ++tick;
        b.lru = disk_lru.insert(disk_lru.end(), f.h.meta.hash);
        stats.tier[D].bytes += b.file_bytes;
        stats.tier[D].n_blocks++;
    }
    while (stats.tier[D].bytes > opt.disk_bytes) {  // a smaller budget than last time: oldest first
        const BlockHash v = disk_lru.front();
        unlink_file(v);
        erase_disk(v);
        stats.tier[D].n_removals++;
    }
}

Expected<std::unique_ptr<KvTiers>> KvTiers::open(const KvTierOptions& opt, const KvTierIdentity& id) {
    if (opt.host_bytes < 0 || opt.disk_bytes < 0)
        return make_error("kv tiers: host_bytes ", opt.host_bytes, " and disk_bytes ", opt.disk_bytes,
                          " must be >= 0 (0: no such tier)");
    if (id.payload_bytes <= 0)
        return make_error("kv tiers: payload_bytes ", id.payload_bytes, " must be > 0 (the bytes of one block)");
    auto impl = std::make_unique<Impl>();
    impl->opt = opt;
    impl->id = id;
    if (impl->has_disk()) {
        if (opt.disk_dir.empty())
            return make_error("kv tiers: disk_bytes ", opt.disk_bytes, " needs a disk_dir: set it or set disk_bytes 0");
        // A trailing '/' would make lstat follow a link: "dir/" names the same directory as "dir".
        while (impl->opt.disk_dir.size() > 1 && impl->opt.disk_dir.back() == '/') impl->opt.disk_dir.pop_back();
        if (auto ok = impl->open_dir(); !ok) return ok.error();
        impl->index_files();
    }
    return std::unique_ptr<KvTiers>(new KvTiers(std::move(impl)));
}

KvTiers::KvTiers(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvTiers::~KvTiers() = default;

const KvTierIdentity& KvTiers::identity() const {
    return impl_->id;
}
const KvTierOptions& KvTiers::options() const {
    return impl_->opt;
}

void KvTiers::demote(const TierBlockMeta& meta, std::span<const uint8_t> payload, EvictionPolicy* policy,
                     const EvictionContext* ctx) {
    Impl& m = *impl_;
    STEWARD_KV_CHECK((int64_t)payload.size() == m.id.payload_bytes, "demote: payload is not one block's bytes");
    if (auto it = m.host.find(meta.hash); it != m.host.end()) {
        it->second.meta = meta;  // the pool may have counted hits since
        m.touch(m.host_lru, it->second.lru, it->second.tick);
        return;
    }
    // Already on disk: refreshing the file's recency is enough (a hash lives in one tier of the two).
    if (auto it = m.disk.find(meta.hash); it != m.disk.end()) {
        m.touch(m.disk_lru, it->second.lru, it->second.tick);
        return;
    }
    if (m.has_host() && m.id.payload_bytes <= m.opt.host_bytes)
        m.store_host(meta, payload, policy, ctx);
    else
        m.store_disk(meta, payload, policy, ctx);
}

void KvTiers::persist(const TierBlockMeta& meta, std::span<const uint8_t> payload) {
    Impl& m = *impl_;
    STEWARD_KV_CHECK((int64_t)payload.size() == m.id.payload_bytes, "persist: payload is not one block's bytes");
    if (!m.has_disk() || m.disk.count(meta.hash)) return;
    if (m.host.count(meta.hash)) {  // not expected (the host tier is exclusive of the pool): keep one copy
        m.erase_host(meta.hash);
        m.stats.tier[H].n_removals++;
        m.event(KvEventKind::REMOVED, meta.hash, KvTier::HOST);
    }
    m.store_disk(meta, payload, nullptr, nullptr);
}

std::optional<KvTier> KvTiers::peek(BlockHash hash) const {
    if (impl_->host.count(hash)) return KvTier::HOST;
    if (impl_->disk.count(hash)) return KvTier::DISK;
    return std::nullopt;
}

std::optional<TierBlockMeta> KvTiers::take(BlockHash hash, std::span<uint8_t> out, KvTier* from) {
    Impl& m = *impl_;
    STEWARD_KV_CHECK((int64_t)out.size() == m.id.payload_bytes, "take: out is not one block's bytes");
    if (m.has_host()) {
        m.stats.tier[H].n_lookups++;
        if (auto it = m.host.find(hash); it != m.host.end()) {
            std::copy(it->second.bytes.begin(), it->second.bytes.end(), out.begin());
            const TierBlockMeta meta = it->second.meta;
            m.erase_host(hash);
            m.stats.tier[H].n_hits++;
            m.event(KvEventKind::REMOVED, hash, KvTier::HOST);
            if (from) *from = KvTier::HOST;
            return meta;
        }
    }
    if (!m.has_disk()) return std::nullopt;
    m.stats.tier[D].n_lookups++;
    auto it = m.disk.find(hash);
    if (it == m.disk.end()) return std::nullopt;
    auto h = m.read_disk(hash, out);
    if (!h) return std::nullopt;
    it = m.disk.find(hash);
    m.touch(m.disk_lru, it->second.lru, it->second.tick);
    m.stats.tier[D].n_hits++;
    if (from) *from = KvTier::DISK;
    return h->meta;
}

int KvTiers::invalidate_reuse(std::span<const uint64_t> keys) {
    Impl& m = *impl_;
    if (keys.empty()) return 0;
    std::vector<BlockHash> host_drop, disk_drop;
    for (const auto& [h, b] : m.host)
        if (Impl::holds_key(b.meta, keys)) host_drop.push_back(h);
    for (const auto& [h, b] : m.disk)
        if (Impl::holds_key(b.meta, keys)) disk_drop.push_back(h);
    for (BlockHash h : host_drop) {
        m.erase_host(h);
        m.event(KvEventKind::REMOVED, h, KvTier::HOST);
    }
    for (BlockHash h : disk_drop) {
        m.unlink_file(h);
        m.erase_disk(h);
        m.event(KvEventKind::REMOVED, h, KvTier::DISK);
    }
    const int n = (int)(host_drop.size() + disk_drop.size());
    m.stats.n_invalidated += n;
    return n;
}

void KvTiers::set_record_events(bool on) {
    impl_->record_events = on;
}
std::vector<KvEvent> KvTiers::take_events() {
    return std::exchange(impl_->events, {});
}

std::vector<std::pair<BlockHash, KvTier>> KvTiers::held() const {
    std::vector<std::pair<BlockHash, KvTier>> v;
    v.reserve(impl_->host.size() + impl_->disk.size());
    for (BlockHash h : impl_->host_lru) v.emplace_back(h, KvTier::HOST);
    for (BlockHash h : impl_->disk_lru) v.emplace_back(h, KvTier::DISK);
    return v;
}

const KvTierStats& KvTiers::stats() const {
    return impl_->stats;
}

std::string KvTiers::check_invariants() const {
    const Impl& m = *impl_;
    auto walk = [&](const auto& map, const std::list<BlockHash>& lru, int t, int64_t budget,
                    auto block_bytes) -> std::string {
        const std::string tier = kv_tier_name((KvTier)t);
        if (lru.size() != map.size())
            return tier + ": LRU list has " + std::to_string(lru.size()) + " entries, index " +
                   std::to_string(map.size());
        int64_t sum = 0, prev_tick = 0;
        for (auto li = lru.begin(); li != lru.end(); ++li) {
            auto it = map.find(*li);
            if (it == map.end()) return tier + ": LRU entry " + hex64(*li) + " not in the index";
            if (it->second.lru != li) return tier + ": block " + hex64(*li) + "'s LRU link points elsewhere";
            if (it->second.meta.hash != *li) return tier + ": block " + hex64(*li) + " holds meta of another hash";
            if (it->second.tick <= prev_tick) return tier + ": LRU ticks not increasing at " + hex64(*li);
            if (it->second.tick > m.tick) return tier + ": block " + hex64(*li) + " ticks past the clock";
            prev_tick = it->second.tick;
            const int64_t b = block_bytes(it->second);
            if (b != (t == H ? m.id.payload_bytes : m.file_bytes()))
                return tier + ": block " + hex64(*li) + " holds " + std::to_string(b) + " bytes";
            sum += b;
        }
        if (sum != m.stats.tier[t].bytes)
            return tier + ": bytes " + std::to_string(m.stats.tier[t].bytes) + " != sum " + std::to_string(sum);
        if (m.stats.tier[t].n_blocks != (int64_t)map.size())
            return tier + ": n_blocks " + std::to_string(m.stats.tier[t].n_blocks) +
                   " != " + std::to_string(map.size());
        if (sum > budget) return tier + ": " + std::to_string(sum) + " bytes over the budget " + std::to_string(budget);
        return "";
    };
    if (auto e = walk(m.host, m.host_lru, H, m.opt.host_bytes,
                      [](const Impl::HostBlock& b) { return (int64_t)b.bytes.size(); });
        !e.empty())
        return e;
    if (auto e = walk(m.disk, m.disk_lru, D, m.opt.disk_bytes, [](const Impl::DiskBlock& b) { return b.file_bytes; });
        !e.empty())
        return e;
    for (const auto& [h, b] : m.host)
        if (m.disk.count(h)) return "block " + hex64(h) + " is in both the host and the disk tier";
    if (!m.disk.empty() && m.dir_fd < 0) return "disk blocks without a directory";
    return "";
}

}  // namespace steward
