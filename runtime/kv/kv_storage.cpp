// Physical KV memory: flat arrays per K and V, block-major within each layer.
#include "kv/kv_storage.h"

#include <cstring>

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

}  // namespace steward
