// The CPU backend: CpuForward over a host KvStorage, the readable reference.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "cpu/forward.h"
#include "kv/kv_storage.h"

namespace steward {

// The readable reference: CpuForward over a host KvStorage. Never fails.
class CpuBackend final : public ForwardBackend {
public:
    CpuBackend(const Model& model, const KvConfig& kv, int max_tokens, int n_layers, int n_threads);

    std::string describe() const override { return "cpu"; }
    Expected<bool> forward(std::span<const SeqInput> batch, std::vector<float>& logits) override;
    Expected<bool> copy_block_slots(int src_block, int dst_block, int n_slots) override;
    Expected<bool> copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                              std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots) override;
    int64_t block_payload_bytes() const override { return kv_.block_payload_bytes(); }
    Expected<bool> export_block(int block, std::span<uint8_t> out) override;
    Expected<bool> import_block(int block, std::span<const uint8_t> in) override;
    const KvConfig& kv_config() const override { return kv_.config(); }
    int max_tokens() const override { return fwd_.max_tokens(); }
    int n_layers() const override { return fwd_.n_layers(); }
    ThreadPool& host_threads() override { return fwd_.thread_pool(); }

    KvStorage& storage() { return kv_; }

private:
    CpuForward fwd_;
    KvStorage kv_;
};

// The CPU backend's factory (what a null BackendFactory means).
BackendFactory cpu_backend_factory();

}  // namespace steward
