// Helpers of the GPU tests: a device buffer that frees itself, and closeness of two float arrays
// relative to the reference's largest magnitude.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace steward::test {

template <typename T>
struct DeviceBuf {
    T* p = nullptr;
    size_t n = 0;
    explicit DeviceBuf(size_t count) : n(count) { REQUIRE(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) == cudaSuccess); }
    explicit DeviceBuf(const std::vector<T>& host) : DeviceBuf(host.size()) { put(host); }
    ~DeviceBuf() { cudaFree(p); }
    DeviceBuf(const DeviceBuf&) = delete;
    DeviceBuf& operator=(const DeviceBuf&) = delete;
    void put(const std::vector<T>& host) {
        REQUIRE(host.size() <= n);
        REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    std::vector<T> get() const {
        std::vector<T> h(n);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
        return h;
    }
};

// max |got - want| / max |want| (0 when both are all zero).
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    double d = 0, m = 0;
    for (size_t i = 0; i < want.size(); i++) {
        d = std::max(d, (double)std::fabs(got[i] - want[i]));
        m = std::max(m, (double)std::fabs(want[i]));
    }
    return m > 0 ? d / m : d;
}

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

}  // namespace steward::test
