// Physical KV memory: flat arrays per K and V, block-major within each layer.
#include "kv/kv_storage.h"

#include <cassert>
#include <cstring>
#include <utility>

namespace steward {

int64_t kv_bytes(const KvConfig& c) {
    return 2ll * c.n_layer * c.n_blocks * c.block_size * c.n_head_kv * c.head_dim * (c.dtype == KvDtype::F16 ? 2 : 4);
}

KvStorage::KvStorage(const KvConfig& cfg) : cfg_(cfg) {
    const size_t n = (size_t)(kv_bytes(cfg) / 2);
    k_.assign(n, 0);
    v_.assign(n, 0);
}

KvConfig KvStorage::config_for(const ModelParams& p, int n_blocks, int block_size, KvDtype dtype) {
    KvConfig c;
    c.n_layer = p.n_layer;
    c.n_blocks = n_blocks;
    c.block_size = block_size;
    c.n_head_kv = p.n_head_kv;
    c.head_dim = p.head_dim;
    c.dtype = dtype;
    return c;
}

void KvStorage::copy_slot(int src_block, int src_slot, int dst_block, int dst_slot) {
    for (int l = 0; l < cfg_.n_layer; l++) {
        std::memmove(k_slot(l, dst_block, dst_slot), k_slot(l, src_block, src_slot), slot_bytes());
        std::memmove(v_slot(l, dst_block, dst_slot), v_slot(l, src_block, src_slot), slot_bytes());
    }
}

void KvStorage::copy_block(int src_block, int dst_block) {
    for (int l = 0; l < cfg_.n_layer; l++) {
        std::memmove(k_slot(l, dst_block, 0), k_slot(l, src_block, 0), slot_bytes() * cfg_.block_size);
        std::memmove(v_slot(l, dst_block, 0), v_slot(l, src_block, 0), slot_bytes() * cfg_.block_size);
    }
}

void KvStorage::copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                           std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots) {
    assert(src_slots.size() == dst_slots.size());
    const int bs = cfg_.block_size;
    auto where = [&](std::span<const int32_t> table, int32_t slot) {
        assert(slot >= 0 && (size_t)(slot / bs) < table.size());
        const int32_t block = table[(size_t)(slot / bs)];
        assert(block >= 0 && block < cfg_.n_blocks);
        return std::pair<int, int>(block, slot % bs);
    };
    // Gathered first, then scattered: [n][n_layer][2][slot_bytes]. A few slots per accepted path,
    // so the scratch stays small; thread_local keeps it off the allocator in the step.
    thread_local std::vector<uint8_t> buf;
    const size_t n = src_slots.size(), sb = (size_t)slot_bytes();
    buf.resize(n * (size_t)cfg_.n_layer * 2 * sb);
    uint8_t* o = buf.data();
    for (size_t i = 0; i < n; i++) {
        const auto [b, s] = where(src_table, src_slots[i]);
        for (int l = 0; l < cfg_.n_layer; l++, o += 2 * sb) {
            std::memcpy(o, k_slot(l, b, s), sb);
            std::memcpy(o + sb, v_slot(l, b, s), sb);
        }
    }
    const uint8_t* in = buf.data();
    for (size_t i = 0; i < n; i++) {
        const auto [b, s] = where(dst_table, dst_slots[i]);
        for (int l = 0; l < cfg_.n_layer; l++, in += 2 * sb) {
            std::memcpy(k_slot(l, b, s), in, sb);
            std::memcpy(v_slot(l, b, s), in + sb, sb);
        }
    }
}

}  // namespace steward
