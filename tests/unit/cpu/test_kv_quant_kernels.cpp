// The quantized KV cache kernels (cpu/kernels.h dot_/axpy_ bf16, q8_0, q4_0): against a naive
// double-precision loop over the dequantized row, and every kernel level against the scalar twin.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "cpu/kernels.h"
#include "model/ggml_types.h"
#include "model/quantize.h"
#include "model/quants.h"

using namespace steward;

namespace {

// A row of n random values in one KV type, and its exact F32 values (the reference dequantizer).
struct KvRow {
    GgmlType type;
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};

KvRow random_row(GgmlType type, int n, std::mt19937& rng) {
    std::normal_distribution<float> g(0.0f, 1.5f);
    std::vector<float> x((size_t)n);
    for (auto& v : x) v = g(rng);
    KvRow r{type, std::vector<uint8_t>((size_t)ggml_row_bytes(type, n)), std::vector<float>((size_t)n)};
    REQUIRE(quantize_row(type, x.data(), n, r.bytes.data()).ok());
    dequantize_row(type, r.bytes.data(), r.values.data(), n);
    return r;
}

float dot_of(const KvRow& r, const float* a, int n) {
    switch (r.type) {
        case GgmlType::BF16: return dot_bf16(a, reinterpret_cast<const uint16_t*>(r.bytes.data()), n);
        case GgmlType::Q8_0: return dot_q8_0(a, r.bytes.data(), n);
        default: return dot_q4_0(a, r.bytes.data(), n);
    }
}

void axpy_of(const KvRow& r, float s, float* y, int n) {
    switch (r.type) {
        case GgmlType::BF16: axpy_bf16(s, reinterpret_cast<const uint16_t*>(r.bytes.data()), y, n); return;
        case GgmlType::Q8_0: axpy_q8_0(s, r.bytes.data(), y, n); return;
        default: axpy_q4_0(s, r.bytes.data(), y, n); return;
    }
}

}  // namespace

TEST_CASE("KV quant kernels match a double loop over the dequantized row", "[kv_quant][kernels]") {
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (GgmlType type : {GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0})
        for (int n : {32, 64, 96, 128, 256, 512}) {
            INFO(ggml_type_name((uint32_t)type) << " n " << n);
            for (int rep = 0; rep < 8; rep++) {
                const KvRow r = random_row(type, n, rng);
                std::vector<float> a((size_t)n), y((size_t)n);
                for (auto& v : a) v = g(rng);
                for (auto& v : y) v = g(rng);
                double want = 0.0, mag = 0.0;
                for (int i = 0; i < n; i++) want += (double)a[i] * r.values[i], mag += std::fabs((double)a[i] * r.values[i]);
                // float accumulation of n products: a few ulps of the sum of magnitudes
                CHECK(std::fabs(dot_of(r, a.data(), n) - want) <= 1e-5 * (1.0 + mag));
                const float s = g(rng);
                std::vector<float> got = y;
                axpy_of(r, s, got.data(), n);
                for (int i = 0; i < n; i++) {
                    const double w = (double)y[i] + (double)s * r.values[i];
                    REQUIRE(std::fabs(got[i] - w) <= 1e-6 * (1.0 + std::fabs(w) + std::fabs((double)s * r.values[i])));
                }
            }
        }
}

TEST_CASE("KV quant kernels agree across kernel levels", "[kv_quant][kernels][dispatch]") {
    const CpuLevel was = cpu_level();
    std::mt19937 rng(9);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<KvRow> rows;
    std::vector<std::vector<float>> as;
    for (GgmlType type : {GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0})
        for (int n : {32, 64, 128, 160}) {
            rows.push_back(random_row(type, n, rng));
            as.emplace_back((size_t)n);
            for (auto& v : as.back()) v = g(rng);
        }
    std::vector<float> dots0;
    std::vector<std::vector<float>> axpys0;
    for (int l = 0; l <= (int)cpu_level_supported(); l++) {
        REQUIRE(set_cpu_level((CpuLevel)l));
        INFO("kernel level " << cpu_level_name((CpuLevel)l));
        for (size_t i = 0; i < rows.size(); i++) {
            const int n = (int)as[i].size();
            INFO(ggml_type_name((uint32_t)rows[i].type) << " n " << n);
            const float d = dot_of(rows[i], as[i].data(), n);
            std::vector<float> y(as[i]);
            axpy_of(rows[i], 0.37f, y.data(), n);
            if (l == 0) {
                dots0.push_back(d);
                axpys0.push_back(y);
                continue;
            }
            double mag = 0.0;
            for (int j = 0; j < n; j++) mag += std::fabs((double)as[i][j] * rows[i].values[j]);
            CHECK(std::fabs(d - dots0[i]) <= 1e-5 * (1.0 + mag));
            for (int j = 0; j < n; j++) REQUIRE(std::fabs(y[j] - axpys0[i][j]) <= 1e-6f * (1.0f + std::fabs(y[j])));
        }
    }
    REQUIRE(set_cpu_level(was));
}
