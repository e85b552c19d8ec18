// Each CUDA kernel of gpu/kernels.h against its CPU twin: the same inputs through both, compared
// with a tolerance per dtype (F32 ~1e-5..1e-4 relative, F16 ~1e-2, dequantization exact).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/sampling.h"
#include "cpu/thread_pool.h"
#include "gpu/cublas_loader.h"
#include "gpu/kernels.h"
#include "gpu_test_util.h"
#include "kv/fp8_e4m3.h"
#include "kv/kv_storage.h"
#include "model/ggml_types.h"
#include "model/quantize.h"
#include "model/quants.h"

using namespace steward;
using steward::test::DeviceBuf;
using steward::test::random_floats;
using steward::test::rel_err;

namespace {

// A row of n F32 values stored as type t (F32, F16, Q8_0, Q4_K).
std::vector<uint8_t> stored_as(GgmlType t, const std::vector<float>& x) {
    std::vector<uint8_t> out((size_t)ggml_row_bytes(t, (int64_t)x.size()));
    if (t == GgmlType::F32) {
        std::memcpy(out.data(), x.data(), x.size() * 4);
    } else if (t == GgmlType::F16) {
        auto* h = reinterpret_cast<uint16_t*>(out.data());
        for (size_t i = 0; i < x.size(); i++) h[i] = f32_to_f16(x[i]);
    } else {
        REQUIRE(quantize_row(t, x.data(), (int64_t)x.size(), out.data()).ok());
    }
    return out;
}

}  // namespace

TEST_CASE("gpu embed_rows gives each token's row as dequantize_row does, for F32, F16 and Q8_0 tables", "[gpu_kernels]") {
    const int n_vocab = 50, n_embd = 96;
    const std::vector<int32_t> tokens = {3, 0, 49, 3, 17};
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0}) {
        INFO(ggml_type_name((uint32_t)t));
        const auto table = stored_as(t, random_floats((size_t)n_vocab * n_embd, 7));
        const int64_t rb = ggml_row_bytes(t, n_embd);
        std::vector<float> want(tokens.size() * n_embd);
        for (size_t i = 0; i < tokens.size(); i++) dequantize_row(t, table.data() + tokens[i] * rb, want.data() + i * n_embd, n_embd);
        DeviceBuf<uint8_t> dt(table);
        DeviceBuf<int32_t> dtok(tokens);
        DeviceBuf<float> out(want.size());
        REQUIRE(gpu::embed_rows(t, dt.p, rb, dtok.p, (int)tokens.size(), n_embd, out.p, nullptr).ok());
        CHECK(out.get() == want);
    }
}

TEST_CASE("gpu rmsnorm matches the CPU's rmsnorm, in place too, for row sizes from 64 to 4096", "[gpu_kernels]") {
    for (int n : {64, 100, 256, 4096}) {
        const int rows = 7;
        INFO("n " << n);
        const auto x = random_floats((size_t)n * rows, n, -3, 3);
        const auto w = random_floats((size_t)n, n + 1, 0.5f, 1.5f);
        std::vector<float> want(x.size());
        rmsnorm(x.data(), w.data(), 1e-5f, n, rows, want.data());
        DeviceBuf<float> dx(x), dw(w), dy(x.size());
        REQUIRE(gpu::rmsnorm(dx.p, dw.p, 1e-5f, n, rows, dy.p, nullptr).ok());
        CHECK(rel_err(dy.get(), want) < 1e-5);
        REQUIRE(gpu::rmsnorm(dx.p, dw.p, 1e-5f, n, rows, dx.p, nullptr).ok());
        CHECK(rel_err(dx.get(), want) < 1e-5);
    }
}

TEST_CASE("gpu rope rotates adjacent pairs (NORM) and halves (NEOX) as cpu/forward.cpp's rope_head, over all or part of a head", "[gpu_kernels]") {
    const int n_tok = 5, n_heads = 3, hd = 64;
    const std::vector<int32_t> pos = {0, 1, 7, 7, 2047};
    for (RopeType type : {RopeType::NORM, RopeType::NEOX})
        for (int n_rot : {64, 32}) {
            INFO("neox " << (type == RopeType::NEOX) << " n_rot " << n_rot);
            auto x = random_floats((size_t)n_tok * n_heads * hd, 11);
            std::vector<float> want = x;
            const int half = n_rot / 2;
            for (int t = 0; t < n_tok; t++)
                for (int h = 0; h < n_heads; h++)
                    for (int i = 0; i < half; i++) {  // cpu/forward.cpp: tables in double, rotation in float
                        const double theta = pos[t] * std::pow(10000.0, -2.0 * i / n_rot);
                        const float cs = (float)std::cos(theta), sn = (float)std::sin(theta);
                        float* xh = want.data() + ((size_t)t * n_heads + h) * hd;
                        const int a = type == RopeType::NORM ? 2 * i : i, b = type == RopeType::NORM ? 2 * i + 1 : i + half;
                        const float x0 = xh[a], x1 = xh[b];
                        xh[a] = x0 * cs - x1 * sn;
                        xh[b] = x0 * sn + x1 * cs;
                    }
            DeviceBuf<float> dx(x);
            DeviceBuf<int32_t> dp(pos);
            REQUIRE(gpu::rope(dx.p, dp.p, n_tok, n_heads, hd, n_rot, 10000.0f, 1.0f, nullptr, type, nullptr).ok());
            CHECK(rel_err(dx.get(), want) < 1e-6);
        }
}

TEST_CASE("gpu swiglu, add_bias, add and to_f16 match the CPU's elementwise steps", "[gpu_kernels]") {
    const int n = 1000, rows = 3;
    auto g = random_floats((size_t)n * rows, 1, -6, 6);
    const auto u = random_floats((size_t)n * rows, 2);
    const auto b = random_floats((size_t)n, 3);
    std::vector<float> want = g;
    swiglu(want.data(), u.data(), (int64_t)want.size());
    DeviceBuf<float> dg(g), du(u), db(b);
    REQUIRE(gpu::swiglu(dg.p, du.p, (int64_t)g.size(), nullptr).ok());
    CHECK(rel_err(dg.get(), want) < 1e-5);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) want[(size_t)r * n + i] += b[i] + u[(size_t)r * n + i];
    REQUIRE(gpu::add_bias(dg.p, db.p, n, rows, nullptr).ok());
    REQUIRE(gpu::add(dg.p, du.p, (int64_t)g.size(), nullptr).ok());
    CHECK(rel_err(dg.get(), want) < 1e-5);
    std::vector<uint16_t> h(want.size());
    to_f16(want.data(), h.data(), (int)want.size());
    DeviceBuf<float> dw(want);
    DeviceBuf<uint16_t> dh(want.size());
    REQUIRE(gpu::to_f16(dw.p, dh.p, (int64_t)want.size(), nullptr).ok());
    CHECK(dh.get() == h);
}

TEST_CASE("gpu dequantize_to_f16 of Q8_0 and Q4_K blocks equals dequantize_row rounded to F16", "[gpu_kernels]") {
    const int64_t n = 256 * 12;
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K}) {
        INFO(ggml_type_name((uint32_t)t));
        const auto blocks = stored_as(t, random_floats((size_t)n, 5, -2, 2));
        std::vector<float> f(n);
        dequantize_row(t, blocks.data(), f.data(), n);
        std::vector<uint16_t> want(n);
        for (int64_t i = 0; i < n; i++) want[i] = f32_to_f16(f[i]);
        DeviceBuf<uint8_t> db(blocks);
        DeviceBuf<uint16_t> out((size_t)n);
        REQUIRE(gpu::dequantize_to_f16(t, db.p, n, out.p, nullptr).ok());
        CHECK(out.get() == want);
    }
    DeviceBuf<uint16_t> out(32);
    CHECK_FALSE(gpu::dequantize_to_f16(GgmlType::Q6_K, out.p, 256, out.p, nullptr).ok());
}

TEST_CASE("gpu gemm (cuBLAS) matches the CPU matmul: F32 weights to 1e-5, F16 weights to 1e-2", "[gpu_kernels]") {
    ThreadPool pool(2);
    auto api = gpu::cublas();
    INFO((api ? std::string("ok") : api.error().message));
    REQUIRE(api);
    cublasHandle_t h = nullptr;
    REQUIRE((*api)->create(&h) == CUBLAS_STATUS_SUCCESS);
    for (GgmlType t : {GgmlType::F32, GgmlType::F16})
        for (int n_tok : {1, 5, 64}) {
            const int rows = 192, cols = 320;
            INFO(ggml_type_name((uint32_t)t) << " n_tok " << n_tok);
            const auto w = stored_as(t, random_floats((size_t)rows * cols, 21));
            const auto x = random_floats((size_t)n_tok * cols, 22);
            WeightView wv{t, w.data(), cols, rows};
            std::vector<float> want((size_t)n_tok * rows);
            matmul(wv, x.data(), n_tok, want.data(), pool);
            DeviceBuf<uint8_t> dw(w);
            DeviceBuf<float> dx(x), dy(want.size());
            DeviceBuf<uint16_t> x16(x.size());
            REQUIRE(gpu::gemm(h, t, dw.p, rows, cols, dx.p, n_tok, x16.p, dy.p).ok());
            CHECK(rel_err(dy.get(), want) < (t == GgmlType::F32 ? 1e-5 : 1e-2));
        }
    (*api)->destroy(h);
}

namespace {

// A pool with random contents, and a reference attention straight from the definition (softmax of
// scaled dot products over the visible slots, GQA head h / gqa), read through a block table.
struct AttnCase {
    int n_head, n_head_kv, hd, bs;
    KvDtype dtype;
};

int kv_elem_bytes(KvDtype t) { return (int)kv_row_bytes(t, 1); }

// The host twin of the device's KV element conversions: n floats into a row of type t, and back.
void kv_store(KvDtype t, const float* x, uint8_t* p, int n) {
    for (int i = 0; i < n; i++) {
        if (t == KvDtype::F16) reinterpret_cast<uint16_t*>(p)[i] = f32_to_f16(x[i]);
        else if (t == KvDtype::BF16) reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(x[i]);
        else if (t == KvDtype::FP8_E4M3) p[i] = fp8_e4m3_from_f32(x[i]);
        else std::memcpy(p + 4 * i, x + i, 4);
    }
}
void kv_load(KvDtype t, const uint8_t* p, float* out, int n) {
    for (int i = 0; i < n; i++) {
        if (t == KvDtype::F16) out[i] = f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
        else if (t == KvDtype::BF16) out[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
        else if (t == KvDtype::FP8_E4M3) out[i] = fp8_e4m3_to_f32(p[i]);
        else std::memcpy(out + i, p + 4 * i, 4);
    }
}

}  // namespace

TEST_CASE("gpu kv_write + attention match the reference over shuffled block tables, GQA, causal and tree masks, every KV type",
          "[gpu_kernels]") {
    for (AttnCase c : {AttnCase{4, 4, 64, 16, KvDtype::F32}, AttnCase{8, 2, 64, 16, KvDtype::F32},
                       AttnCase{8, 2, 128, 8, KvDtype::F16}, AttnCase{6, 1, 32, 32, KvDtype::F16},
                       AttnCase{8, 2, 64, 16, KvDtype::BF16}, AttnCase{8, 2, 64, 16, KvDtype::FP8_E4M3}}) {
        INFO("heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.hd << " bs " << c.bs << " kv " << kv_dtype_name(c.dtype));
        const int n_blocks = 40, kvd = c.n_head_kv * c.hd, qd = c.n_head * c.hd;
        KvStorage kv({1, n_blocks, c.bs, c.n_head_kv, c.hd, c.dtype, c.dtype});
        // Three sequences: a decode step, a prefill chunk (causal), a tree of 5 under a mask.
        struct Seq { int n_past, n_new; std::vector<uint8_t> mask; };
        const std::vector<Seq> seqs = {{37, 1, {}}, {5, 20, {}},
                                       {70, 5, {1,0,0,0,0, 1,1,0,0,0, 1,0,1,0,0, 1,1,0,1,0, 1,0,1,0,1}}};
        std::vector<int32_t> blocks(n_blocks);
        std::iota(blocks.begin(), blocks.end(), 0);
        std::shuffle(blocks.begin(), blocks.end(), std::mt19937(3));
        std::vector<std::vector<int32_t>> tables;
        int next = 0, n_tok = 0;
        for (const Seq& s : seqs) {
            const int nb = (s.n_past + s.n_new + c.bs - 1) / c.bs;
            tables.emplace_back(blocks.begin() + next, blocks.begin() + next + nb);
            next += nb;
            n_tok += s.n_new;
        }
        REQUIRE(next <= n_blocks);
        // Old slots: random K/V written on the host; new tokens' K/V through kv_write.
        const auto old = random_floats((size_t)kv.bytes() / kv_elem_bytes(c.dtype), 9);
        {
            size_t at = 0;
            for (int b = 0; b < n_blocks; b++)
                for (int sl = 0; sl < c.bs; sl++)
                    for (uint8_t* p : {kv.k_slot(0, b, sl), kv.v_slot(0, b, sl)}) {
                        kv_store(c.dtype, old.data() + at, p, kvd);
                        at += kvd;
                    }
        }
        const auto knew = random_floats((size_t)n_tok * kvd, 10), vnew = random_floats((size_t)n_tok * kvd, 11);
        const auto q = random_floats((size_t)n_tok * qd, 12);
        std::vector<int32_t> slots, tok_seq, tok_i, n_past, n_new, bt_off, mask_off, bt;
        std::vector<uint8_t> mask;
        int t = 0;
        for (size_t s = 0; s < seqs.size(); s++) {
            n_past.push_back(seqs[s].n_past);
            n_new.push_back(seqs[s].n_new);
            bt_off.push_back((int)bt.size());
            bt.insert(bt.end(), tables[s].begin(), tables[s].end());
            mask_off.push_back(seqs[s].mask.empty() ? -1 : (int)mask.size());
            mask.insert(mask.end(), seqs[s].mask.begin(), seqs[s].mask.end());
            for (int i = 0; i < seqs[s].n_new; i++, t++) {
                const int slot = seqs[s].n_past + i;
                slots.push_back(tables[s][slot / c.bs] * c.bs + slot % c.bs);
                tok_seq.push_back((int)s);
                tok_i.push_back(i);
                // The host twin of the KV write (what cpu/forward.cpp does).
                uint8_t* kd = kv.k_slot(0, tables[s][slot / c.bs], slot % c.bs);
                uint8_t* vd = kv.v_slot(0, tables[s][slot / c.bs], slot % c.bs);
                kv_store(c.dtype, knew.data() + (size_t)t * kvd, kd, kvd);
                kv_store(c.dtype, vnew.data() + (size_t)t * kvd, vd, kvd);
            }
        }
        // Device: the old contents, then kv_write of the new tokens; must equal the host pool.
        KvStorage before({1, n_blocks, c.bs, c.n_head_kv, c.hd, c.dtype, c.dtype});
        {
            size_t at = 0;
            for (int b = 0; b < n_blocks; b++)
                for (int sl = 0; sl < c.bs; sl++)
                    for (uint8_t* p : {before.k_slot(0, b, sl), before.v_slot(0, b, sl)}) {
                        kv_store(c.dtype, old.data() + at, p, kvd);
                        at += kvd;
                    }
        }
        const size_t half = (size_t)kv.bytes() / 2;
        DeviceBuf<uint8_t> dk(half), dv(half);
        REQUIRE(cudaMemcpy(dk.p, before.k_slot(0, 0, 0), half, cudaMemcpyHostToDevice) == cudaSuccess);
        REQUIRE(cudaMemcpy(dv.p, before.v_slot(0, 0, 0), half, cudaMemcpyHostToDevice) == cudaSuccess);
        DeviceBuf<float> dkn(knew), dvn(vnew), dq(q), dout((size_t)n_tok * qd);
        DeviceBuf<int32_t> dslots(slots), dts(tok_seq), dti(tok_i), dnp(n_past), dnn(n_new), dbo(bt_off), dmo(mask_off), dbt(bt);
        DeviceBuf<uint8_t> dmask(mask);
        REQUIRE(gpu::kv_write(dkn.p, dvn.p, dslots.p, n_tok, kvd, c.dtype, c.dtype, dk.p, dv.p, nullptr).ok());
        const auto gk = dk.get(), gv = dv.get();
        CHECK(std::memcmp(gk.data(), kv.k_slot(0, 0, 0), half) == 0);
        CHECK(std::memcmp(gv.data(), kv.v_slot(0, 0, 0), half) == 0);

        gpu::AttnBatch ab{dts.p, dti.p, dnp.p, dnn.p, dbo.p, dmo.p, dbt.p, dmask.p, 0};
        for (const Seq& s : seqs) ab.max_slots = std::max(ab.max_slots, s.n_past + s.n_new);
        const float scale = 1.0f / std::sqrt((float)c.hd);
        REQUIRE(gpu::attention(dq.p, dk.p, dv.p, c.dtype, c.dtype, c.bs, c.n_head, c.n_head_kv, c.hd, scale, ab, n_tok, dout.p, nullptr).ok());

        std::vector<float> want((size_t)n_tok * qd, 0.0f), kf(c.hd), vf(c.hd);
        auto row = [&](const uint8_t* p, float* out) {
            kv_load(c.dtype, p, out, c.hd);
        };
        for (int tt = 0; tt < n_tok; tt++) {
            const Seq& s = seqs[tok_seq[tt]];
            const auto& tab = tables[tok_seq[tt]];
            const int i = tok_i[tt];
            for (int h = 0; h < c.n_head; h++) {
                const int g = h / (c.n_head / c.n_head_kv);
                std::vector<double> sc;
                std::vector<int> vis;
                for (int sl = 0; sl < s.n_past + s.n_new; sl++) {
                    const int j = sl - s.n_past;
                    if (sl >= s.n_past && !(s.mask.empty() ? j <= i : s.mask[(size_t)i * s.n_new + j] != 0)) continue;
                    row(kv.k_slot(0, tab[sl / c.bs], sl % c.bs) + (size_t)g * c.hd * kv_elem_bytes(c.dtype), kf.data());
                    double d = 0;
                    for (int e = 0; e < c.hd; e++) d += (double)q[((size_t)tt * c.n_head + h) * c.hd + e] * kf[e];
                    sc.push_back(d * scale);
                    vis.push_back(sl);
                }
                const double mx = *std::max_element(sc.begin(), sc.end());
                double sum = 0;
                for (double& x : sc) sum += (x = std::exp(x - mx));
                for (size_t k = 0; k < vis.size(); k++) {
                    row(kv.v_slot(0, tab[vis[k] / c.bs], vis[k] % c.bs) + (size_t)g * c.hd * kv_elem_bytes(c.dtype), vf.data());
                    for (int e = 0; e < c.hd; e++) want[((size_t)tt * c.n_head + h) * c.hd + e] += (float)(sc[k] / sum * vf[e]);
                }
            }
        }
        CHECK(rel_err(dout.get(), want) < 1e-5);
    }
}

TEST_CASE("gpu kv_copy_slots moves slots as KvStorage::copy_slots does, overlapping sources and destinations", "[gpu_kernels]") {
    const KvConfig cfg{1, 6, 4, 2, 32, KvDtype::F16, KvDtype::F16};
    KvStorage kv(cfg);
    const auto vals = random_floats((size_t)kv.bytes() / 2, 4);
    to_f16(vals.data(), reinterpret_cast<uint16_t*>(kv.k_slot(0, 0, 0)), (int)(vals.size() / 2));
    to_f16(vals.data() + vals.size() / 2, reinterpret_cast<uint16_t*>(kv.v_slot(0, 0, 0)), (int)(vals.size() / 2));
    const size_t half = (size_t)kv.bytes() / 2;
    DeviceBuf<uint8_t> dk(half), dv(half), tmp(half);
    REQUIRE(cudaMemcpy(dk.p, kv.k_slot(0, 0, 0), half, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(dv.p, kv.v_slot(0, 0, 0), half, cudaMemcpyHostToDevice) == cudaSuccess);
    const std::vector<int32_t> table = {4, 1, 5};
    const std::vector<int32_t> src = {9, 10, 5, 6}, dst = {5, 6, 7, 8};  // logical slots, overlapping
    kv.copy_slots(table, src, table, dst);
    std::vector<int32_t> ps, pd;
    for (size_t i = 0; i < src.size(); i++) {
        ps.push_back(table[src[i] / 4] * 4 + src[i] % 4);
        pd.push_back(table[dst[i] / 4] * 4 + dst[i] % 4);
    }
    DeviceBuf<int32_t> dps(ps), dpd(pd);
    REQUIRE(gpu::kv_copy_slots(dps.p, dpd.p, (int)ps.size(), 128, 128, dk.p, dv.p, tmp.p, nullptr).ok());
    const auto gk = dk.get(), gv = dv.get();
    CHECK(std::memcmp(gk.data(), kv.k_slot(0, 0, 0), half) == 0);
    CHECK(std::memcmp(gv.data(), kv.v_slot(0, 0, 0), half) == 0);
}

TEST_CASE("gpu argmax_rows and sample_top_p draw what the CPU sampler's distribution says", "[gpu_kernels]") {
    const int n_vocab = 5000, rows = 6;
    auto logits = random_floats((size_t)rows * n_vocab, 31, -4, 4);
    logits[7] = NAN;                       // NaN never wins
    logits[(size_t)1 * n_vocab + 10] = 9;  // ties at the top go to the lower id
    logits[(size_t)1 * n_vocab + 20] = 9;
    DeviceBuf<float> dl(logits);
    DeviceBuf<int32_t> out(rows);
    REQUIRE(gpu::argmax_rows(dl.p, rows, n_vocab, out.p, nullptr).ok());
    const auto am = out.get();
    for (int r = 0; r < rows; r++) {
        const std::span<const float> row(logits.data() + (size_t)r * n_vocab, n_vocab);
        CHECK(am[r] == sampling_distribution(row, SamplingParams{})[0].id);
    }
    CHECK(am[1] == 10);

    std::mt19937_64 rng(5);
    for (float temp : {0.7f, 1.0f, 1.5f})
        for (float top_p : {0.3f, 0.9f, 1.0f}) {
            INFO("temperature " << temp << " top_p " << top_p);
            std::vector<float> u(rows);
            for (float& x : u) x = std::uniform_real_distribution<float>(0.01f, 0.99f)(rng);
            DeviceBuf<float> du(u);
            REQUIRE(gpu::sample_top_p(dl.p, rows, n_vocab, temp, top_p, du.p, out.p, nullptr).ok());
            const auto got = out.get();
            for (int r = 0; r < rows; r++) {
                SamplingParams sp;
                sp.temperature = temp;
                sp.top_p = top_p;
                const auto dist = sampling_distribution(std::span<const float>(logits.data() + (size_t)r * n_vocab, n_vocab), sp);
                double cum = 0;
                int32_t want = dist.back().id;
                for (const TokenProb& tp : dist)
                    if ((cum += tp.prob) > u[r]) {
                        want = tp.id;
                        break;
                    }
                CHECK(got[r] == want);
            }
        }
}
