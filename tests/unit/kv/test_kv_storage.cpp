// Tests of the physical KV store (runtime/kv/kv_storage.h): copy_slots, the compaction of accepted
// tree paths, against a naive gather taken from a snapshot before the copy.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_storage.h"

using namespace steward;

namespace {

KvConfig small_config(KvDtype dtype) {
    KvConfig c;
    c.n_layer = 3;
    c.n_blocks = 10;
    c.block_size = 4;
    c.n_head_kv = 2;
    c.head_dim = 8;
    c.set_dtype(dtype);
    return c;
}

// Every byte of the store gets a random value.
void fill_random(KvStorage& kv, std::mt19937_64& rng) {
    const KvConfig& c = kv.config();
    for (int l = 0; l < c.n_layer; l++)
        for (int b = 0; b < c.n_blocks; b++)
            for (int s = 0; s < c.block_size; s++)
                for (int64_t i = 0; i < std::max(kv.k_slot_bytes(), kv.v_slot_bytes()); i++) {
                    if (i < kv.k_slot_bytes()) kv.k_slot(l, b, s)[i] = (uint8_t)rng();
                    if (i < kv.v_slot_bytes()) kv.v_slot(l, b, s)[i] = (uint8_t)rng();
                }
}

// One physical slot's bytes, all layers, K then V.
std::vector<uint8_t> slot_bytes(const KvStorage& kv, int block, int slot) {
    std::vector<uint8_t> out;
    for (int l = 0; l < kv.config().n_layer; l++) {
        out.insert(out.end(), kv.k_slot(l, block, slot), kv.k_slot(l, block, slot) + kv.k_slot_bytes());
        out.insert(out.end(), kv.v_slot(l, block, slot), kv.v_slot(l, block, slot) + kv.v_slot_bytes());
    }
    return out;
}

}  // namespace

TEST_CASE("copy_slots writes each destination the source's bytes as they were before any write, every layer, K and V",
          "[kv][storage]") {
    for (KvDtype dtype : {KvDtype::F32, KvDtype::F16}) {
        for (uint64_t seed = 1; seed <= 20; seed++) {
            std::mt19937_64 rng(seed);
            KvStorage kv(small_config(dtype));
            fill_random(kv, rng);
            const KvConfig& c = kv.config();
            // Two tables over a shuffled pool; they share blocks, as a table from before a truncation
            // and the table that reuses its freed blocks do.
            std::vector<int32_t> blocks(c.n_blocks);
            std::iota(blocks.begin(), blocks.end(), 0);
            std::shuffle(blocks.begin(), blocks.end(), rng);
            const std::vector<int32_t> src_table(blocks.begin(), blocks.begin() + 6);
            std::shuffle(blocks.begin(), blocks.end(), rng);
            const std::vector<int32_t> dst_table(blocks.begin(), blocks.begin() + 6);
            const int n_slots = 6 * c.block_size;
            // An accepted tree path: ascending sources, destinations the consecutive slots from a base,
            // so ranges overlap; sometimes random pairs instead.
            std::vector<int32_t> src, dst;
            const int n = 1 + (int)(rng() % 8);
            if (seed % 2) {
                const int base = (int)(rng() % 8);
                int at = base;
                for (int j = 1; j <= n; j++) {
                    at += 1 + (int)(rng() % 2);
                    src.push_back(std::min(at, n_slots - 1));
                    dst.push_back(base + j);
                }
            } else {
                std::vector<int32_t> all(n_slots);
                std::iota(all.begin(), all.end(), 0);
                std::shuffle(all.begin(), all.end(), rng);
                for (int j = 0; j < n; j++) src.push_back((int32_t)(rng() % n_slots));
                dst.assign(all.begin(), all.begin() + n);  // distinct destinations
            }
            // The naive gather: every source's bytes from a snapshot of the store.
            const KvStorage before = kv;
            std::vector<std::vector<uint8_t>> expected;
            for (int32_t s : src) expected.push_back(slot_bytes(before, src_table[s / c.block_size], s % c.block_size));
            kv.copy_slots(src_table, src, dst_table, dst);
            std::vector<std::vector<bool>> written(c.n_blocks, std::vector<bool>(c.block_size, false));
            for (size_t i = 0; i < dst.size(); i++) {
                const int b = dst_table[dst[i] / c.block_size], s = dst[i] % c.block_size;
                CHECK(slot_bytes(kv, b, s) == expected[i]);
                written[b][s] = true;
            }
            // Every other slot is untouched.
            for (int b = 0; b < c.n_blocks; b++)
                for (int s = 0; s < c.block_size; s++)
                    if (!written[b][s]) CHECK(slot_bytes(kv, b, s) == slot_bytes(before, b, s));
        }
    }
}
