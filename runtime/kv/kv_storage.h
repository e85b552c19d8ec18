// The physical KV memory of one pool: n_blocks blocks of block_size token slots per layer.
// It only stores; which sequence owns which block is the block table's business (kv/ managers).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace steward {

enum class KvDtype { F32, F16 };

struct KvConfig {
    int n_layer = 0;
    int n_blocks = 0;
    int block_size = 16;
    int n_head_kv = 0;
    int head_dim = 0;
    KvDtype dtype = KvDtype::F32;
};

// Bytes of KV for the whole pool: 2 (K and V) * L * B * T * H_kv * D_head * bytes.
int64_t kv_bytes(const KvConfig& c);

class KvStorage {
public:
    explicit KvStorage(const KvConfig& cfg);
    // Shapes the storage for a model: layers, kv heads and head size from its params.
    static KvConfig config_for(const ModelParams& p, int n_blocks, int block_size, KvDtype dtype);

    const KvConfig& config() const { return cfg_; }
    int elem_bytes() const { return cfg_.dtype == KvDtype::F16 ? 2 : 4; }
    // Bytes of one token slot in one layer: n_head_kv * head_dim elements.
    int64_t slot_bytes() const { return (int64_t)cfg_.n_head_kv * cfg_.head_dim * elem_bytes(); }
    // Start of slot `slot` of block `block` in layer `layer`, K or V.
    uint8_t* k_slot(int layer, int block, int slot) { return k_.data() + offset(layer, block, slot); }
    uint8_t* v_slot(int layer, int block, int slot) { return v_.data() + offset(layer, block, slot); }
    const uint8_t* k_slot(int layer, int block, int slot) const { return k_.data() + offset(layer, block, slot); }
    const uint8_t* v_slot(int layer, int block, int slot) const { return v_.data() + offset(layer, block, slot); }
    // Copies every layer's K and V of one slot to another (used to compact accepted tree paths
    // and for copy-on-write of a partly filled block).
    void copy_slot(int src_block, int src_slot, int dst_block, int dst_slot);
    void copy_block(int src_block, int dst_block);
    // Copies every layer's K and V of logical slot src_slots[i] of the sequence mapped by src_table
    // to logical slot dst_slots[i] of dst_table (logical slot s is physical (table[s / block_size],
    // s % block_size)), for all i AS IF every source were read before any destination is written:
    // sources and destinations may overlap, and src_table may be a table from before a truncation
    // whose freed blocks dst_table reuses. This is how an accepted tree path is made contiguous.
    // Slots outside a table or blocks outside the pool are caller bugs (asserted).
    void copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                    std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots);
    int64_t bytes() const { return (int64_t)k_.size() * 2; }

private:
    int64_t offset(int layer, int block, int slot) const {
        return (((int64_t)layer * cfg_.n_blocks + block) * cfg_.block_size + slot) * slot_bytes();
    }
    KvConfig cfg_;
    std::vector<uint8_t> k_;  // [n_layer][n_blocks][block_size][n_head_kv][head_dim]
    std::vector<uint8_t> v_;  // same shape
};

}  // namespace steward
