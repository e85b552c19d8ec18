// The CUDA backend's batched forward over paged KV: the same contract as CpuForward (cpu/forward.h,
// the readable reference it is tested against): one SeqInput batch, logits on the host. Weights are
// uploaded once (F32 and F16 as stored, Q8_0 / Q4_K dequantized to F16 on the device, other types
// to F16 on the host); the KV pool (GpuKv) lives in device memory. Plain C++ header (no CUDA types).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "kv/kv_storage.h"
#include "model/model.h"

namespace steward {

// Device twin of KvStorage: the same layout, [n_layer][n_blocks][block_size][n_head_kv][head_dim]
// for K and for V, in device memory. Not thread-safe; one forward at a time uses it.
class GpuKv {
public:
    // Allocates the pool. Errors: out of device memory, no device (the CUDA runtime's words).
    static Expected<std::unique_ptr<GpuKv>> create(const KvConfig& cfg);
    // Blocks of `shape` (its n_blocks ignored) that fit in `fraction` of the device's free memory.
    static Expected<int> blocks_for_free_memory(const KvConfig& shape, double fraction);
    ~GpuKv();
    GpuKv(const GpuKv&) = delete;
    GpuKv& operator=(const GpuKv&) = delete;

    const KvConfig& config() const { return cfg_; }
    // This pool's number, unique in the process (a decode graph is captured over one pool; a new
    // pool at a freed one's address is still another pool).
    uint64_t id() const { return id_; }
    void* k_layer(int l) const;  // device pointers to layer l: [n_blocks * block_size][kvd]
    void* v_layer(int l) const;
    // Copies the whole pool to / from a host KvStorage of the same config (tests).
    Expected<bool> download(KvStorage& out) const;
    Expected<bool> upload(const KvStorage& in);
    // One block's bytes, every layer K then V (KvStorage::export_block's layout), to / from host
    // memory of block_payload_bytes() (the KV tiers' demotion and promotion). Synchronous.
    int64_t block_payload_bytes() const {
        return (int64_t)cfg_.n_layer * cfg_.block_size * (cfg_.k_slot_bytes() + cfg_.v_slot_bytes());
    }
    Expected<bool> export_block(int block, uint8_t* dst) const;
    Expected<bool> import_block(int block, const uint8_t* src);
    // KvStorage::copy_slots on the device: every layer's logical slots src_slots[i] of src_table to
    // dst_slots[i] of dst_table, as if all sources were read first.
    Expected<bool> copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                              std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots);

private:
    explicit GpuKv(const KvConfig& cfg);
    KvConfig cfg_;
    uint64_t id_ = 0;
    void* k_ = nullptr;
    void* v_ = nullptr;
    // copy_slots' device scratch (slot indices, staged K/V), grown as needed and kept: a copy runs
    // at every accepted tree path and copy-on-write, and cudaMalloc there would cost more than it.
    int32_t* idx_ = nullptr;
    size_t idx_cap_ = 0;
    uint8_t* tmp_ = nullptr;
    size_t tmp_cap_ = 0;
};

class GpuForward {
public:
    // Uploads the model's weights. max_tokens bounds one batch (scratch); n_layers as CpuForward's.
    // Errors: no device, out of device memory, a weight type with no path to F16 (the type named).
    static Expected<std::unique_ptr<GpuForward>> create(const Model& model, int max_tokens = 2048, int n_layers = 0);
    // A forward of source's first n_layers layers (0: all it holds) reading source's weights on the
    // device, not a copy: the self-draft of a target already uploaded. Only its scratch is new;
    // source's weights stay allocated as long as either forward lives. Errors: more layers than
    // source holds, out of device memory.
    static Expected<std::unique_ptr<GpuForward>> create_sharing(const GpuForward& source, int max_tokens, int n_layers);
    // A model of params' shape whose matrices are F16 pseudo-random values made on the device (norms
    // 1): the bench's 1B / 8B shapes without a file. seed picks the values.
    static Expected<std::unique_ptr<GpuForward>> create_synthetic(const ModelParams& params, int max_tokens,
                                                                  uint64_t seed);
    ~GpuForward();
    GpuForward(const GpuForward&) = delete;
    GpuForward& operator=(const GpuForward&) = delete;

    // CpuForward::forward's contract (check_batch's errors, leaving the KV untouched), over kv.
    Expected<bool> forward(GpuKv& kv, std::span<const SeqInput> batch, std::vector<float>& logits);
    // The same, with the logits left on the device and each row's argmax (greedy sampling on the
    // device) copied out instead: the decode loop's path, one int per output row.
    Expected<bool> forward_greedy(GpuKv& kv, std::span<const SeqInput> batch, std::vector<int32_t>& tokens);
    // Device bytes a forward of model (n_layers layers, 0: all) with scratch for max_tokens takes:
    // the weights as create uploads them and the scratch it allocates (with_weights false: the
    // scratch alone, a create_sharing forward). Sizes the KV before anything is uploaded; the CUDA
    // context and cuBLAS's workspace are not in it.
    static int64_t device_bytes(const Model& model, int max_tokens, int n_layers, bool with_weights = true);
    // Waits for the work queued on the forward's stream (benches time with it).
    Expected<bool> synchronize();

    // CUDA graphs for decode: a batch where every sequence has one new token, no mask and its
    // logits wanted replays a graph of the whole forward captured for its number of sequences and
    // its longest sequence's slot bucket (a power of two >= 256, past 8192 a multiple of 8192)
    // over this KV pool, instead of launching ~20 kernels and GEMMs per layer. A shape's first
    // step runs plainly (a warm-up), its second is captured. Same kernels, same arguments but the
    // attention's shared-memory size: the same logits. Prefill, verification and masked batches
    // run as before. At most max_graphs graphs are kept (least recently used dropped); 0 turns
    // graphs off, more turns them on again. A capture the device refuses turns them off for this
    // forward, its reason in graph_stats().
    static constexpr int kDefaultMaxGraphs = 64;
    void set_max_graphs(int max_graphs);
    struct GraphStats {
        int64_t captured = 0;       // graphs captured
        int64_t replays = 0;        // decode steps run by a graph
        int64_t warmups = 0;        // decode steps run plainly as a shape's first (captured at its second)
        int64_t eager_decodes = 0;  // decode steps run without (graphs off or refused)
        int64_t evicted = 0;        // graphs dropped past max_graphs
        std::string disabled;       // why graphs were turned off ("" while they are on)
    };
    const GraphStats& graph_stats() const;

    const ModelParams& params() const;
    int max_tokens() const;
    int n_layers() const;
    int64_t weight_bytes() const;  // device bytes of the uploaded weights (0: sharing another's)

    struct Impl;

private:
    explicit GpuForward(std::unique_ptr<Impl> impl);
    std::shared_ptr<Impl> impl_;  // shared with the forwards made by create_sharing from this one
};

}  // namespace steward
