// The physical KV memory of one pool: n_blocks blocks of block_size token slots per layer.
// It only stores; which sequence owns which block is the block table's business (kv/ managers).
#pragma once
#include <cassert>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <steward/expected.h>

#include "model/model.h"

namespace steward {

// The element type of K or V in the cache. Q8_0 and Q4_0 are ggml's blocks of 32 (34 and 18 bytes:
// an F16 scale, then 32 int8 or 32 nibbles); a slot row (n_head_kv head rows of head_dim values, one
// after the other) is quantized as a whole, as consecutive blocks, so head g's row is the values
// [g * head_dim, (g + 1) * head_dim) of it: whole blocks when head_dim % 32 == 0, else part of block
// g * head_dim / 32 (kv_dtype_fits). FP8_E4M3 is one byte a value (CUDA backend only; the CPU forward
// refuses it).
enum class KvDtype { F32, F16, BF16, Q8_0, Q4_0, FP8_E4M3 };

// The allowed names of parse_kv_dtype, for error messages.
inline constexpr const char* kKvDtypeNames = "f32, f16, bf16, q8_0, q4_0, fp8";
// Config spelling of a type: f32, f16, bf16, q8_0, q4_0, fp8.
const char* kv_dtype_name(KvDtype t);
// The inverse of kv_dtype_name (any case; "fp8_e4m3" also names FP8_E4M3); nullopt for others.
std::optional<KvDtype> parse_kv_dtype(std::string_view name);
// Values per block: 32 for Q8_0 and Q4_0, 1 otherwise.
int kv_dtype_block_elems(KvDtype t);
// Bytes of a row of n values (n a multiple of kv_dtype_block_elems).
int64_t kv_row_bytes(KvDtype t, int64_t n);
// Whether head rows of head_dim values are whole blocks of t (always for the one-value types).
inline bool kv_rows_whole_blocks(KvDtype t, int head_dim) { return head_dim % kv_dtype_block_elems(t) == 0; }
// Whether t can hold a slot of n_head_kv head rows of head_dim values: the one-value types always; a
// block type (32 values) when head_dim % 32 == 0 (each head row whole blocks), or when head_dim
// divides 32 and (n_head_kv * head_dim) % 32 == 0 (the slot row is whole blocks; a block holds
// 32 / head_dim head rows, e.g. TinyStories-656K's head dim 16 x 8 KV heads).
bool kv_dtype_fits(KvDtype t, int n_head_kv, int head_dim);

struct KvConfig {
    int n_layer = 0;
    int n_blocks = 0;
    int block_size = 16;
    int n_head_kv = 0;
    int head_dim = 0;
    KvDtype dtype_k = KvDtype::F32;
    KvDtype dtype_v = KvDtype::F32;
    // Both K and V in one type (the pool's kv_dtype shorthand).
    KvConfig& set_dtype(KvDtype t) {
        dtype_k = dtype_v = t;
        return *this;
    }
    // Bytes of one token slot of one layer, K or V: a row of n_head_kv * head_dim values (for a block
    // type, (n_head_kv * head_dim / 32) blocks).
    int64_t k_slot_bytes() const { return kv_row_bytes(dtype_k, (int64_t)n_head_kv * head_dim); }
    int64_t v_slot_bytes() const { return kv_row_bytes(dtype_v, (int64_t)n_head_kv * head_dim); }
};

// Bytes of KV for the whole pool: L * B * T * (k_slot_bytes + v_slot_bytes).
int64_t kv_bytes(const KvConfig& c);
// Bytes of K and V of one token over all layers: L * (k_slot_bytes + v_slot_bytes).
int64_t kv_bytes_per_token(const KvConfig& c);
// Whether a backend can hold this config's types: a block type (q8_0, q4_0) needs kv_dtype_fits
// (head_dim % 32 == 0, or head_dim dividing 32 with n_head_kv * head_dim % 32 == 0) and the CPU
// backend; fp8 needs the CUDA backend (cuda false: the CPU forward). Errors name the type, the
// shape, both conditions and the fix.
Expected<bool> check_kv_types(const KvConfig& c, bool cuda);

class KvStorage {
public:
    explicit KvStorage(const KvConfig& cfg);
    // Shapes the storage for a model: layers, kv heads and head size from its params.
    static KvConfig config_for(const ModelParams& p, int n_blocks, int block_size, KvDtype dtype);

    // Same as config_for with K and V in their own types.
    static KvConfig config_for(const ModelParams& p, int n_blocks, int block_size, KvDtype dtype_k, KvDtype dtype_v);

    const KvConfig& config() const { return cfg_; }
    // Bytes of one token slot in one layer, K or V: kv_row_bytes(type, n_head_kv * head_dim).
    int64_t k_slot_bytes() const { return ksb_; }
    int64_t v_slot_bytes() const { return vsb_; }
    // Whether each head row is whole blocks of the type (always for the one-value types). Where not
    // (a block type with head_dim < 32), head g is the values from element g * head_dim of the slot
    // row, inside block g * head_dim / 32, and has no byte offset of its own.
    bool k_rows_whole() const { return kv_rows_whole_blocks(cfg_.dtype_k, cfg_.head_dim); }
    bool v_rows_whole() const { return kv_rows_whole_blocks(cfg_.dtype_v, cfg_.head_dim); }
    // Bytes of one head row within a slot (head g starts g * k_row_bytes() into the slot); only
    // where k_rows_whole() (v_rows_whole()).
    int64_t k_row_bytes() const {
        assert(k_rows_whole());
        return ksb_ / cfg_.n_head_kv;
    }
    int64_t v_row_bytes() const {
        assert(v_rows_whole());
        return vsb_ / cfg_.n_head_kv;
    }
    // Start of slot `slot` of block `block` in layer `layer`, K or V.
    uint8_t* k_slot(int layer, int block, int slot) { return k_.data() + offset(layer, block, slot) * ksb_; }
    uint8_t* v_slot(int layer, int block, int slot) { return v_.data() + offset(layer, block, slot) * vsb_; }
    const uint8_t* k_slot(int layer, int block, int slot) const { return k_.data() + offset(layer, block, slot) * ksb_; }
    const uint8_t* v_slot(int layer, int block, int slot) const { return v_.data() + offset(layer, block, slot) * vsb_; }
    // Bytes of one block: every layer's K and V of its block_size slots (the export_block size).
    int64_t block_payload_bytes() const { return (int64_t)cfg_.n_layer * cfg_.block_size * (ksb_ + vsb_); }
    // Copies block `block`'s bytes to dst (block_payload_bytes of them), per layer K then V:
    // [n_layer][K: block_size * k_slot_bytes, V: block_size * v_slot_bytes]. import_block is the inverse.
    void export_block(int block, uint8_t* dst) const;
    void import_block(int block, const uint8_t* src);
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
    int64_t bytes() const { return (int64_t)(k_.size() + v_.size()); }

private:
    // Index of the slot in slots (times the slot bytes: its byte offset).
    int64_t offset(int layer, int block, int slot) const {
        return ((int64_t)layer * cfg_.n_blocks + block) * cfg_.block_size + slot;
    }
    KvConfig cfg_;
    int64_t ksb_ = 0, vsb_ = 0;  // k_slot_bytes, v_slot_bytes
    std::vector<uint8_t> k_;  // [n_layer][n_blocks][block_size][n_head_kv * head_dim] in dtype_k (a slot: one row of blocks)
    std::vector<uint8_t> v_;  // same shape in dtype_v
};

}  // namespace steward
