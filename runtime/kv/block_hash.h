// Prefix hashing: a full KV block's identity is a chained 64-bit hash of (parent hash, its token ids,
// extra key = tenant salt), so equal prefixes of one tenant share blocks and no two tenants ever do,
// except for blocks lying inside a declared-public prefix, which are hashed with salt 0.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace steward {

using BlockHash = uint64_t;

// Salt of blocks inside a declared-public prefix: shared by every tenant. tenant_salt() never returns it.
constexpr uint64_t k_public_salt = 0;

// Parent hash of a sequence's first block (any fixed value works; this one reads "Steward\0").
constexpr BlockHash k_root_block_hash = 0x5374657761726400ull;

// 64-bit FNV-1a over bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3). Pure, thread-safe.
uint64_t fnv1a_64(std::span<const uint8_t> bytes);

// The splitmix64 output function: x += golden ratio, then two xor-shift-multiply rounds. A bijection on
// uint64, used as the finaliser that spreads FNV-1a's weak last-byte avalanche over all 64 bits.
uint64_t splitmix64(uint64_t x);

// The salt of a tenant: splitmix64 of (2^32 | tenant as uint32). Distinct tenants get distinct salts
// (splitmix64 is a bijection) and none gets k_public_salt (checked in test_prefix_caching).
uint64_t tenant_salt(int32_t tenant);

// Hash of one full block: splitmix64(fnv1a_64(bytes)) where bytes are, little-endian,
// parent (8 bytes), extra_key (8), tokens.size() (4), then each token id (4 each). Pure.
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens, uint64_t extra_key);

// Length of the longest public prefix that `tokens` starts with (the whole prefix must be present);
// 0 when none. Cost O(sum of prefix lengths).
int public_prefix_length(std::span<const int32_t> tokens, std::span<const std::vector<int32_t>> public_prefixes);

// Hashes of the full blocks of `tokens` (tokens.size() / block_size of them), chained from
// k_root_block_hash. Blocks lying fully inside the longest public prefix the tokens start with get
// k_public_salt, every later block `salt`; the chain runs on through both. Pure, thread-safe.
std::vector<BlockHash> hash_block_chain(std::span<const int32_t> tokens, int block_size, uint64_t salt,
                                        std::span<const std::vector<int32_t>> public_prefixes);

}  // namespace steward
