// CudaBackend: the engine's ForwardBackend over GpuForward and GpuKv (gpu/forward.h).
#include "backend/cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "cpu/kernels.h"
#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/forward.h"
#include "gpu/kernels.h"

namespace steward {

namespace {

class CudaBackend final : public ForwardBackend {
public:
    CudaBackend(std::shared_ptr<GpuForward> fwd, std::unique_ptr<GpuKv> kv, int n_threads, int max_context, std::string device,
                bool graphs)
        : fwd_(std::move(fwd)), kv_(std::move(kv)), host_(n_threads > 0 ? n_threads : cpu_count()), max_context_(max_context),
          device_(std::move(device)), fwd_graphs_(graphs) {}

    std::string describe() const override {
        const GpuForward::GraphStats& g = fwd_->graph_stats();
        std::string decode;
        if (!g.disabled.empty()) decode = "without CUDA graphs: " + g.disabled;
        else if (!fwd_graphs_) decode = "without CUDA graphs (cuda_graphs = false)";
        else decode = "with CUDA graphs: " + std::to_string(g.captured) + " captured, " + std::to_string(g.replays) + " replays";
        return "cuda (" + device_ + "; decode " + decode + ")";
    }
    Expected<bool> forward(std::span<const SeqInput> batch, std::vector<float>& logits) override {
        auto r = fwd_->forward(*kv_, batch, logits);
        if (!warned_ && !fwd_->graph_stats().disabled.empty()) {
            warned_ = true;  // once: the forward runs on, with plain launches
            spdlog::warn("CUDA backend ({} layers): decode graphs turned off, decode runs with plain launches: {}",
                         fwd_->n_layers(), fwd_->graph_stats().disabled);
        }
        return r;
    }
    int64_t block_payload_bytes() const override { return kv_->block_payload_bytes(); }
    Expected<bool> export_block(int block, std::span<uint8_t> out) override {
        if ((int64_t)out.size() != kv_->block_payload_bytes())
            return make_error("export_block: ", out.size(), " bytes for a block of ", kv_->block_payload_bytes());
        return kv_->export_block(block, out.data());
    }
    Expected<bool> import_block(int block, std::span<const uint8_t> in) override {
        if ((int64_t)in.size() != kv_->block_payload_bytes())
            return make_error("import_block: ", in.size(), " bytes for a block of ", kv_->block_payload_bytes());
        return kv_->import_block(block, in.data());
    }
    Expected<bool> copy_block_slots(int src_block, int dst_block, int n_slots) override {
        if (n_slots <= 0) return true;
        std::vector<int32_t> slots((size_t)n_slots);
        for (int k = 0; k < n_slots; k++) slots[(size_t)k] = k;
        const int32_t src = src_block, dst = dst_block;
        return kv_->copy_slots(std::span<const int32_t>(&src, 1), slots, std::span<const int32_t>(&dst, 1), slots);
    }
    Expected<bool> copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                              std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots) override {
        return kv_->copy_slots(src_table, src_slots, dst_table, dst_slots);
    }
    const KvConfig& kv_config() const override { return kv_->config(); }
    int max_tokens() const override { return fwd_->max_tokens(); }
    int n_layers() const override { return fwd_->n_layers(); }
    int max_context() const override { return max_context_; }
    ThreadPool& host_threads() override { return host_; }

private:
    std::shared_ptr<GpuForward> fwd_;
    std::unique_ptr<GpuKv> kv_;
    ThreadPool host_;
    int max_context_;
    std::string device_;
    bool fwd_graphs_;
    bool warned_ = false;
};

}  // namespace

BackendFactory cuda_backend_factory(bool cuda_graphs) {
    // The full forwards this factory made, by model: a self-draft of fewer layers (made after its
    // target, the same Model) reads the target's weights on the device instead of a copy. Only the
    // first backend (the engine's target: it samples on the host threads) gets n_threads; the
    // drafters' never use theirs.
    struct State {
        std::map<const Model*, std::weak_ptr<GpuForward>> full;
        bool first = true;
    };
    auto st = std::make_shared<State>();
    return [st, cuda_graphs](const Model& model, const KvConfig& kv, int max_tokens, int n_layers,
                int n_threads) -> Expected<std::unique_ptr<ForwardBackend>> {
        // The CUDA forward runs the llama block (with qwen's biases and q/k norms); Gemma's extra
        // norms, GeGLU, soft-capping and sliding windows, mixtures of experts (gpt-oss's sinks among
        // them), YaRN and the encoders run on the CPU backend only.
        const ModelParams& mp = model.params();
        if (mp.is_encoder() || mp.is_moe() || mp.ffn_gelu || mp.attn_softcap > 0 || mp.final_softcap > 0 || mp.n_swa > 0 ||
            mp.embd_scale != 1.0f || mp.attn_sinks || mp.yarn_ext_factor != 0.0f || mp.rope_attn_factor != 1.0f)
            return make_error("CUDA backend: the '", mp.arch, "' architecture runs on the CPU backend only so far; ",
                              "give this pool backend = \"cpu\"");
        const GpuInfo g = gpu_probe();
        if (g.status != GpuProbeStatus::GPU_PROBE_OK) return make_error("CUDA backend: ", gpu_describe(g));
        auto max_slots = gpu::attention_max_slots(model.params().head_dim);
        if (!max_slots) return make_error("CUDA backend: ", max_slots.error().message);
        auto* full = &st->full;
        const int layers = forward_layers(model.params(), n_layers);
        std::shared_ptr<GpuForward> source;
        if (auto it = full->find(&model); it != full->end()) source = it->second.lock();
        Expected<std::unique_ptr<GpuForward>> fwd = source && layers < model.params().n_layer
                                                        ? GpuForward::create_sharing(*source, max_tokens, layers)
                                                        : GpuForward::create(model, max_tokens, n_layers);
        if (!fwd)
            return make_error("CUDA backend: the model's ", std::to_string(layers), " layers (about ",
                              std::to_string(GpuForward::device_bytes(model, max_tokens, n_layers, !source) >> 20),
                              " MiB with scratch for ", std::to_string(max_tokens), " tokens): ", fwd.error().message,
                              "; lower max_batch_tokens, use a smaller model, or free device memory");
        std::shared_ptr<GpuForward> made = std::move(*fwd);
        if (!cuda_graphs) made->set_max_graphs(0);
        if (layers == model.params().n_layer) (*full)[&model] = made;
        auto pool = GpuKv::create(kv);
        if (!pool)
            return make_error("CUDA backend: a KV pool of ", std::to_string(kv.n_blocks), " blocks (",
                              std::to_string(kv_bytes(kv) >> 20), " MiB): ", pool.error().message,
                              "; lower kv_blocks / kv_gib or gpu_memory_fraction");
        const int threads = st->first ? n_threads : 1;
        st->first = false;
        return std::unique_ptr<ForwardBackend>(
            std::make_unique<CudaBackend>(std::move(made), std::move(*pool), threads, *max_slots, gpu_describe(g),
                                          cuda_graphs));
    };
}

Expected<int64_t> cuda_free_bytes() {
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    return (int64_t)free_b;
}

}  // namespace steward
