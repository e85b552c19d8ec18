// What a pool's engine runs its forwards on: one batched forward over paged KV and the KV memory it
// writes, owned together. The backends are peers in this folder: cpu.h (CpuForward over a host
// KvStorage, the readable reference), cuda.h (GpuForward over a device GpuKv, built when nvcc is
// found) and sim.h (the simulator: the cost model's time, tokens from a generator). The engine's
// runner and its drafters only ever see this interface, so the scheduler, prefix cache and
// speculation run unchanged on each.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "cpu/thread_pool.h"
#include "kv/kv_storage.h"
#include "model/model.h"
#include <steward/expected.h>

namespace steward {

class ForwardBackend {
public:
    virtual ~ForwardBackend() = default;

    // "cpu", or "cuda" and the device: what a log line says the pool runs on.
    virtual std::string describe() const = 0;
    // CpuForward::forward's contract over the backend's KV: logits on the host, one row of n_vocab
    // per requested output in batch order; an invalid batch (check_batch) leaves the KV untouched.
    virtual Expected<bool> forward(std::span<const SeqInput> batch, std::vector<float>& logits) = 0;
    // A backend that decides the target's tokens itself (the simulator) leaves logits empty and
    // gives one token per requested row here, in the rows' order; empty: the logits hold them.
    virtual std::span<const int32_t> decided_tokens() const { return {}; }
    // A step begins (before its scheduling): a backend that runs ahead of its host (the simulator)
    // counts its device time from here.
    virtual void begin_step() {}
    // The last forward's time when it is not the host's wall time around it (the simulator's device
    // time); < 0: the wall time is.
    virtual double forward_time_s() const { return -1; }
    // The first n_slots slots of block src copied to block dst, every layer, K and V (prefix-cache
    // copy-on-write of a partly filled block).
    virtual Expected<bool> copy_block_slots(int src_block, int dst_block, int n_slots) = 0;
    // KvStorage::copy_slots: logical slots through two block tables, every source read first.
    virtual Expected<bool> copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                                      std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots) = 0;

    // One block's KV bytes, every layer, K then V (KvStorage::export_block's layout), to / from a host
    // buffer of block_payload_bytes(): what the KV tiers (kv/kv_tier.h) keep of an evicted block and
    // write back at promotion. 0 bytes: the backend holds no KV bytes (the simulator) and has no tiers.
    virtual int64_t block_payload_bytes() const { return 0; }
    virtual Expected<bool> export_block(int /*block*/, std::span<uint8_t> /*out*/) {
        return make_error(describe(), " holds no KV bytes to export");
    }
    virtual Expected<bool> import_block(int /*block*/, std::span<const uint8_t> /*in*/) {
        return make_error(describe(), " holds no KV bytes to import");
    }

    virtual const KvConfig& kv_config() const = 0;
    virtual int64_t kv_storage_bytes() const { return kv_bytes(kv_config()); }
    virtual int max_tokens() const = 0;  // tokens of one batch
    // The most KV slots one sequence may span on this backend (0: the model's context is the limit):
    // the CUDA attention keeps a sequence's scores in shared memory.
    virtual int max_context() const { return 0; }
    virtual int n_layers() const = 0;    // layers the forward runs (fewer for a self-draft)
    // Host threads, idle during the engine's host work: it samples a batch's rows on them.
    virtual ThreadPool& host_threads() = 0;
};

// Makes a backend for model over KV of shape kv (its n_layer already n_layers' when a self-draft
// runs fewer), batches of up to max_tokens, running the first n_layers layers (0: all), with
// n_threads host threads (<= 0: all cores). Errors: the device's (out of memory, no device).
using BackendFactory = std::function<Expected<std::unique_ptr<ForwardBackend>>(
    const Model& model, const KvConfig& kv, int max_tokens, int n_layers, int n_threads)>;

}  // namespace steward
