// A single-sequence generator over CpuForward with its own contiguous KV: what `steward generate`
// and the model bench use. The serving path (executor) drives CpuForward with many sequences.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/forward.h"
#include "cpu/sampling.h"

namespace steward {

struct GenerateStats {
    int n_prompt = 0;
    int n_generated = 0;
    double prefill_s = 0.0;
    double decode_s = 0.0;
};

class Generator {
public:
    // n_threads: 0 for all cores; the caller checks it (check_threads in config/limits.h).
    // kv_dtype is the KV's K type and, unless kv_dtype_v is given, its V type.
    Generator(const Model& model, int n_threads, KvDtype kv_dtype = KvDtype::F32, int block_size = 16,
              std::optional<KvDtype> kv_dtype_v = std::nullopt);
    // Prompt ids (may be empty only if the model has BOS: then BOS alone starts it). on_token is
    // called for every generated id; returning false stops. Stops at an end-of-generation token
    // (not passed to on_token) or after n_predict tokens. The KV is sized for prompt + n_predict
    // (grown when a later call needs more), never for the model's whole context. Errors:
    // n_predict < 0, prompt + n_predict past the context, sampling parameters check_sampling
    // refuses, a KV larger than the machine's memory, or a forward error.
    Expected<GenerateStats> generate(std::vector<int32_t> prompt, int n_predict, const SamplingParams& sp,
                                     const std::function<bool(int32_t, float)>& on_token);

private:
    const Model& model_;
    CpuForward fwd_;
    KvDtype kv_dtype_, kv_dtype_v_;
    int block_size_;
    std::unique_ptr<KvStorage> kv_;  // [n_blocks] for the longest request so far
    std::vector<int32_t> table_;
};

}  // namespace steward
