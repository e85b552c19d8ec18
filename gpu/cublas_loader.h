// cuBLAS, loaded when first used (dlopen of libcublas.so.<major>) rather than linked: linking it
// costs every process that links steward_core about 0.4 s at start (libcublasLt's initialisation),
// GPU or not, and every test and CLI call links steward_core. The functions the backend calls, by
// pointer; the types are cuBLAS's own (its headers, no library).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <steward/expected.h>

namespace steward::gpu {

struct CublasApi {
    cublasStatus_t (*create)(cublasHandle_t*);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*get_stream)(cublasHandle_t, cudaStream_t*);
    cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                              const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    const char* (*status_name)(cublasStatus_t);
    const char* (*status_string)(cublasStatus_t);
};

// The loaded library's functions (loaded once; thread-safe). Errors: the library or a function
// is missing, naming the file tried and the fix.
Expected<const CublasApi*> cublas();

}  // namespace steward::gpu
