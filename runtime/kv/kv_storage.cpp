// Physical KV memory: flat arrays per K and V, block-major within each layer.
#include "kv/kv_storage.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cstring>
#include <string>
#include <utility>

namespace steward {

const char* kv_dtype_name(KvDtype t) {
    switch (t) {
        case KvDtype::F32: return "f32";
        case KvDtype::F16: return "f16";
        case KvDtype::BF16: return "bf16";
        case KvDtype::Q8_0: return "q8_0";
        case KvDtype::Q4_0: return "q4_0";
        case KvDtype::FP8_E4M3: return "fp8";
    }
    return "?";
}

std::optional<KvDtype> parse_kv_dtype(std::string_view name) {
    std::string s(name);
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return (char)std::tolower(c); });
    for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::Q8_0, KvDtype::Q4_0, KvDtype::FP8_E4M3})
        if (s == kv_dtype_name(t)) return t;
    if (s == "fp8_e4m3") return KvDtype::FP8_E4M3;
    return std::nullopt;
}

int kv_dtype_block_elems(KvDtype t) { return t == KvDtype::Q8_0 || t == KvDtype::Q4_0 ? 32 : 1; }

int64_t kv_row_bytes(KvDtype t, int64_t n) {
    switch (t) {
        case KvDtype::F32: return n * 4;
        case KvDtype::F16: case KvDtype::BF16: return n * 2;
        case KvDtype::Q8_0: return n / 32 * 34;
        case KvDtype::Q4_0: return n / 32 * 18;
        case KvDtype::FP8_E4M3: return n;
    }
    return 0;
}

bool kv_dtype_fits(KvDtype t, int n_head_kv, int head_dim) {
    const int be = kv_dtype_block_elems(t);
    if (head_dim <= 0 || head_dim % be == 0) return true;
    return be % head_dim == 0 && ((int64_t)n_head_kv * head_dim) % be == 0;
}

int64_t kv_bytes_per_token(const KvConfig& c) { return (int64_t)c.n_layer * (c.k_slot_bytes() + c.v_slot_bytes()); }

int64_t kv_bytes(const KvConfig& c) { return (int64_t)c.n_blocks * c.block_size * kv_bytes_per_token(c); }

Expected<bool> check_kv_types(const KvConfig& c, bool cuda) {
    for (KvDtype t : {c.dtype_k, c.dtype_v}) {
        if (t == KvDtype::FP8_E4M3 && !cuda)
            return make_error("KV type fp8 is for the CUDA backend only (the CPU forward has no fp8 kernels); "
                              "use q8_0 for a compact KV on the CPU, or backend = \"cuda\"");
        if ((t == KvDtype::Q8_0 || t == KvDtype::Q4_0) && cuda)
            return make_error("KV type ", kv_dtype_name(t), " runs on the CPU backend only (the CUDA attention reads "
                              "f32, f16, bf16 and fp8); use fp8 or bf16 on a cuda pool");
        if (!kv_dtype_fits(t, c.n_head_kv, c.head_dim)) {
            const std::string be = std::to_string(kv_dtype_block_elems(t));
            return make_error("KV type ", kv_dtype_name(t), " stores each slot row (", std::to_string(c.n_head_kv),
                              " KV heads x head dim) as blocks of ", be, " values, but the model's head dim is ",
                              std::to_string(c.head_dim), " with ", std::to_string(c.n_head_kv),
                              " KV heads; it needs head dim % ", be, " == 0, or head dim dividing ", be,
                              " with (KV heads x head dim) % ", be, " == 0; use f16 or bf16 for this model");
        }
    }
    return true;
}

KvStorage::KvStorage(const KvConfig& cfg) : cfg_(cfg), ksb_(cfg.k_slot_bytes()), vsb_(cfg.v_slot_bytes()) {
    assert(kv_dtype_fits(cfg.dtype_k, cfg.n_head_kv, cfg.head_dim) && kv_dtype_fits(cfg.dtype_v, cfg.n_head_kv, cfg.head_dim));
    const int64_t n_slots = (int64_t)cfg.n_layer * cfg.n_blocks * cfg.block_size;
    k_.assign((size_t)(n_slots * ksb_), 0);
    v_.assign((size_t)(n_slots * vsb_), 0);
}

KvConfig KvStorage::config_for(const ModelParams& p, int n_blocks, int block_size, KvDtype dtype) {
    return config_for(p, n_blocks, block_size, dtype, dtype);
}

KvConfig KvStorage::config_for(const ModelParams& p, int n_blocks, int block_size, KvDtype dtype_k, KvDtype dtype_v) {
    KvConfig c;
    c.n_layer = p.n_layer;
    c.n_blocks = n_blocks;
    c.block_size = block_size;
    c.n_head_kv = p.n_head_kv;
    c.head_dim = p.head_dim;
    c.dtype_k = dtype_k;
    c.dtype_v = dtype_v;
    return c;
}

void KvStorage::copy_slot(int src_block, int src_slot, int dst_block, int dst_slot) {
    for (int l = 0; l < cfg_.n_layer; l++) {
        std::memmove(k_slot(l, dst_block, dst_slot), k_slot(l, src_block, src_slot), ksb_);
        std::memmove(v_slot(l, dst_block, dst_slot), v_slot(l, src_block, src_slot), vsb_);
    }
}

void KvStorage::copy_block(int src_block, int dst_block) {
    for (int l = 0; l < cfg_.n_layer; l++) {
        std::memmove(k_slot(l, dst_block, 0), k_slot(l, src_block, 0), ksb_ * cfg_.block_size);
        std::memmove(v_slot(l, dst_block, 0), v_slot(l, src_block, 0), vsb_ * cfg_.block_size);
    }
}

void KvStorage::export_block(int block, uint8_t* dst) const {
    assert(block >= 0 && block < cfg_.n_blocks);
    const int64_t kb = ksb_ * cfg_.block_size, vb = vsb_ * cfg_.block_size;
    for (int l = 0; l < cfg_.n_layer; l++, dst += kb + vb) {
        std::memcpy(dst, k_slot(l, block, 0), (size_t)kb);
        std::memcpy(dst + kb, v_slot(l, block, 0), (size_t)vb);
    }
}

void KvStorage::import_block(int block, const uint8_t* src) {
    assert(block >= 0 && block < cfg_.n_blocks);
    const int64_t kb = ksb_ * cfg_.block_size, vb = vsb_ * cfg_.block_size;
    for (int l = 0; l < cfg_.n_layer; l++, src += kb + vb) {
        std::memcpy(k_slot(l, block, 0), src, (size_t)kb);
        std::memcpy(v_slot(l, block, 0), src + kb, (size_t)vb);
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
    // Gathered first, then scattered: [n][n_layer][k_slot_bytes + v_slot_bytes]. A few slots per
    // accepted path, so the scratch stays small; thread_local keeps it off the allocator in the step.
    thread_local std::vector<uint8_t> buf;
    const size_t n = src_slots.size(), kb = (size_t)ksb_, vb = (size_t)vsb_;
    buf.resize(n * (size_t)cfg_.n_layer * (kb + vb));
    uint8_t* o = buf.data();
    for (size_t i = 0; i < n; i++) {
        const auto [b, s] = where(src_table, src_slots[i]);
        for (int l = 0; l < cfg_.n_layer; l++, o += kb + vb) {
            std::memcpy(o, k_slot(l, b, s), kb);
            std::memcpy(o + kb, v_slot(l, b, s), vb);
        }
    }
    const uint8_t* in = buf.data();
    for (size_t i = 0; i < n; i++) {
        const auto [b, s] = where(dst_table, dst_slots[i]);
        for (int l = 0; l < cfg_.n_layer; l++, in += kb + vb) {
            std::memcpy(k_slot(l, b, s), in, kb);
            std::memcpy(v_slot(l, b, s), in + kb, vb);
        }
    }
}

}  // namespace steward
