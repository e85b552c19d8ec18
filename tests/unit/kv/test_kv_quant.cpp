// KV cache types (kv/kv_storage.h): sizes per type, K and V in different types, the checks a
// backend makes, block export / import, and the fp8 E4M3 conversion (kv/fp8_e4m3.h) against a
// naive nearest-value search over all 256 codes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kv/fp8_e4m3.h"
#include "kv/kv_storage.h"

using namespace steward;

namespace {

// A real model's KV shape: llama-3.2-1B's (16 layers, 8 KV heads of 64).
ModelParams llama_1b() {
    ModelParams p;
    p.n_layer = 16;
    p.n_head_kv = 8;
    p.head_dim = 64;
    return p;
}

}  // namespace

TEST_CASE("KV bytes follow the K and V types", "[kv_quant][kv]") {
    const ModelParams p = llama_1b();
    auto per_tok = [&](KvDtype k, KvDtype v) { return kv_bytes_per_token(KvStorage::config_for(p, 1, 16, k, v)); };
    // 2 (K, V) x 16 layers x 8 heads x 64 = 16384 values a token
    CHECK(per_tok(KvDtype::F32, KvDtype::F32) == 16384 * 4);
    CHECK(per_tok(KvDtype::F16, KvDtype::F16) == 16384 * 2);
    CHECK(per_tok(KvDtype::BF16, KvDtype::BF16) == 16384 * 2);
    CHECK(per_tok(KvDtype::Q8_0, KvDtype::Q8_0) == 16384 / 32 * 34);
    CHECK(per_tok(KvDtype::Q4_0, KvDtype::Q4_0) == 16384 / 32 * 18);
    CHECK(per_tok(KvDtype::FP8_E4M3, KvDtype::FP8_E4M3) == 16384);
    CHECK(per_tok(KvDtype::Q8_0, KvDtype::Q4_0) == 8192 / 32 * 34 + 8192 / 32 * 18);
    // The same bytes hold 64 / 34 = 1.882x the tokens in q8_0 as in f16 (8.5 bits a value against
    // 16: 1.9x is out of reach by the format), 2.46x in q8_0 K with q4_0 V, 3.56x in q4_0.
    const int64_t budget = 1ll << 30;
    const double f16 = (double)(budget / kv_bytes(KvStorage::config_for(p, 1, 16, KvDtype::F16)));
    const double q8 = (double)(budget / kv_bytes(KvStorage::config_for(p, 1, 16, KvDtype::Q8_0)));
    const double q8q4 = (double)(budget / kv_bytes(KvStorage::config_for(p, 1, 16, KvDtype::Q8_0, KvDtype::Q4_0)));
    const double q4 = (double)(budget / kv_bytes(KvStorage::config_for(p, 1, 16, KvDtype::Q4_0)));
    INFO("blocks per GiB: f16 " << f16 << ", q8_0 " << q8 << ", q8_0/q4_0 " << q8q4 << ", q4_0 " << q4);
    CHECK(q8 / f16 >= 1.88);
    CHECK(q8q4 / f16 >= 2.46);
    CHECK(q4 / f16 >= 3.55);
    KvStorage kv(KvStorage::config_for(p, 3, 16, KvDtype::Q8_0, KvDtype::F16));
    CHECK(kv.bytes() == kv_bytes(kv.config()));
    CHECK(kv.k_slot_bytes() == 8 * 68);
    CHECK(kv.v_slot_bytes() == 8 * 128);
    CHECK(kv.k_row_bytes() == 68);
    CHECK(kv.block_payload_bytes() == 16 * 16 * (8 * 68 + 8 * 128));
}

TEST_CASE("KV block types with head dims under 32 quantize the slot row as whole blocks", "[kv_quant][kv]") {
    // TinyStories-656K: 2 layers, 4 KV heads of 16 (a slot row of 64 values: 2 blocks, 2 heads each).
    ModelParams ts;
    ts.n_layer = 2;
    ts.n_head_kv = 4;
    ts.head_dim = 16;
    // stories260K: 5 layers, 4 KV heads of 8 (a slot row of 32 values: 1 block of 4 heads).
    ModelParams st;
    st.n_layer = 5;
    st.n_head_kv = 4;
    st.head_dim = 8;
    for (KvDtype t : {KvDtype::Q8_0, KvDtype::Q4_0}) {
        CHECK(kv_dtype_fits(t, 4, 16));
        CHECK(kv_dtype_fits(t, 4, 8));
        CHECK(check_kv_types(KvStorage::config_for(ts, 1, 16, KvDtype::Q8_0, t), false).ok());
        CHECK(check_kv_types(KvStorage::config_for(st, 1, 16, KvDtype::Q8_0, t), false).ok());
    }
    KvStorage a(KvStorage::config_for(ts, 3, 16, KvDtype::Q8_0, KvDtype::Q4_0));
    CHECK(a.k_slot_bytes() == 2 * 34);
    CHECK(a.v_slot_bytes() == 2 * 18);
    CHECK_FALSE(a.k_rows_whole());
    CHECK_FALSE(a.v_rows_whole());
    CHECK(a.bytes() == kv_bytes(a.config()));
    CHECK(a.bytes() == 2 * 3 * 16 * (68 + 36));
    CHECK(kv_bytes_per_token(a.config()) == 2 * (68 + 36));
    CHECK(a.block_payload_bytes() == 2 * 16 * (68 + 36));
    KvStorage b(KvStorage::config_for(st, 2, 16, KvDtype::Q8_0));
    CHECK(b.k_slot_bytes() == 34);
    CHECK(b.v_slot_bytes() == 34);
    CHECK(b.bytes() == 5 * 2 * 16 * 68);
    CHECK(kv_bytes_per_token(b.config()) == 5 * 68);
    // Against f16: 34 bytes for 32 values instead of 64, as with whole head rows.
    CHECK(kv_bytes_per_token(KvStorage::config_for(st, 1, 16, KvDtype::F16)) == 5 * 2 * 64);
    // Rows that are whole blocks keep their byte offsets; the one-value types always do.
    KvStorage c(KvStorage::config_for(llama_1b(), 1, 16, KvDtype::Q4_0, KvDtype::F16));
    CHECK(c.k_rows_whole());
    CHECK(c.k_row_bytes() == 2 * 18);
    KvStorage d(KvStorage::config_for(ts, 1, 16, KvDtype::F16, KvDtype::BF16));
    CHECK(d.k_rows_whole());
    CHECK(d.v_row_bytes() == 32);
}

TEST_CASE("KV block types refuse a head dim that fits no whole blocks", "[kv_quant][kv]") {
    struct Shape {
        int n_head_kv, head_dim;
    };
    // 24 and 48 do not divide 32 nor are multiples of it; 16 x 1 and 8 x 2 head rows fill no
    // whole block (a slot row of 16 values).
    for (Shape sh : {Shape{8, 24}, Shape{4, 48}, Shape{1, 16}, Shape{2, 8}, Shape{3, 8}, Shape{8, 12}}) {
        ModelParams p = llama_1b();
        p.n_head_kv = sh.n_head_kv;
        p.head_dim = sh.head_dim;
        for (KvDtype t : {KvDtype::Q8_0, KvDtype::Q4_0}) {
            INFO(kv_dtype_name(t) << " " << sh.n_head_kv << " KV heads of " << sh.head_dim);
            CHECK_FALSE(kv_dtype_fits(t, sh.n_head_kv, sh.head_dim));
            auto r = check_kv_types(KvStorage::config_for(p, 1, 16, KvDtype::F16, t), false);
            REQUIRE_FALSE(r.ok());
            CHECK_THAT(r.error().message, Catch::Contains("head dim is " + std::to_string(sh.head_dim)));
            CHECK_THAT(r.error().message, Catch::Contains(std::to_string(sh.n_head_kv) + " KV heads"));
            CHECK_THAT(r.error().message, Catch::Contains("head dim % 32 == 0"));
            CHECK_THAT(r.error().message, Catch::Contains("(KV heads x head dim) % 32 == 0"));
            CHECK_THAT(r.error().message, Catch::Contains("use f16 or bf16"));
        }
        CHECK(check_kv_types(KvStorage::config_for(p, 1, 16, KvDtype::BF16), false).ok());
    }
    auto fp8 = check_kv_types(KvStorage::config_for(llama_1b(), 1, 16, KvDtype::FP8_E4M3), false);
    REQUIRE_FALSE(fp8.ok());
    CHECK_THAT(fp8.error().message, Catch::Contains("CUDA backend only"));
    CHECK(check_kv_types(KvStorage::config_for(llama_1b(), 1, 16, KvDtype::FP8_E4M3), true).ok());
    CHECK_FALSE(check_kv_types(KvStorage::config_for(llama_1b(), 1, 16, KvDtype::Q8_0), true).ok());
    CHECK(parse_kv_dtype("Q8_0") == KvDtype::Q8_0);
    CHECK(parse_kv_dtype("fp8_e4m3") == KvDtype::FP8_E4M3);
    CHECK_FALSE(parse_kv_dtype("q4_1"));
}

TEST_CASE("KV export and import of a block round trip its bytes", "[kv_quant][kv]") {
    ModelParams p;
    p.n_layer = 3;
    p.n_head_kv = 2;
    p.head_dim = 32;
    KvStorage a(KvStorage::config_for(p, 4, 8, KvDtype::Q8_0, KvDtype::Q4_0));
    KvStorage b(a.config());
    std::mt19937_64 rng(3);
    for (int l = 0; l < 3; l++)
        for (int blk = 0; blk < 4; blk++)
            for (int s = 0; s < 8; s++) {
                for (int64_t i = 0; i < a.k_slot_bytes(); i++) a.k_slot(l, blk, s)[i] = (uint8_t)rng();
                for (int64_t i = 0; i < a.v_slot_bytes(); i++) a.v_slot(l, blk, s)[i] = (uint8_t)rng();
            }
    std::vector<uint8_t> buf((size_t)a.block_payload_bytes());
    a.export_block(2, buf.data());
    // The layout: per layer, the block's K then its V.
    CHECK(std::memcmp(buf.data(), a.k_slot(0, 2, 0), (size_t)(8 * a.k_slot_bytes())) == 0);
    CHECK(std::memcmp(buf.data() + 8 * a.k_slot_bytes(), a.v_slot(0, 2, 0), (size_t)(8 * a.v_slot_bytes())) == 0);
    b.import_block(1, buf.data());
    for (int l = 0; l < 3; l++) {
        CHECK(std::memcmp(b.k_slot(l, 1, 0), a.k_slot(l, 2, 0), (size_t)(8 * a.k_slot_bytes())) == 0);
        CHECK(std::memcmp(b.v_slot(l, 1, 0), a.v_slot(l, 2, 0), (size_t)(8 * a.v_slot_bytes())) == 0);
        CHECK(b.k_slot(l, 0, 0)[0] == 0);  // the other blocks untouched
    }
}

TEST_CASE("fp8 e4m3 decodes every code and round trips it", "[kv_quant][fp8]") {
    int n_nan = 0;
    for (int c = 0; c < 256; c++) {
        const float v = fp8_e4m3_to_f32((uint8_t)c);
        if (std::isnan(v)) {
            n_nan++;
            CHECK((c & 0x7f) == 0x7f);
            continue;
        }
        CHECK(fp8_e4m3_from_f32(v) == (uint8_t)c);
    }
    CHECK(n_nan == 2);
    CHECK(fp8_e4m3_to_f32(0x7e) == 448.0f);
    CHECK(fp8_e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
    CHECK(fp8_e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));
    CHECK(fp8_e4m3_from_f32(1e9f) == 0x7e);
    CHECK(fp8_e4m3_from_f32(-std::numeric_limits<float>::infinity()) == 0xfe);
    CHECK(fp8_e4m3_to_f32(fp8_e4m3_from_f32(std::nanf(""))) != fp8_e4m3_to_f32(fp8_e4m3_from_f32(std::nanf(""))));
}

TEST_CASE("fp8 e4m3 encodes to the nearest value, ties to even, saturating", "[kv_quant][fp8]") {
    // The naive reference: every finite code's value, the nearest one (ties: the even code).
    std::vector<std::pair<double, int>> finite;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f) finite.push_back({(double)fp8_e4m3_to_f32((uint8_t)c), c});
    auto nearest = [&](float x) {
        if (std::fabs(x) >= 448.0f) return x > 0 ? 448.0 : -448.0;
        double best = 0.0, dist = INFINITY;
        int code = -1;
        for (auto [v, c] : finite) {
            if (std::signbit(v) != std::signbit(x) && v != 0.0) continue;
            const double d = std::fabs(v - (double)x);
            if (d < dist || (d == dist && (c & 1) == 0 && (code & 1) == 1)) best = v, dist = d, code = c;
        }
        return best;
    };
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> wide(-500.0f, 500.0f), narrow(-0.05f, 0.05f), unit(-2.0f, 2.0f);
    int n = 0;
    for (int i = 0; i < 20000; i++)
        for (float x : {wide(rng), narrow(rng), unit(rng)}) {
            INFO("x = " << x);
            REQUIRE((double)fp8_e4m3_to_f32(fp8_e4m3_from_f32(x)) == nearest(x));
            n++;
        }
    // Exact midpoints between neighbours go to the even code.
    for (int c = 0; c < 0x7d; c++) {
        const float mid = (fp8_e4m3_to_f32((uint8_t)c) + fp8_e4m3_to_f32((uint8_t)(c + 1))) / 2;
        const int got = fp8_e4m3_from_f32(mid);
        CHECK(got == ((c & 1) == 0 ? c : c + 1));
    }
    CHECK(n == 60000);
}
