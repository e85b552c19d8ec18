// Prefix hashing: FNV-1a over a block's little-endian bytes, finalised by splitmix64, chained per block.
#include "kv/block_hash.h"

#include <algorithm>

namespace steward {

namespace {

constexpr uint64_t k_fnv_offset = 0xcbf29ce484222325ull;
constexpr uint64_t k_fnv_prime = 0x100000001b3ull;

// FNV-1a fed word by word, little-endian, so the hash does not depend on the host's byte order.
struct Fnv1a {
    uint64_t h = k_fnv_offset;
    void feed_byte(uint8_t b) { h = (h ^ b) * k_fnv_prime; }
    void feed_u32(uint32_t v) {
        for (int i = 0; i < 4; ++i) feed_byte(static_cast<uint8_t>(v >> (8 * i)));
    }
    void feed_u64(uint64_t v) {
        for (int i = 0; i < 8; ++i) feed_byte(static_cast<uint8_t>(v >> (8 * i)));
    }
};

}  // namespace

uint64_t fnv1a_64(std::span<const uint8_t> bytes) {
    Fnv1a f;
    for (uint8_t b : bytes) f.feed_byte(b);
    return f.h;
}

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t tenant_salt(int32_t tenant) {
    return splitmix64((1ull << 32) | static_cast<uint32_t>(tenant));
}

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens, uint64_t extra_key) {
    Fnv1a f;
    f.feed_u64(parent);
    f.feed_u64(extra_key);
    f.feed_u32(static_cast<uint32_t>(tokens.size()));
    for (int32_t t : tokens) f.feed_u32(static_cast<uint32_t>(t));
    return splitmix64(f.h);
}

int public_prefix_length(std::span<const int32_t> tokens, std::span<const std::vector<int32_t>> public_prefixes) {
    size_t best = 0;
    for (const auto& p : public_prefixes) {
        if (p.size() <= best || p.size() > tokens.size()) continue;
        if (std::equal(p.begin(), p.end(), tokens.begin())) best = p.size();
    }
    return static_cast<int>(best);
}

std::vector<BlockHash> hash_block_chain(std::span<const int32_t> tokens, int block_size, uint64_t salt,
                                        std::span<const std::vector<int32_t>> public_prefixes) {
    const int n_blocks = block_size > 0 ? static_cast<int>(tokens.size()) / block_size : 0;
    const int n_public_blocks = public_prefix_length(tokens, public_prefixes) / std::max(block_size, 1);
    std::vector<BlockHash> out;
    out.reserve(n_blocks);
    BlockHash parent = k_root_block_hash;
    for (int b = 0; b < n_blocks; ++b) {
        parent = hash_block(parent, tokens.subspan(static_cast<size_t>(b) * block_size, block_size),
                            b < n_public_blocks ? k_public_salt : salt);
        out.push_back(parent);
    }
    return out;
}

}  // namespace steward
