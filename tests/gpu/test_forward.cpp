// GpuForward against CpuForward (the readable reference): the same synthetic models, the same
// batches (prefill of several sequences over shuffled block tables, decode steps, a tree verified
// under a mask with shared positions, rollback), logits compared per weight type: F32 to 1e-4
// relative, F16 / Q8_0 / Q4_K (dequantized to F16, F16 activations in the GEMMs) to 2e-2; the KV
// both wrote compared too; greedy tokens on the device equal the CPU logits' argmax.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "cpu/kernels.h"
#include "cpu/quant_dot.h"
#include "gpu/forward.h"
#include "gpu_test_util.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"

using namespace steward;
using steward::test::rel_err;

namespace {

std::unique_ptr<Model> make_model(const SynthSpec& spec) {
    auto writer = synth_model(spec);
    REQUIRE(writer.ok());
    auto file = GgufFile::from_bytes(writer->to_bytes());
    REQUIRE(file.ok());
    auto model = Model::from_gguf(std::move(file.value()));
    REQUIRE(model.ok());
    return std::move(model.value());
}

struct Shape {
    std::string name;
    SynthSpec spec;
    KvDtype kv;
    double tol;
};

std::vector<Shape> shapes() {
    std::vector<Shape> v;
    SynthSpec s;
    s.n_embd = 128, s.n_layer = 2, s.n_head = 4, s.n_head_kv = 4, s.n_ff = 256, s.n_vocab = 512;
    v.push_back({"llama F32, MHA", s, KvDtype::F32, 1e-4});
    s.n_head = 8, s.n_head_kv = 2;
    v.push_back({"llama F32, GQA 4", s, KvDtype::F32, 1e-4});
    SynthSpec q2 = s;
    q2.arch = "qwen2";
    v.push_back({"qwen2 F32 (NeoX, biases), GQA, F16 KV", q2, KvDtype::F16, 5e-3});
    SynthSpec q3 = s;
    q3.arch = "qwen3", q3.head_dim = 32;
    v.push_back({"qwen3 F32 (head norms, head_dim 32)", q3, KvDtype::F32, 1e-4});
    SynthSpec h = s;
    h.dtype = GgmlType::F16;
    v.push_back({"llama F16, GQA", h, KvDtype::F16, 2e-2});
    SynthSpec q8 = s;
    q8.dtype = GgmlType::Q8_0;
    v.push_back({"llama Q8_0, GQA", q8, KvDtype::F16, 2e-2});
    SynthSpec q4 = s;
    q4.n_embd = 256, q4.n_ff = 512, q4.dtype = GgmlType::Q4_K;
    v.push_back({"llama Q4_K, GQA", q4, KvDtype::F16, 2e-2});
    return v;
}

// Both backends on one batch; logits compared, then the KV both hold.
void run_both(CpuForward& cpu, KvStorage& ckv, GpuForward& gpu, GpuKv& gkv, const std::vector<SeqInput>& batch, double tol) {
    std::vector<float> want, got;
    auto c = cpu.forward(ckv, batch, want);
    REQUIRE(c.ok());
    auto g = gpu.forward(gkv, batch, got);
    INFO((g.ok() ? std::string("ok") : g.error().message));
    REQUIRE(g.ok());
    REQUIRE(got.size() == want.size());
    CHECK(rel_err(got, want) < tol);
}

}  // namespace

TEST_CASE("GpuForward gives the CPU forward's logits: prefill over shuffled blocks, decode, a masked tree, rollback",
          "[gpu_forward]") {
    ExactQuantScope exact;  // the CPU reference dequantizes rather than quantizing activations
    for (const Shape& sh : shapes()) {
        INFO(sh.name);
        auto model = make_model(sh.spec);
        const ModelParams& p = model->params();
        CpuForward cpu(*model, 2, 256);
        auto gpu = GpuForward::create(*model, 256);
        INFO((gpu.ok() ? std::string("ok") : gpu.error().message));
        REQUIRE(gpu.ok());
        const int bs = 8, n_blocks = 48;
        const KvConfig kc = KvStorage::config_for(p, n_blocks, bs, sh.kv);
        KvStorage ckv(kc);
        auto gkv = GpuKv::create(kc);
        REQUIRE(gkv.ok());

        std::vector<int32_t> blocks(n_blocks);
        std::iota(blocks.begin(), blocks.end(), 0);
        std::shuffle(blocks.begin(), blocks.end(), std::mt19937(11));
        const std::vector<int32_t> t0(blocks.begin(), blocks.begin() + 12), t1(blocks.begin() + 12, blocks.begin() + 24),
            t2(blocks.begin() + 24, blocks.begin() + 36);
        std::mt19937 rng(2);
        auto toks = [&](int n) {
            std::vector<int32_t> v(n);
            for (int32_t& x : v) x = (int32_t)(rng() % p.n_vocab);
            return v;
        };
        // Prefill: three sequences of 19, 3 and 33 tokens, one asking for all logits.
        const auto a = toks(19), b = toks(3), c = toks(33);
        std::vector<SeqInput> pre(3);
        pre[0].tokens = a, pre[0].block_table = t0;
        pre[1].tokens = b, pre[1].block_table = t1, pre[1].logits = LogitsMode::ALL;
        pre[2].tokens = c, pre[2].block_table = t2;
        run_both(cpu, ckv, **gpu, **gkv, pre, sh.tol);
        // Decode: one token each, three steps.
        int np[3] = {19, 3, 33};
        for (int step = 0; step < 3; step++) {
            const auto d = toks(3);
            std::vector<SeqInput> dec(3);
            const std::vector<int32_t>* tabs[3] = {&t0, &t1, &t2};
            for (int s = 0; s < 3; s++) {
                dec[s].n_past = np[s]++;
                dec[s].tokens = std::span<const int32_t>(d.data() + s, 1);
                dec[s].block_table = *tabs[s];
            }
            run_both(cpu, ckv, **gpu, **gkv, dec, sh.tol);
        }
        // A tree of 5 on sequence 0 (siblings share positions), all logits, then a rollback of
        // sequence 2 by 4 slots and a chunk of 10 over them.
        const auto tree = toks(5);
        const std::vector<int32_t> pos = {np[0], np[0] + 1, np[0] + 1, np[0] + 2, np[0] + 2};
        const std::vector<uint8_t> mask = {1,0,0,0,0, 1,1,0,0,0, 1,0,1,0,0, 1,1,0,1,0, 1,0,1,0,1};
        const auto chunk = toks(10);
        std::vector<SeqInput> ver(2);
        ver[0].n_past = np[0], ver[0].tokens = tree, ver[0].positions = pos, ver[0].mask = mask;
        ver[0].block_table = t0, ver[0].logits = LogitsMode::ALL;
        ver[1].n_past = np[2] - 4, ver[1].tokens = chunk, ver[1].block_table = t2;
        run_both(cpu, ckv, **gpu, **gkv, ver, sh.tol);

        // The KV the GPU wrote is the CPU's (same slots; values to the tolerance).
        KvStorage back(kc);
        REQUIRE((*gkv)->download(back).ok());
        const int n = (int)(ckv.k_slot_bytes() / kv_row_bytes(sh.kv, 1) * kc.n_layer * kc.n_blocks * kc.block_size);
        std::vector<float> kc32(n), kg32(n);
        if (sh.kv == KvDtype::F16) {
            from_f16(reinterpret_cast<const uint16_t*>(ckv.k_slot(0, 0, 0)), kc32.data(), n);
            from_f16(reinterpret_cast<const uint16_t*>(back.k_slot(0, 0, 0)), kg32.data(), n);
        } else {
            std::memcpy(kc32.data(), ckv.k_slot(0, 0, 0), (size_t)n * 4);
            std::memcpy(kg32.data(), back.k_slot(0, 0, 0), (size_t)n * 4);
        }
        CHECK(rel_err(kg32, kc32) < std::max(sh.tol, 1e-3));

        // Greedy on the device: the argmax of the CPU's logits (where the top two are apart).
        const auto d = toks(1);
        std::vector<SeqInput> g1(1);
        g1[0].n_past = np[1], g1[0].tokens = d, g1[0].block_table = t1;
        std::vector<float> want;
        REQUIRE(cpu.forward(ckv, g1, want).ok());
        std::vector<int32_t> got;
        REQUIRE((*gpu)->forward_greedy(**gkv, g1, got).ok());
        REQUIRE(got.size() == 1);
        std::vector<float> sorted = want;
        std::sort(sorted.rbegin(), sorted.rend());
        if (sorted[0] - sorted[1] > 0.05f * std::fabs(sorted[0]))
            CHECK(got[0] == (int32_t)(std::max_element(want.begin(), want.end()) - want.begin()));
    }
}

TEST_CASE("GpuForward refuses what CpuForward refuses, naming the value, and leaves the KV untouched", "[gpu_forward]") {
    SynthSpec s;
    s.n_embd = 64, s.n_layer = 1, s.n_head = 2, s.n_head_kv = 2, s.n_ff = 128, s.n_vocab = 400;
    auto model = make_model(s);
    auto gpu = GpuForward::create(*model, 16);
    REQUIRE(gpu.ok());
    const KvConfig kc = KvStorage::config_for(model->params(), 4, 8, KvDtype::F32);
    auto gkv = GpuKv::create(kc);
    REQUIRE(gkv.ok());
    const std::vector<int32_t> bad_tok = {1, 400}, ok_tok = {1, 2}, many(17, 1), table = {0, 1, 2};
    std::vector<float> logits;
    std::vector<SeqInput> b(1);
    b[0].tokens = bad_tok, b[0].block_table = table;
    auto r = (*gpu)->forward(**gkv, b, logits);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("token id 400") != std::string::npos);
    b[0].tokens = many;
    r = (*gpu)->forward(**gkv, b, logits);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("exceeds") != std::string::npos);
    const std::vector<int32_t> out_of_pool = {9};
    b[0].tokens = ok_tok, b[0].block_table = out_of_pool;
    r = (*gpu)->forward(**gkv, b, logits);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("block id 9") != std::string::npos);
    KvStorage back(kc);
    REQUIRE((*gkv)->download(back).ok());
    const auto* k = back.k_slot(0, 0, 0);
    CHECK(std::all_of(k, k + back.bytes() / 2, [](uint8_t x) { return x == 0; }));
}

TEST_CASE("GpuKv::copy_slots compacts a path as KvStorage::copy_slots does", "[gpu_forward]") {
    const KvConfig kc{2, 5, 4, 2, 16, KvDtype::F32, KvDtype::F32};
    KvStorage kv(kc);
    const auto vals = steward::test::random_floats((size_t)kv.bytes() / 4, 8);
    std::memcpy(kv.k_slot(0, 0, 0), vals.data(), (size_t)kv.bytes() / 2);
    std::memcpy(kv.v_slot(0, 0, 0), vals.data() + vals.size() / 2, (size_t)kv.bytes() / 2);
    auto gkv = GpuKv::create(kc);
    REQUIRE(gkv.ok());
    REQUIRE((*gkv)->upload(kv).ok());
    const std::vector<int32_t> table = {3, 0, 4}, src = {6, 8, 11}, dst = {5, 6, 7};
    kv.copy_slots(table, src, table, dst);
    REQUIRE((*gkv)->copy_slots(table, src, table, dst).ok());
    KvStorage back(kc);
    REQUIRE((*gkv)->download(back).ok());
    CHECK(std::memcmp(back.k_slot(0, 0, 0), kv.k_slot(0, 0, 0), (size_t)kv.bytes() / 2) == 0);
    CHECK(std::memcmp(back.v_slot(0, 0, 0), kv.v_slot(0, 0, 0), (size_t)kv.bytes() / 2) == 0);
}

TEST_CASE("a forward sharing a full forward's weights (a self-draft) gives the CPU self-draft's logits and keeps them after the full one is gone",
          "[gpu_forward]") {
    SynthSpec s;
    s.n_embd = 128, s.n_layer = 4, s.n_head = 8, s.n_head_kv = 2, s.n_ff = 256, s.n_vocab = 512;
    auto model = make_model(s);
    const ModelParams& p = model->params();
    auto full = GpuForward::create(*model, 64);
    REQUIRE(full.ok());
    auto shared = GpuForward::create_sharing(**full, 32, 2);
    REQUIRE(shared.ok());
    CHECK((*shared)->n_layers() == 2);
    CHECK((*shared)->weight_bytes() == 0);
    CHECK(!GpuForward::create_sharing(**shared, 32, 3).ok());  // it holds only 2 layers
    full->reset();  // the shared weights outlive the forward that uploaded them
    CpuForward cpu(*model, 2, 32, 2);
    KvConfig kc = KvStorage::config_for(p, 8, 8, KvDtype::F32);
    kc.n_layer = 2;
    KvStorage ckv(kc);
    auto gkv = GpuKv::create(kc);
    REQUIRE(gkv.ok());
    std::vector<int32_t> toks(21), table = {5, 2, 7};
    for (int i = 0; i < 21; i++) toks[i] = (i * 37 + 3) % p.n_vocab;
    std::vector<SeqInput> b(1);
    b[0].tokens = toks, b[0].block_table = table, b[0].logits = LogitsMode::ALL;
    run_both(cpu, ckv, **shared, **gkv, b, 1e-4);
}

TEST_CASE("decode through CUDA graphs gives the plain launches' logits and the CPU's, as batches change size, sequences cross a slot bucket and pools change",
          "[gpu_forward]") {
    ExactQuantScope exact;
    for (const Shape& sh : shapes()) {
        if (sh.name != "llama F32, GQA 4" && sh.name != "llama F16, GQA") continue;
        INFO(sh.name);
        auto model = make_model(sh.spec);
        const ModelParams& p = model->params();
        CpuForward cpu(*model, 2, 256);
        auto graphed = GpuForward::create(*model, 256);
        auto plain = GpuForward::create(*model, 256);
        REQUIRE(graphed.ok());
        REQUIRE(plain.ok());
        (*plain)->set_max_graphs(0);
        const int bs = 16, n_blocks = 64;
        const KvConfig kc = KvStorage::config_for(p, n_blocks, bs, sh.kv);
        KvStorage ckv(kc);
        auto gkv = GpuKv::create(kc), pkv = GpuKv::create(kc);
        REQUIRE(gkv.ok());
        REQUIRE(pkv.ok());
        std::vector<int32_t> blocks(n_blocks);
        std::iota(blocks.begin(), blocks.end(), 0);
        std::shuffle(blocks.begin(), blocks.end(), std::mt19937(5));
        std::vector<std::vector<int32_t>> tabs = {{blocks.begin(), blocks.begin() + 20}, {blocks.begin() + 20, blocks.begin() + 24},
                                                  {blocks.begin() + 24, blocks.begin() + 30}, {blocks.begin() + 30, blocks.begin() + 42}};
        std::mt19937 rng(9);
        auto toks = [&](int n) {
            std::vector<int32_t> v(n);
            for (int32_t& x : v) x = (int32_t)(rng() % p.n_vocab);
            return v;
        };
        // Three forwards over three pools holding the same sequences: the CPU, graphs, plain launches.
        auto step = [&](GpuForward& gf, GpuKv& gk, const std::vector<SeqInput>& b, std::vector<float>& out) {
            auto r = gf.forward(gk, b, out);
            INFO((r.ok() ? std::string("ok") : r.error().message));
            REQUIRE(r.ok());
        };
        // Prefill (not graphed): 250, 5, 46 and 126 tokens, 128 at a time.
        int np[4] = {0, 0, 0, 0};
        const int lens[4] = {250, 5, 46, 126};
        for (int s = 0; s < 4; s++) {
            const auto t = toks(lens[s]);
            for (int at = 0; at < lens[s]; at += 128) {
                const int n = std::min(128, lens[s] - at);
                std::vector<SeqInput> b(1);
                b[0].n_past = at, b[0].tokens = std::span<const int32_t>(t.data() + at, n), b[0].block_table = tabs[s];
                std::vector<float> w, g, q;
                REQUIRE(cpu.forward(ckv, b, w).ok());
                step(**graphed, **gkv, b, g);
                step(**plain, **pkv, b, q);
            }
            np[s] = lens[s];
        }
        CHECK((*graphed)->graph_stats().replays == 0);
        // Decode steps over changing subsets of the sequences: a graph replays other sequences than
        // it was captured with ({0, 2, 3} then {1, 2, 3}, {2, 3, 1}), sequences 2 and 3 start new
        // blocks (slots 48 and 128), sequence 0 goes from 250 to past 256 slots (the next bucket),
        // and the last step asks for every row's logits (ALL on one token).
        const std::vector<std::vector<int>> subsets = {{0, 1, 2, 3}, {0, 1, 2}, {1}, {0, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3},
                                                       {3, 0}, {1, 2, 3}, {0, 1, 2, 3}, {0}, {0, 1, 2, 3}, {2, 3, 1}};
        // (sequences, slot bucket) -> steps of that shape: its first warms up, its second captures.
        std::map<std::pair<int, int>, int> shapes_seen;
        for (size_t i = 0; i < subsets.size(); i++) {
            INFO("decode step " << i);
            const auto d = toks(4);
            std::vector<SeqInput> b;
            int longest = 0;
            for (int s : subsets[i]) {
                SeqInput in;
                in.n_past = np[s]++;
                in.tokens = std::span<const int32_t>(d.data() + s, 1);
                in.block_table = tabs[s];
                if (i + 1 == subsets.size()) in.logits = LogitsMode::ALL;
                longest = std::max(longest, in.n_past + 1);
                b.push_back(in);
            }
            shapes_seen[{(int)b.size(), longest <= 256 ? 256 : 512}]++;
            std::vector<float> want, g, q;
            REQUIRE(cpu.forward(ckv, b, want).ok());
            step(**graphed, **gkv, b, g);
            step(**plain, **pkv, b, q);
            CHECK(rel_err(g, q) < 1e-6);  // the same kernels with the same arguments
            CHECK(rel_err(g, want) < sh.tol);
        }
        int64_t repeated = 0;
        for (const auto& [shape, n] : shapes_seen) repeated += n > 1;
        REQUIRE(repeated >= 2);  // the test's subsets repeat shapes: graphs do replay
        const GpuForward::GraphStats gs = (*graphed)->graph_stats(), ps = (*plain)->graph_stats();
        INFO("graphs turned off: " << gs.disabled);
        CHECK(gs.disabled.empty());
        CHECK(gs.warmups == (int64_t)shapes_seen.size());
        CHECK(gs.captured == repeated);
        CHECK(gs.replays == (int64_t)subsets.size() - gs.warmups);
        CHECK(gs.eager_decodes == 0);
        CHECK(ps.replays == 0);
        CHECK(ps.captured == 0);
        CHECK(ps.eager_decodes == (int64_t)subsets.size());

        // The graphed forward on the plain forward's pool (same contents), twice (a warm-up, then a
        // capture): a graph of its own, not one captured over the other pool, and the plain
        // forward's logits. Rerunning a step rewrites its slots with the same values.
        const auto d = toks(4);
        std::vector<SeqInput> b(4);
        for (int s = 0; s < 4; s++) b[s].n_past = np[s], b[s].tokens = std::span<const int32_t>(d.data() + s, 1), b[s].block_table = tabs[s];
        std::vector<float> q, g;
        step(**plain, **pkv, b, q);
        for (int twice = 0; twice < 2; twice++) {
            step(**graphed, **pkv, b, g);
            CHECK(rel_err(g, q) < 1e-6);
        }
        CHECK((*graphed)->graph_stats().captured == gs.captured + 1);

        // At most one graph kept: a step of another shape, seen twice, drops the other one.
        (*graphed)->set_max_graphs(1);
        std::vector<SeqInput> two(b.begin(), b.begin() + 2);
        step(**plain, **pkv, two, q);
        for (int twice = 0; twice < 2; twice++) {
            step(**graphed, **pkv, two, g);
            CHECK(rel_err(g, q) < 1e-6);
        }
        CHECK((*graphed)->graph_stats().evicted == 1);
        std::vector<int32_t> greedy;  // forward_greedy through a graph: the plain logits' argmax
        REQUIRE((*graphed)->forward_greedy(**pkv, two, greedy).ok());
        REQUIRE(greedy.size() == 2);
        for (int r = 0; r < 2; r++) {
            const auto row = q.begin() + (std::ptrdiff_t)r * p.n_vocab;
            CHECK(greedy[r] == (int32_t)(std::max_element(row, row + p.n_vocab) - row));
        }
    }
}
