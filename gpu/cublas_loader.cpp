#include "gpu/cublas_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace steward::gpu {

namespace {

struct Loaded {
    CublasApi api{};
    std::string error;  // empty: loaded
};

Loaded load() {
    Loaded out;
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char* why = dlerror();
        out.error = "cuBLAS could not be loaded (" + soname + ": " + (why ? why : "not found") +
                    "); install the CUDA toolkit's cuBLAS " + std::to_string(CUBLAS_VER_MAJOR) +
                    " or put its lib directory on LD_LIBRARY_PATH";
        return out;
    }
    auto sym = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
        if (!fn && out.error.empty()) out.error = std::string("cuBLAS (") + soname + ") has no " + name + "; its version does not match the headers Steward was built with";
    };
    sym(out.api.create, "cublasCreate_v2");
    sym(out.api.destroy, "cublasDestroy_v2");
    sym(out.api.set_stream, "cublasSetStream_v2");
    sym(out.api.get_stream, "cublasGetStream_v2");
    sym(out.api.set_workspace, "cublasSetWorkspace_v2");
    sym(out.api.gemm_ex, "cublasGemmEx");
    sym(out.api.status_name, "cublasGetStatusName");
    sym(out.api.status_string, "cublasGetStatusString");
    return out;
}

}  // namespace

Expected<const CublasApi*> cublas() {
    static const Loaded loaded = load();  // once, thread-safe
    if (!loaded.error.empty()) return make_error(loaded.error);
    return &loaded.api;
}

}  // namespace steward::gpu
