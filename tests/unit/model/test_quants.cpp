// The reference dequantizers (model/quants.h): one hand-made block per type, worked out by hand
// from ggml's layouts, and every tensor of llama-quantize's files against ggml's own values.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/quants.h"

using namespace steward;

namespace {

constexpr uint16_t kHalfOne = 0x3C00;   // 1.0 as fp16
constexpr uint16_t kHalfHalf = 0x3800;  // 0.5 as fp16

template <typename Block>
std::vector<float> deq(GgmlType t, const Block& b) {
    std::vector<float> out((size_t)quant_block_elems(t));
    auto r = dequantize_row(t, &b, (int64_t)out.size(), out.data());
    REQUIRE(r.ok());
    return out;
}

}  // namespace

TEST_CASE("a hand-made block of each legacy 32-wide type dequantizes to the hand-worked values", "[quants]") {
    SECTION("Q4_0: d * (nibble - 8), low nibbles first") {
        BlockQ4_0 b{};
        b.d = kHalfHalf;
        b.qs[0] = 0x1F;
        b.qs[3] = 0x80;
        auto y = deq(ggml_id::Q4_0, b);
        CHECK(y[0] == 3.5f);
        CHECK(y[16] == -3.5f);
        CHECK(y[3] == -4.0f);
        CHECK(y[19] == 0.0f);
        CHECK(y[1] == -4.0f);
    }
    SECTION("Q4_1: d * nibble + m") {
        BlockQ4_1 b{};
        b.d = kHalfHalf;
        b.m = kHalfOne;
        b.qs[0] = 0x1F;
        auto y = deq(ggml_id::Q4_1, b);
        CHECK(y[0] == 8.5f);
        CHECK(y[16] == 1.5f);
        CHECK(y[1] == 1.0f);
    }
    SECTION("Q5_0: the 5th bit of element j is bit j of qh") {
        BlockQ5_0 b{};
        b.d = kHalfHalf;
        b.qh[0] = 0x03;  // elements 0 and 1
        b.qh[2] = 0x01;  // element 16
        b.qs[0] = 0x1F;
        auto y = deq(ggml_id::Q5_0, b);
        CHECK(y[0] == 7.5f);   // (15 | 16) - 16 = 15
        CHECK(y[16] == 0.5f);  // (1 | 16) - 16 = 1
        CHECK(y[1] == 0.0f);   // (0 | 16) - 16
        CHECK(y[17] == -8.0f);
    }
    SECTION("Q5_1: d * (5-bit code) + m") {
        BlockQ5_1 b{};
        b.d = kHalfHalf;
        b.m = kHalfOne;
        b.qh[0] = 0x01;
        b.qh[2] = 0x01;
        b.qs[0] = 0x1F;
        auto y = deq(ggml_id::Q5_1, b);
        CHECK(y[0] == 16.5f);
        CHECK(y[16] == 9.5f);
        CHECK(y[17] == 1.0f);
    }
    SECTION("Q8_0: d * signed byte") {
        BlockQ8_0 b{};
        b.d = kHalfHalf;
        b.qs[5] = -7;
        auto y = deq(ggml_id::Q8_0, b);
        CHECK(y[5] == -3.5f);
        CHECK(y[0] == 0.0f);
    }
    SECTION("IQ4_NL: d * kvalues_iq4nl[nibble]") {
        BlockIq4Nl b{};
        b.d = kHalfHalf;
        b.qs[0] = 0x0F;
        auto y = deq(ggml_id::IQ4_NL, b);
        CHECK(y[0] == 56.5f);    // 113 / 2
        CHECK(y[16] == -63.5f);  // -127 / 2
        CHECK(y[1] == -63.5f);
    }
    SECTION("MXFP4: 2^(e - 127) times the E2M1 value of each nibble (OCP MX)") {
        BlockMxfp4 b{};
        b.e = 127;        // 2^0
        b.qs[0] = 0x97;   // low nibble 0111: +1.1 x 2^2 = 6; high nibble 1001: -0.1 x 2^0 (subnormal) = -0.5
        b.qs[1] = 0x0B;   // 1011: -1.1 x 2^0 = -1.5
        b.qs[2] = 0x04;   // 0100: +1.0 x 2^1 = 2
        auto y = deq(ggml_id::MXFP4, b);
        CHECK(y[0] == 6.0f);
        CHECK(y[16] == -0.5f);
        CHECK(y[1] == -1.5f);
        CHECK(y[2] == 2.0f);
        CHECK(y[3] == 0.0f);
        b.e = 120;  // 2^-7
        y = deq(ggml_id::MXFP4, b);
        CHECK(y[0] == 6.0f / 128.0f);
        b.e = 0;  // 2^-127: a subnormal scale
        y = deq(ggml_id::MXFP4, b);
        CHECK(y[0] == std::ldexp(6.0f, -127));
    }
}

TEST_CASE("a hand-made super-block of each 256-wide type dequantizes to the hand-worked values", "[quants]") {
    SECTION("Q2_K: 4-bit scale / min pairs, 2-bit codes four to a byte") {
        BlockQ2_K b{};
        b.d = kHalfOne;
        b.dmin = kHalfHalf;
        b.scales[0] = 0x23;  // sub-block 0: scale 3, min 2
        b.scales[1] = 0x11;
        b.scales[2] = 0x01;
        b.scales[6] = 0x42;
        b.scales[9] = 0x05;
        b.qs[0] = 0xE4;   // codes 0, 1, 2, 3 for elements 0, 32, 64, 96
        b.qs[16] = 0x03;  // element 16
        b.qs[48] = 0x02;  // element 144 (second half, bytes 16-31 at shift 0)
        auto y = deq(ggml_id::Q2_K, b);
        CHECK(y[0] == -1.0f);  // 3 * 0 - 0.5 * 2
        CHECK(y[32] == 1.0f);
        CHECK(y[96] == 4.0f);  // 2 * 3 - 0.5 * 4
        CHECK(y[16] == 2.5f);
        CHECK(y[144] == 10.0f);
    }
    SECTION("Q3_K: 6-bit scales minus 32, hmask clear means code - 4") {
        BlockQ3_K b{};
        b.d = kHalfOne;
        b.scales[0] = 0x01;  // sub-block 0: low 4 bits 1
        b.scales[8] = 0x02;  // ... high 2 bits 2: 33 - 32 = +1
        b.scales[5] = 0xE0;  // sub-block 13: low bits 14 (high nibble of byte 5)
        b.scales[9] = 0x40;  // ... high bits 1 (bits 6-7 of byte 9): 30 - 32 = -2
        b.qs[0] = 0x03;
        b.hmask[0] = 0x01;
        b.qs[1] = 0x01;
        b.qs[48] = 0x20;     // element 208: second half, bytes 16-31, shift 4
        b.hmask[16] = 0x40;  // its high bit: bit 4 + 2
        auto y = deq(ggml_id::Q3_K, b);
        CHECK(y[0] == 3.0f);
        CHECK(y[1] == -3.0f);  // 1 - 4
        CHECK(y[208] == -4.0f);
        CHECK(y[209] == 8.0f);  // -2 * (0 - 4)
        CHECK(y[2] == -4.0f);    // 1 * (0 - 4)
        CHECK(y[16] == 128.0f);  // sub-block 1, scale bytes 0: -32 * (0 - 4)
    }
    SECTION("Q4_K and Q5_K: 6-bit packed scales and mins, 5th bit from qh") {
        BlockQ4_K b{};
        b.d = kHalfOne;
        b.dmin = kHalfHalf;
        b.scales[0] = 2;     // sub-block 0 scale
        b.scales[4] = 4;     // sub-block 0 min
        b.scales[9] = 0x31;  // sub-block 5: scale low 1, min low 3
        b.scales[1] = 0x40;  // sub-block 5 scale high bits 1 (sub-block 1 keeps scale 0)
        b.scales[5] = 0x80;  // sub-block 5 min high bits 2 (sub-block 1 keeps min 0)
        b.qs[0] = 0x57;
        b.qs[64] = 0xA0;
        auto y = deq(ggml_id::Q4_K, b);
        CHECK(y[0] == 12.0f);      // 2 * 7 - 0.5 * 4
        CHECK(y[32] == 0.0f);      // sub-block 1: scale 0, min 0
        CHECK(y[160] == 152.5f);   // 17 * 10 - 0.5 * 35
        BlockQ5_K c{};
        c.d = b.d;
        c.dmin = b.dmin;
        std::memcpy(c.scales, b.scales, 12);
        std::memcpy(c.qs, b.qs, sizeof c.qs);
        c.qh[0] = 0x21;  // 5th bit of element 0 of sub-blocks 0 and 5
        auto z = deq(ggml_id::Q5_K, c);
        CHECK(z[0] == 44.0f);     // 2 * (7 + 16) - 2
        CHECK(z[160] == 424.5f);  // 17 * (10 + 16) - 17.5
        CHECK(z[32] == 0.0f);
    }
    SECTION("Q6_K: 4 low bits from ql, 2 high bits from qh, minus 32, signed scales") {
        BlockQ6_K b{};
        b.d = kHalfHalf;
        b.scales[0] = 2;
        b.scales[7] = -3;
        b.ql[0] = 0x05;
        b.qh[0] = 0x02;
        b.ql[48] = 0x30;  // element 112: high nibble of ql[16 + 32], qh[16] bits 6-7, scale 7
        auto y = deq(ggml_id::Q6_K, b);
        CHECK(y[0] == 5.0f);      // 0.5 * 2 * (37 - 32)
        CHECK(y[112] == 43.5f);   // 0.5 * -3 * (3 - 32)
        CHECK(y[1] == -32.0f);    // 0.5 * 2 * -32
    }
    SECTION("IQ4_XS: 6-bit scales from scales_l / scales_h minus 32, non-linear levels") {
        BlockIq4Xs b{};
        b.d = kHalfHalf;
        b.scales_l[1] = 0x20;  // sub-block 3 low bits 2
        b.scales_h = 0x0080;   // sub-block 3 high bits 2: 34 - 32 = +2
        b.qs[48] = 0xF0;
        b.qs[0] = 0x08;
        auto y = deq(ggml_id::IQ4_XS, b);
        CHECK(y[96] == -127.0f);  // 0.5 * 2 * -127
        CHECK(y[112] == 113.0f);
        CHECK(y[0] == -16.0f);    // 0.5 * -32 * 1
    }
}

TEST_CASE("dequantize_row refuses an unknown type and a length that is not whole blocks", "[quants]") {
    float out[256];
    uint8_t blocks[256] = {};
    auto a = dequantize_row(GgmlType(15), blocks, 256, out);  // Q8_K: not a weight type
    REQUIRE_FALSE(a.ok());
    CHECK_THAT(a.error().message, Catch::Contains("Q8_K") && Catch::Contains("IQ4_XS"));
    CHECK_FALSE(dequant_supported(GgmlType(15)));
    auto b = dequantize_row(ggml_id::Q4_K, blocks, 100, out);
    REQUIRE_FALSE(b.ok());
    CHECK_THAT(b.error().message, Catch::Contains("100") && Catch::Contains("256"));
}

TEST_CASE("every tensor of llama-quantize's files dequantizes to ggml's own values", "[quants][testdata]") {
    const std::filesystem::path dir = std::filesystem::path(STEWARD_TESTDATA_DIR) / "quant";
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().extension() == ".gguf") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() >= 13);
    std::map<std::string, int> checked_by_type;  // ggml type name -> tensors checked
    for (const auto& path : files) {
        INFO("file " << path.filename().string());
        // The loader itself reads the header: it must take every type llama-quantize writes.
        auto gf = GgufFile::open(path.string());
        INFO("open: " << (gf.ok() ? std::string("ok") : gf.error().message));
        REQUIRE(gf.ok());
        const GgufFile& g = **gf;
        auto deq_path = path;
        deq_path.replace_extension(".deq.jsonl");
        std::ifstream jf(deq_path);
        REQUIRE(jf);
        std::string line;
        int n_lines = 0;
        while (std::getline(jf, line)) {
            if (line.empty()) continue;
            n_lines++;
            const auto j = nlohmann::json::parse(line);
            const std::string name = j.at("name");
            const std::string type_name = j.at("type");
            INFO("tensor " << name << " (" << type_name << ")");
            const GgufTensorInfo* ti = g.find_tensor(name);
            REQUIRE(ti);
            const GgmlType type = ti->type;
            const int64_t n_elems = ti->n_elements();
            REQUIRE(dequant_supported(type));
            CHECK(ti->n_bytes == (uint64_t)(n_elems / quant_block_elems(type)) * quant_block_bytes(type));
            std::vector<float> y((size_t)n_elems);
            auto r = dequantize_row(type, ti->data, n_elems, y.data());
            REQUIRE(r.ok());
            int n_bad = 0;
            for (const auto& s : j.at("samples")) {
                const int64_t idx = s.at(0);
                const float want = (float)s.at(1).get<double>();
                REQUIRE(idx < n_elems);
                if (y[(size_t)idx] != want && n_bad++ < 4) {
                    FAIL_CHECK("element " << idx << ": got " << y[(size_t)idx] << ", ggml has " << want);
                }
            }
            CHECK(n_bad == 0);
            double sum = 0, sumsq = 0;
            for (float v : y) {
                sum += v;
                sumsq += (double)v * v;
            }
            const double want_sum = j.at("sum"), want_sumsq = j.at("sumsq");
            // Both sums run in double over the same flat order; ggml's are printed to 9 digits.
            CHECK(std::fabs(sum - want_sum) <= 1e-6 * std::fabs(want_sum));
            CHECK(std::fabs(sumsq - want_sumsq) <= 1e-6 * want_sumsq);
            checked_by_type[type_name]++;
        }
        CHECK(n_lines == (int)g.tensors().size());
    }
    for (const char* t : {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
                          "iq4_nl", "iq4_xs"}) {
        INFO("type " << t);
        CHECK(checked_by_type[t] > 0);
    }
}
