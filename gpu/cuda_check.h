// The checking macros every CUDA runtime and cuBLAS call goes through: a failure becomes an Error
// (steward/expected.h) naming the call, the file and line, and the runtime's own words. Library code
// never exits; only a bench or a CLI may.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include <steward/expected.h>

#include "gpu/cublas_loader.h"

namespace steward {

inline Error cuda_error(cudaError_t e, const char* what, const char* file, int line) {
    return make_error(file, ":", line, ": ", what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

inline Error cublas_error(cublasStatus_t s, const char* what, const char* file, int line) {
    auto api = gpu::cublas();  // loaded: a status can only come from a loaded cuBLAS
    if (!api) return make_error(file, ":", line, ": ", what, " failed: cuBLAS status ", (int)s);
    return make_error(file, ":", line, ": ", what, " failed: ", (*api)->status_name(s), " (", (*api)->status_string(s), ")");
}

}  // namespace steward

// In a function returning Expected<T>: returns the Error when the call fails.
#define CUDA_TRY(call)                                                            \
    do {                                                                          \
        const cudaError_t steward_e_ = (call);                                    \
        if (steward_e_ != cudaSuccess)                                            \
            return ::steward::cuda_error(steward_e_, #call, __FILE__, __LINE__);  \
    } while (0)

#define CUBLAS_TRY(call)                                                              \
    do {                                                                              \
        const cublasStatus_t steward_s_ = (call);                                     \
        if (steward_s_ != CUBLAS_STATUS_SUCCESS)                                      \
            return ::steward::cublas_error(steward_s_, #call, __FILE__, __LINE__);    \
    } while (0)

// After a kernel launch: the launch's own error (bad configuration), not the kernel's outcome
// (that surfaces at the next synchronising call, which is checked too).
#define CUDA_TRY_LAUNCH() CUDA_TRY(cudaGetLastError())

// Propagates an Error from an Expected-returning call.
#define STEWARD_TRY(expr)                             \
    do {                                              \
        auto steward_r_ = (expr);                     \
        if (!steward_r_) return steward_r_.error();   \
    } while (0)
