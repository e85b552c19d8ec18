// CpuBackend: the engine's ForwardBackend over CpuForward and a host KvStorage.
#include "backend/cpu.h"

namespace steward {

CpuBackend::CpuBackend(const Model& model, const KvConfig& kv, int max_tokens, int n_layers, int n_threads)
    : fwd_(model, n_threads, max_tokens, n_layers), kv_(kv) {}

Expected<bool> CpuBackend::forward(std::span<const SeqInput> batch, std::vector<float>& logits) {
    return fwd_.forward(kv_, batch, logits);
}

Expected<bool> CpuBackend::copy_block_slots(int src_block, int dst_block, int n_slots) {
    for (int k = 0; k < n_slots; k++) kv_.copy_slot(src_block, k, dst_block, k);
    return true;
}

Expected<bool> CpuBackend::copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                                      std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots) {
    kv_.copy_slots(src_table, src_slots, dst_table, dst_slots);
    return true;
}

BackendFactory cpu_backend_factory() {
    return [](const Model& model, const KvConfig& kv, int max_tokens, int n_layers,
              int n_threads) -> Expected<std::unique_ptr<ForwardBackend>> {
        return std::unique_ptr<ForwardBackend>(std::make_unique<CpuBackend>(model, kv, max_tokens, n_layers, n_threads));
    };
}

Expected<bool> CpuBackend::export_block(int block, std::span<uint8_t> out) {
    if (block < 0 || block >= kv_.config().n_blocks || (int64_t)out.size() != kv_.block_payload_bytes())
        return make_error("export_block: block ", std::to_string(block), " of ", std::to_string(kv_.config().n_blocks),
                          " into ", std::to_string(out.size()), " bytes (expected ", std::to_string(kv_.block_payload_bytes()), ")");
    kv_.export_block(block, out.data());
    return true;
}

Expected<bool> CpuBackend::import_block(int block, std::span<const uint8_t> in) {
    if (block < 0 || block >= kv_.config().n_blocks || (int64_t)in.size() != kv_.block_payload_bytes())
        return make_error("import_block: block ", std::to_string(block), " of ", std::to_string(kv_.config().n_blocks),
                          " from ", std::to_string(in.size()), " bytes (expected ", std::to_string(kv_.block_payload_bytes()), ")");
    kv_.import_block(block, in.data());
    return true;
}

}  // namespace steward
