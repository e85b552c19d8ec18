// The CUDA backend as the engine sees it (backend.h's ForwardBackend): GpuForward (gpu/forward.h)
// over a GpuKv in device memory, plus host threads for sampling. Plain C++ header (no CUDA types), so
// the pool loader (runtime/pool/pool.cpp, built with STEWARD_HAVE_CUDA) includes it.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "model/model.h"

namespace steward {

// Makes CUDA backends: the weights uploaded (GpuForward::create), the KV pool allocated on the
// device (GpuKv::create). A backend of fewer layers of a model whose full backend this factory made
// (a self-draft) reads that one's weights (GpuForward::create_sharing): only its scratch and KV are
// new. Errors: the CUDA runtime's (out of device memory, no device), naming the model's shape and
// the bytes asked for. cuda_graphs: decode steps replay CUDA graphs (GpuForward::set_max_graphs);
// false launches every kernel.
BackendFactory cuda_backend_factory(bool cuda_graphs = true);

// The device's free bytes now (cudaMemGetInfo). Errors: the runtime's.
Expected<int64_t> cuda_free_bytes();

}  // namespace steward
