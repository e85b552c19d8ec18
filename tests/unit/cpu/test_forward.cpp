// Tests of the CPU forward pass (runtime/cpu/forward.h) against a naive reference, its invariance
// under batching, chunking, block size and block order, rollback, tree masks and errors, and the
// synthetic models (runtime/model/synth.h) that the tests and benches build on.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cpu/forward.h"
#include "cpu/quant_dot.h"
#include "kv/kv_storage.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "naive_reference.h"

using namespace steward;
using steward::test::NaiveReference;

namespace {

// F32 weights and F32 KV: the CPU pass (float, BLAS) against the reference (double). Measured
// 5e-6..3e-5 on the shapes below (logits up to ~100 for the tied heads).
constexpr double kTolF32 = 1e-4;
// "Identical" logits across batchings, chunkings and block layouts: a different batch shape may
// change BLAS's blocking and so the float summation order, so bit equality is not promised. The
// bound is relative to the logit scale: 2e-6 * max(1, max |logit|), i.e. about 16 float ulps of
// the largest logit (measured: up to ~5 ulps, 1e-5 absolute at logits ~15).
constexpr double kRelSame = 2e-6;

SynthSpec make_spec(const std::string& arch, int n_embd, int n_layer, int n_head, int n_head_kv, int n_ff, int n_vocab,
                    bool tied, GgmlType dtype = GgmlType::F32, uint64_t seed = 7) {
    SynthSpec s;
    s.arch = arch;
    s.n_embd = n_embd;
    s.n_layer = n_layer;
    s.n_head = n_head;
    s.n_head_kv = n_head_kv;
    s.n_ff = n_ff;
    s.n_vocab = n_vocab;
    s.n_ctx = 256;
    s.tied_output = tied;
    s.dtype = dtype;
    s.seed = seed;
    return s;
}

std::unique_ptr<Model> make_model(const SynthSpec& spec) {
    auto writer = synth_model(spec);
    INFO("synth_model: " << (writer.ok() ? std::string("ok") : writer.error().message));
    REQUIRE(writer.ok());
    auto file = GgufFile::from_bytes(writer->to_bytes());
    INFO("GgufFile::from_bytes: " << (file.ok() ? std::string("ok") : file.error().message));
    REQUIRE(file.ok());
    auto model = Model::from_gguf(std::move(file.value()));
    INFO("Model::from_gguf: " << (model.ok() ? std::string("ok") : model.error().message));
    REQUIRE(model.ok());
    return std::move(model.value());
}

// Deterministic prompt of n ids in [3, n_vocab) (0-2 are the control tokens of a synth vocabulary).
// synth.cpp wants n_vocab >= 354: control, byte and printable character tokens.
std::vector<int32_t> make_tokens(int n, int n_vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> dist(3, n_vocab - 1);
    std::vector<int32_t> t((size_t)n);
    for (int32_t& x : t) x = dist(rng);
    return t;
}

double max_abs(const std::vector<float>& a) {
    double m = 0.0;
    for (float x : a) m = std::max(m, (double)std::fabs(x));
    return m;
}

// The bound for "the same logits" as `expected` (see kRelSame).
double same_tol(const std::vector<float>& expected) {
    return kRelSame * std::max(1.0, max_abs(expected));
}

// Largest |a - b|; infinity when the sizes differ or anything is not finite.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double m = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
        m = std::max(m, (double)std::fabs(a[i] - b[i]));
    }
    return m;
}

// Rows [row_begin, row_end) of a [n_rows][n_vocab] logits buffer.
std::vector<float> rows(const std::vector<float>& logits, int n_vocab, int row_begin, int row_end) {
    return std::vector<float>(logits.begin() + (ptrdiff_t)row_begin * n_vocab,
                              logits.begin() + (ptrdiff_t)row_end * n_vocab);
}

int blocks_for(int n_slots, int block_size) {
    return (n_slots + block_size - 1) / block_size;
}

std::string lower(std::string s) {
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    return s;
}

// One sequence in its own forward call. block_table is cut to exactly the blocks that cover
// [0, n_past + n_new). Returns the logits rows it asked for.
std::vector<float> run_one(CpuForward& fwd, KvStorage& kv, std::span<const int32_t> tokens, int n_past,
                           const std::vector<int32_t>& block_table, LogitsMode mode = LogitsMode::ALL,
                           std::span<const int32_t> positions = {}, std::span<const uint8_t> mask = {}) {
    const int n_needed = blocks_for(n_past + (int)tokens.size(), kv.config().block_size);
    REQUIRE((int)block_table.size() >= n_needed);
    SeqInput s;
    s.n_past = n_past;
    s.tokens = tokens;
    s.positions = positions;
    s.mask = mask;
    s.block_table = std::span<const int32_t>(block_table).first((size_t)n_needed);
    s.logits = mode;
    std::vector<float> logits;
    auto r = fwd.forward(kv, std::span<const SeqInput>(&s, 1), logits);
    INFO("forward: " << (r.ok() ? std::string("ok") : r.error().message));
    REQUIRE(r.ok());
    const int n_vocab = fwd.model().params().n_vocab;
    const size_t n_rows = mode == LogitsMode::ALL ? tokens.size() : mode == LogitsMode::LAST ? 1 : 0;
    REQUIRE(logits.size() == n_rows * (size_t)n_vocab);
    return logits;
}

struct Agreement {
    double max_diff = 0.0;
    double scale = 1.0;  // max(1, max |logit|) of the reference
};

// A prompt of 22 tokens, logits at every position, against the naive reference. The first 18
// go as one prefill (the sgemm path of the matmul), then 3 and 1 (the streaming path).
Agreement agree_with_reference(const Model& model, KvDtype kv_dtype, bool ref_kv_f16) {
    const ModelParams& p = model.params();
    NaiveReference ref(model, ref_kv_f16);
    const std::vector<int32_t> tokens = make_tokens(22, p.n_vocab, 11);
    const std::span<const int32_t> all(tokens);
    const std::vector<float> expected = ref.eval(tokens, 0);
    CpuForward fwd(model);
    KvStorage kv(KvStorage::config_for(p, 4, 16, kv_dtype));
    const std::vector<int32_t> table = {2, 0, 3};
    std::vector<float> got = run_one(fwd, kv, all.first(18), 0, table);
    for (const std::vector<float>& more :
         {run_one(fwd, kv, all.subspan(18, 3), 18, table), run_one(fwd, kv, all.subspan(21), 21, table)})
        got.insert(got.end(), more.begin(), more.end());
    return {max_abs_diff(got, expected), std::max(1.0, max_abs(expected))};
}

struct Shape {
    const char* name;
    const char* arch;
    int n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab;
    bool tied;
};

// All but the last have every dimension a multiple of 32, so they also exist in Q8_0; the last
// has dims that are not multiples of 8 (head_dim 12) for the kernels' scalar tails.
const Shape kShapes[] = {
    {"llama MHA 4/4 untied", "llama", 64, 2, 4, 4, 96, 360, false},
    {"llama GQA 8/2 tied", "llama", 128, 3, 8, 2, 256, 512, true},
    {"llama MQA 4/1 untied", "llama", 96, 2, 4, 1, 128, 400, false},
    {"qwen2 GQA 8/2 untied", "qwen2", 128, 2, 8, 2, 160, 448, false},
    {"qwen2 MHA 2/2 tied", "qwen2", 64, 2, 2, 2, 128, 384, true},
    {"qwen2 MQA 5/1 odd dims untied", "qwen2", 60, 2, 5, 1, 100, 370, false},
};

bool fits_q8_0(const Shape& s) {
    return s.n_embd % 32 == 0 && s.n_ff % 32 == 0;
}

SynthSpec spec_of(const Shape& s, GgmlType dtype = GgmlType::F32) {
    return make_spec(s.arch, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.n_ff, s.n_vocab, s.tied, dtype);
}

// A sequence driven by run_lockstep: its tokens, how many go in each call, the logits it asks for.
struct SeqRun {
    std::vector<int32_t> tokens;
    std::vector<int> chunks;  // new tokens per call; sums to tokens.size()
    LogitsMode mode = LogitsMode::ALL;
    std::vector<float> logits;  // every row it received, concatenated over the calls
};

// Runs the sequences in lock-step: call c carries chunk c of each sequence that has one, in the
// order given, all in one forward call. Each sequence owns blocks_for(len) physical blocks; the
// ids are a random permutation when shuffle_seed != 0.
void run_lockstep(CpuForward& fwd, int block_size, uint64_t shuffle_seed, std::vector<SeqRun>& seqs) {
    const ModelParams& p = fwd.model().params();
    std::vector<int> n_seq_blocks;
    int n_blocks = 1;  // one spare block nobody owns
    for (const SeqRun& s : seqs) {
        n_seq_blocks.push_back(blocks_for((int)s.tokens.size(), block_size));
        n_blocks += n_seq_blocks.back();
    }
    std::vector<int32_t> ids((size_t)n_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    if (shuffle_seed != 0) {
        std::mt19937_64 rng(shuffle_seed);
        std::shuffle(ids.begin(), ids.end(), rng);
    }
    std::vector<std::vector<int32_t>> tables;
    size_t next = 0;
    for (int n : n_seq_blocks) {
        tables.emplace_back(ids.begin() + (ptrdiff_t)next, ids.begin() + (ptrdiff_t)(next + n));
        next += (size_t)n;
    }
    KvStorage kv(KvStorage::config_for(p, n_blocks, block_size, KvDtype::F32));

    size_t n_calls = 0;
    for (const SeqRun& s : seqs) n_calls = std::max(n_calls, s.chunks.size());
    std::vector<int> n_done(seqs.size(), 0);
    for (size_t c = 0; c < n_calls; c++) {
        std::vector<SeqInput> batch;
        std::vector<size_t> who;
        for (size_t i = 0; i < seqs.size(); i++) {
            if (c >= seqs[i].chunks.size()) continue;
            const int n_new = seqs[i].chunks[c];
            SeqInput s;
            s.n_past = n_done[i];
            s.tokens = std::span<const int32_t>(seqs[i].tokens).subspan((size_t)n_done[i], (size_t)n_new);
            s.block_table =
                std::span<const int32_t>(tables[i]).first((size_t)blocks_for(n_done[i] + n_new, block_size));
            s.logits = seqs[i].mode;
            batch.push_back(s);
            who.push_back(i);
        }
        std::vector<float> logits;
        auto r = fwd.forward(kv, batch, logits);
        INFO("forward, call " << c << ": " << (r.ok() ? std::string("ok") : r.error().message));
        REQUIRE(r.ok());
        size_t offset = 0;
        for (size_t b = 0; b < batch.size(); b++) {
            SeqRun& s = seqs[who[b]];
            const size_t n_rows = s.mode == LogitsMode::ALL    ? batch[b].tokens.size()
                                  : s.mode == LogitsMode::LAST ? 1
                                                               : 0;
            const size_t n = n_rows * (size_t)p.n_vocab;
            REQUIRE(offset + n <= logits.size());
            s.logits.insert(s.logits.end(), logits.begin() + (ptrdiff_t)offset,
                            logits.begin() + (ptrdiff_t)(offset + n));
            offset += n;
            n_done[who[b]] += (int)batch[b].tokens.size();
        }
        REQUIRE(offset == logits.size());
    }
}

// All of KV's bytes (K then V), to check that a failed call wrote nothing.
std::vector<uint8_t> snapshot(const KvStorage& kv) {
    const KvConfig& c = kv.config();
    std::vector<uint8_t> out;
    for (int l = 0; l < c.n_layer; l++)
        for (int b = 0; b < c.n_blocks; b++)
            for (int s = 0; s < c.block_size; s++) {
                out.insert(out.end(), kv.k_slot(l, b, s), kv.k_slot(l, b, s) + kv.k_slot_bytes());
                out.insert(out.end(), kv.v_slot(l, b, s), kv.v_slot(l, b, s) + kv.v_slot_bytes());
            }
    return out;
}

std::vector<uint8_t> tensor_bytes(const Model& m, const std::string& name) {
    const GgufTensorInfo* t = m.file().find_tensor(name);
    if (!t) return {};
    return std::vector<uint8_t>(t->data, t->data + t->n_bytes);
}

}  // namespace

TEST_CASE("cpu forward matches the naive reference at every position with f32 weights and f32 kv", "[forward]") {
    for (const Shape& shape : kShapes) {
        auto model = make_model(spec_of(shape));
        const Agreement a = agree_with_reference(*model, KvDtype::F32, false);
        INFO(shape.name << ": max |cpu - reference| = " << a.max_diff << ", max |logit| = " << a.scale);
        CHECK(a.max_diff < kTolF32);
    }
}

TEST_CASE("cpu forward loads the model parameters the synth spec asked for", "[forward]") {
    for (const Shape& shape : kShapes) {
        INFO(shape.name);
        auto model = make_model(spec_of(shape));
        const ModelParams& p = model->params();
        CHECK(p.arch == shape.arch);
        CHECK(p.n_embd == shape.n_embd);
        CHECK(p.n_layer == shape.n_layer);
        CHECK(p.n_head == shape.n_head);
        CHECK(p.n_head_kv == shape.n_head_kv);
        CHECK(p.n_ff == shape.n_ff);
        CHECK(p.n_vocab == shape.n_vocab);
        CHECK(p.head_dim == shape.n_embd / shape.n_head);
        CHECK(p.n_rot == p.head_dim);
        CHECK(p.rope_type == (std::string(shape.arch) == "qwen2" ? RopeType::NEOX : RopeType::NORM));
        CHECK(model->weights().tied_output == shape.tied);
        CHECK((int)model->weights().layers.size() == shape.n_layer);
        // qwen2 carries Q/K/V biases, llama none.
        const bool biased = std::string(shape.arch) == "qwen2";
        CHECK((bool)model->weights().layers[0].bq == biased);
        CHECK((bool)model->weights().layers[0].bk == biased);
        CHECK((bool)model->weights().layers[0].bv == biased);
    }
}

TEST_CASE("cpu forward matches the naive reference with f16, bf16 and q8_0 weights", "[forward]") {
    // The reference decodes the very bytes the model stores, and the CPU pass widens the stored
    // weights to F32 and keeps its activations in F32, so the F32 bound holds for every type
    // (measured: at most 3e-5). A backend that quantised activations as ggml does for Q8_0 (an
    // error of ~1/127 per dot product) would need ~2e-2 of the logit scale instead: so Q8_0 runs
    // here on the exact path (quant_dot.h's integer kernels have their own tests).
    const ExactQuantScope exact;
    const GgmlType kTypes[] = {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0};
    for (const GgmlType type : kTypes) {
        for (const Shape& shape : kShapes) {
            if (type == GgmlType::Q8_0 && !fits_q8_0(shape)) continue;
            auto model = make_model(spec_of(shape, type));
            REQUIRE(model->weights().layers[0].wq.type == type);
            const Agreement a = agree_with_reference(*model, KvDtype::F32, false);
            INFO(shape.name << " " << ggml_type_name((uint32_t)type) << ": max |cpu - reference| = " << a.max_diff
                            << ", max |logit| = " << a.scale);
            CHECK(a.max_diff < kTolF32);
        }
    }
}

TEST_CASE("cpu forward with an f16 kv cache matches a reference that rounds kv to f16", "[forward]") {
    // Against a reference that rounds K and V to F16 the only differences are float rounding and
    // the rare element that rounds to the other F16 neighbour: 1e-4 of the logit scale (measured
    // at most 9e-6 of it). Against the F32 reference the F16 rounding itself shows (2^-11
    // relative per element): 2e-3 of the logit scale (measured at most 1.5e-4 of it).
    for (const Shape& shape : kShapes) {
        auto model = make_model(spec_of(shape));
        const Agreement rounded = agree_with_reference(*model, KvDtype::F16, true);
        const Agreement plain = agree_with_reference(*model, KvDtype::F16, false);
        INFO(shape.name << ": f16 kv vs rounding reference " << rounded.max_diff << ", vs f32 reference "
                        << plain.max_diff << ", max |logit| = " << rounded.scale);
        CHECK(rounded.max_diff < 1e-4 * rounded.scale);
        CHECK(plain.max_diff < 2e-3 * plain.scale);
    }
}

TEST_CASE("cpu forward gives the same logits however a prompt is chunked, batched and laid out in blocks",
          "[forward]") {
    auto model = make_model(make_spec("llama", 128, 2, 8, 2, 192, 384, false));
    const int n_vocab = model->params().n_vocab;
    CpuForward fwd(*model);
    const std::vector<int32_t> target = make_tokens(21, n_vocab, 21);
    // Others of different lengths, with different logits modes so that row offsets move.
    const std::vector<int32_t> other1 = make_tokens(3, n_vocab, 31);
    const std::vector<int32_t> other2 = make_tokens(11, n_vocab, 32);
    const std::vector<int32_t> other3 = make_tokens(17, n_vocab, 33);

    std::vector<SeqRun> base_run = {{target, {21}, LogitsMode::ALL, {}}};
    run_lockstep(fwd, 16, 0, base_run);
    const std::vector<float> base = base_run[0].logits;
    std::vector<SeqRun> other3_run = {{other3, {17}, LogitsMode::ALL, {}}};
    run_lockstep(fwd, 16, 0, other3_run);
    const std::vector<float> other3_alone = other3_run[0].logits;
    std::vector<SeqRun> other1_run = {{other1, {3}, LogitsMode::LAST, {}}};
    run_lockstep(fwd, 16, 0, other1_run);
    const std::vector<float> other1_last = other1_run[0].logits;

    // The reference agreement of the base run is tested above; check it here too so that
    // "identical" is identical to something right.
    NaiveReference ref(*model);
    REQUIRE(max_abs_diff(base, ref.eval(target, 0)) < kTolF32);

    const std::vector<int> one(21, 1);
    const std::vector<int> chunks = {7, 5, 9};
    const struct {
        const char* name;
        int block_size;
        uint64_t shuffle;
        std::vector<int> target_chunks;
        bool batched;
    } kCases[] = {
        {"chunks 7+5+9", 16, 0, chunks, false},
        {"token by token", 16, 0, one, false},
        {"one prefill batched with 3 others", 16, 0, {21}, true},
        {"chunks batched with 3 others", 16, 0, chunks, true},
        {"token by token batched with 3 others", 16, 0, one, true},
        {"block size 32", 32, 0, {21}, false},
        {"block size 32, chunks", 32, 0, chunks, false},
        {"block size 16, shuffled blocks, token by token, batched", 16, 99, one, true},
        {"block size 32, shuffled blocks, chunks, batched", 32, 7, chunks, true},
        {"block size 16, shuffled blocks, one prefill", 16, 5, {21}, false},
    };
    for (const auto& c : kCases) {
        std::vector<SeqRun> seqs;
        if (c.batched) {
            seqs.push_back({other1, {3}, LogitsMode::LAST, {}});
            seqs.push_back({target, c.target_chunks, LogitsMode::ALL, {}});
            seqs.push_back({other2, {4, 4, 3}, LogitsMode::NONE, {}});
            seqs.push_back({other3, {5, 1, 11}, LogitsMode::ALL, {}});
        } else {
            seqs.push_back({target, c.target_chunks, LogitsMode::ALL, {}});
        }
        run_lockstep(fwd, c.block_size, c.shuffle, seqs);
        const SeqRun& t = seqs[c.batched ? 1 : 0];
        const double diff = max_abs_diff(t.logits, base);
        INFO(c.name << ": max |logits - one prefill| = " << diff);
        CHECK(diff <= same_tol(base));
        if (c.batched) {
            // The others got their own right logits too.
            const double d1 = max_abs_diff(seqs[0].logits, other1_last);
            INFO("other sequence of 3 tokens, LAST: max |batched - alone| = " << d1);
            CHECK(d1 <= same_tol(other1_last));
            CHECK(seqs[2].logits.empty());
            const double d3 = max_abs_diff(seqs[3].logits, other3_alone);
            INFO("other sequence of 17 tokens: max |batched - alone| = " << d3);
            CHECK(d3 <= same_tol(other3_alone));
        }
    }
}

TEST_CASE("cpu forward with logits LAST returns the last row of ALL", "[forward]") {
    auto model = make_model(make_spec("qwen2", 64, 2, 4, 2, 96, 360, false));
    CpuForward fwd(*model);
    const std::vector<int32_t> tokens = make_tokens(13, model->params().n_vocab, 3);
    KvStorage kv(KvStorage::config_for(model->params(), 2, 16, KvDtype::F32));
    const std::vector<float> all = run_one(fwd, kv, tokens, 0, {1});
    const std::vector<float> last = run_one(fwd, kv, tokens, 0, {1}, LogitsMode::LAST);
    const std::vector<float> none = run_one(fwd, kv, tokens, 0, {1}, LogitsMode::NONE);
    const std::vector<float> last_of_all = rows(all, model->params().n_vocab, 12, 13);
    CHECK(max_abs_diff(last, last_of_all) <= same_tol(last_of_all));
    CHECK(none.empty());
}

TEST_CASE("cpu forward rolls back by calling with a smaller n_past", "[forward]") {
    auto model = make_model(make_spec("llama", 64, 2, 4, 2, 128, 360, false));
    const int n_vocab = model->params().n_vocab;
    CpuForward fwd(*model);
    const std::vector<int32_t> tokens = make_tokens(40, n_vocab, 41);
    const std::span<const int32_t> all(tokens);
    KvStorage kv(KvStorage::config_for(model->params(), 4, 16, KvDtype::F32));
    const std::vector<int32_t> table = {2, 0, 3};

    std::vector<float> original = run_one(fwd, kv, all.first(30), 0, table);
    const std::vector<float> more = run_one(fwd, kv, all.subspan(30), 30, table);
    original.insert(original.end(), more.begin(), more.end());

    const std::vector<float> again = run_one(fwd, kv, all.subspan(25), 25, table);
    const std::vector<float> original_25_40 = rows(original, n_vocab, 25, 40);
    const double diff = max_abs_diff(again, original_25_40);
    INFO("rolled back to 25: max |logits - original| = " << diff);
    CHECK(diff <= same_tol(original_25_40));

    // As after a rejected speculation: other tokens overwrite slots 25..34, then the sequence goes
    // back to 25 with its own tokens.
    const std::vector<int32_t> rejected = make_tokens(10, n_vocab, 42);
    run_one(fwd, kv, rejected, 25, table, LogitsMode::NONE);
    const std::vector<float> after = run_one(fwd, kv, all.subspan(25), 25, table);
    const double diff2 = max_abs_diff(after, original_25_40);
    INFO("after overwriting with rejected tokens: max |logits - original| = " << diff2);
    CHECK(diff2 <= same_tol(original_25_40));

    NaiveReference ref(*model);
    CHECK(max_abs_diff(original, ref.eval(tokens, 0)) < kTolF32);
}

TEST_CASE("cpu forward with an explicit causal mask and positions equals the plain causal call", "[forward]") {
    for (const char* arch : {"llama", "qwen2"}) {
        INFO(arch);
        auto model = make_model(make_spec(arch, 64, 2, 4, 2, 96, 360, false));
        CpuForward fwd(*model);
        const std::vector<int32_t> tokens = make_tokens(16, model->params().n_vocab, 51);
        const std::span<const int32_t> all(tokens);
        KvStorage kv(KvStorage::config_for(model->params(), 3, 16, KvDtype::F32));
        const std::vector<int32_t> table = {1, 2};
        run_one(fwd, kv, all.first(10), 0, table, LogitsMode::NONE);
        const std::vector<float> plain = run_one(fwd, kv, all.subspan(10), 10, table);

        const int n = 6;
        std::vector<uint8_t> mask((size_t)n * n, 0);
        for (int i = 0; i < n; i++)
            for (int j = 0; j <= i; j++) mask[(size_t)i * n + j] = 1;
        const std::vector<int32_t> positions = {10, 11, 12, 13, 14, 15};
        const std::vector<float> masked =
            run_one(fwd, kv, all.subspan(10), 10, table, LogitsMode::ALL, positions, mask);
        const double diff = max_abs_diff(masked, plain);
        INFO("max |masked - plain| = " << diff);
        CHECK(diff <= same_tol(plain));
    }
}

TEST_CASE("cpu forward tree siblings at the same position each see only the shared prefix", "[forward]") {
    for (const char* arch : {"llama", "qwen2"}) {
        INFO(arch);
        auto model = make_model(make_spec(arch, 64, 2, 4, 2, 96, 360, false));
        const int n_vocab = model->params().n_vocab;
        CpuForward fwd(*model);
        const std::vector<int32_t> prefix = make_tokens(10, n_vocab, 61);
        KvStorage kv(KvStorage::config_for(model->params(), 6, 16, KvDtype::F32));
        const std::vector<int32_t> table = {4, 1};
        run_one(fwd, kv, prefix, 0, table, LogitsMode::NONE);

        // Two branches: a -> a2 and b -> b2, both starting at position 10.
        const int32_t a = 17, a2 = 201, b = 42, b2 = 99;
        const std::vector<int32_t> branch_a = {a, a2}, branch_b = {b, b2};
        const std::vector<float> alone_a = run_one(fwd, kv, branch_a, 10, table);
        const std::vector<float> alone_b = run_one(fwd, kv, branch_b, 10, table);

        const std::vector<int32_t> tree = {a, b, a2, b2};
        const std::vector<int32_t> positions = {10, 10, 11, 11};
        const std::vector<uint8_t> mask = {
            1, 0, 0, 0,  // a
            0, 1, 0, 0,  // b
            1, 0, 1, 0,  // a2 sees a
            0, 1, 0, 1,  // b2 sees b
        };
        const std::vector<float> got = run_one(fwd, kv, tree, 10, table, LogitsMode::ALL, positions, mask);
        std::vector<float> got_a = rows(got, n_vocab, 0, 1), got_b = rows(got, n_vocab, 1, 2);
        const std::vector<float> got_a2 = rows(got, n_vocab, 2, 3), got_b2 = rows(got, n_vocab, 3, 4);
        got_a.insert(got_a.end(), got_a2.begin(), got_a2.end());
        got_b.insert(got_b.end(), got_b2.begin(), got_b2.end());
        const double da = max_abs_diff(got_a, alone_a), db = max_abs_diff(got_b, alone_b);
        INFO("branch a: max |tree - alone| = " << da << "; branch b: " << db);
        CHECK(da <= same_tol(alone_a));
        CHECK(db <= same_tol(alone_b));

        // The same tree batched after another plain sequence (its own blocks) changes nothing.
        const std::vector<int32_t> other = make_tokens(9, n_vocab, 62);
        const std::vector<int32_t> other_table = {3};
        const std::vector<int32_t> tree_table = {4, 1};
        SeqInput s0;
        s0.tokens = other;
        s0.block_table = other_table;
        s0.logits = LogitsMode::LAST;
        SeqInput s1;
        s1.n_past = 10;
        s1.tokens = tree;
        s1.positions = positions;
        s1.mask = mask;
        s1.block_table = tree_table;
        s1.logits = LogitsMode::ALL;
        const SeqInput batch[] = {s0, s1};
        std::vector<float> logits;
        auto r = fwd.forward(kv, batch, logits);
        INFO("forward: " << (r.ok() ? std::string("ok") : r.error().message));
        REQUIRE(r.ok());
        REQUIRE(logits.size() == (size_t)5 * n_vocab);
        const double dt = max_abs_diff(rows(logits, n_vocab, 1, 5), got);
        INFO("tree batched after another sequence: max |batched - alone| = " << dt);
        CHECK(dt <= same_tol(got));
    }
}

TEST_CASE("cpu forward rejects bad input with a message that names it and leaves the kv untouched", "[forward]") {
    SynthSpec spec = make_spec("llama", 64, 2, 4, 2, 96, 360, false);
    spec.n_ctx = 64;
    auto model = make_model(spec);
    const ModelParams& p = model->params();
    REQUIRE(p.n_ctx_train == 64);
    const int n_vocab = p.n_vocab;
    const int n_blocks = 12;
    CpuForward fwd(*model, 0, 48);
    KvStorage kv(KvStorage::config_for(p, n_blocks, 16, KvDtype::F32));

    // Sequence A holds 20 tokens in blocks {3, 7}.
    const std::vector<int32_t> tokens_a = make_tokens(25, n_vocab, 71);
    const std::span<const int32_t> all_a(tokens_a);
    const std::vector<int32_t> table_a = {3, 7};
    run_one(fwd, kv, all_a.first(20), 0, table_a, LogitsMode::NONE);
    const std::vector<uint8_t> before = snapshot(kv);

    // Every bad batch also carries a valid rewrite of A's slots 10..14 with other tokens: a
    // pass that wrote KV before it validated would corrupt A.
    const std::vector<int32_t> rewrite = make_tokens(5, n_vocab, 72);
    SeqInput good;
    good.n_past = 10;
    good.tokens = rewrite;
    good.block_table = table_a;
    good.logits = LogitsMode::ALL;

    const std::vector<int32_t> ok_tokens = make_tokens(4, n_vocab, 73);
    const std::vector<int32_t> long_tokens = make_tokens(20, n_vocab, 74);
    const std::vector<int32_t> bad_token = {5, n_vocab + 7, 6};
    const std::vector<int32_t> negative_token = {5, -3};
    const std::vector<int32_t> table_b = {0, 1};
    const std::vector<int32_t> table_b_short = {0};
    const std::vector<int32_t> table_b_bad = {n_blocks + 3};
    const std::vector<int32_t> table_b_negative = {-1};
    const std::vector<int32_t> table_b_long = {0, 1, 2, 4, 5};  // 80 slots
    const std::vector<int32_t> pos_past_ctx = {p.n_ctx_train + 10};
    const std::vector<int32_t> pos_at_ctx = {p.n_ctx_train};
    const std::vector<int32_t> one_token = {5};
    const std::vector<int32_t> too_many = make_tokens(45, n_vocab, 75);  // with A's 5: 50 > 48

    struct Bad {
        const char* what;
        SeqInput seq;
        std::string expect;  // lower-case text the message must contain
    };
    std::vector<Bad> bads;
    {
        SeqInput s;
        s.tokens = bad_token;
        s.block_table = table_b;
        bads.push_back({"token id >= n_vocab", s, std::to_string(n_vocab + 7)});
    }
    {
        SeqInput s;
        s.tokens = negative_token;
        s.block_table = table_b;
        bads.push_back({"negative token id", s, "-3"});
    }
    {
        SeqInput s;
        s.tokens = long_tokens;  // 20 slots need 2 blocks of 16
        s.block_table = table_b_short;
        bads.push_back({"block table too short", s, "block"});
    }
    {
        SeqInput s;
        s.tokens = ok_tokens;
        s.block_table = table_b_bad;
        bads.push_back({"block id >= n_blocks", s, std::to_string(n_blocks + 3)});
    }
    {
        SeqInput s;
        s.tokens = ok_tokens;
        s.block_table = table_b_negative;
        bads.push_back({"negative block id", s, "-1"});
    }
    {
        SeqInput s;
        s.tokens = one_token;
        s.positions = pos_past_ctx;
        s.block_table = table_b;
        bads.push_back({"explicit position past n_ctx", s, std::to_string(p.n_ctx_train + 10)});
    }
    {
        SeqInput s;
        s.tokens = one_token;
        s.positions = pos_at_ctx;
        s.block_table = table_b;
        bads.push_back({"explicit position == n_ctx", s, std::to_string(p.n_ctx_train)});
    }
    {
        SeqInput s;
        s.n_past = p.n_ctx_train;  // slot and position 64 of a 64-token context
        s.tokens = one_token;
        s.block_table = table_b_long;
        bads.push_back({"n_past + n_new past n_ctx", s, std::to_string(p.n_ctx_train)});
    }
    {
        SeqInput s;
        s.tokens = too_many;
        s.block_table = table_b_long;
        bads.push_back({"batch over max_tokens", s, "48"});
    }

    for (const Bad& bad : bads) {
        INFO(bad.what);
        const SeqInput batch[] = {good, bad.seq};
        std::vector<float> logits;
        auto r = fwd.forward(kv, batch, logits);
        REQUIRE_FALSE(r.ok());
        INFO("message: " << r.error().message);
        CHECK(lower(r.error().message).find(bad.expect) != std::string::npos);
        CHECK((snapshot(kv) == before));
    }

    // A continues as if nothing happened.
    const std::vector<float> got = run_one(fwd, kv, all_a.subspan(20), 20, table_a);
    NaiveReference ref(*model);
    const std::vector<float> expected = rows(ref.eval(tokens_a, 0), n_vocab, 20, 25);
    const double diff = max_abs_diff(got, expected);
    INFO("sequence A after the failed calls: max |cpu - reference| = " << diff);
    CHECK(diff < kTolF32);
}

TEST_CASE("synth model greedy generation stays finite, varied and peaked", "[forward]") {
    // Default-ish shape: what the benches decode with.
    SynthSpec spec;
    spec.n_embd = 256;
    spec.n_layer = 4;
    spec.n_head = 4;
    spec.n_head_kv = 4;
    spec.n_vocab = 4096;
    spec.tied_output = false;
    spec.seed = 1;
    auto model = make_model(spec);
    const int n_vocab = model->params().n_vocab;
    CpuForward fwd(*model);
    const int n_gen = 200;
    KvStorage kv(KvStorage::config_for(model->params(), 16, 16, KvDtype::F32));
    std::vector<int32_t> table(16);
    std::iota(table.begin(), table.end(), 0);

    std::vector<int32_t> seq = {1, 300, 1000, 2000};  // BOS and three tokens
    std::vector<float> logits = run_one(fwd, kv, seq, 0, table, LogitsMode::LAST);
    std::map<int32_t, int> counts;
    double sum_prob_margin = 0.0;
    double min_logit_margin = INFINITY;
    bool finite = true;
    for (int step = 0; step < n_gen; step++) {
        for (float x : logits) finite = finite && std::isfinite(x);
        if (!finite) break;
        // Top two logits and softmax probabilities.
        int32_t top1 = 0, top2 = -1;
        for (int32_t i = 1; i < n_vocab; i++) {
            if (logits[(size_t)i] > logits[(size_t)top1]) {
                top2 = top1;
                top1 = i;
            } else if (top2 < 0 || logits[(size_t)i] > logits[(size_t)top2]) {
                top2 = i;
            }
        }
        double z = 0.0;
        for (float x : logits) z += std::exp((double)x - logits[(size_t)top1]);
        const double p1 = 1.0 / z;
        const double p2 = std::exp((double)logits[(size_t)top2] - logits[(size_t)top1]) / z;
        sum_prob_margin += p1 - p2;
        min_logit_margin = std::min(min_logit_margin, (double)logits[(size_t)top1] - logits[(size_t)top2]);
        counts[top1]++;
        seq.push_back(top1);
        const int32_t next[] = {top1};
        logits = run_one(fwd, kv, next, (int)seq.size() - 1, table, LogitsMode::LAST);
    }
    REQUIRE(finite);
    int max_count = 0;
    for (const auto& [tok, n] : counts) max_count = std::max(max_count, n);
    const double mean_prob_margin = sum_prob_margin / n_gen;
    INFO("distinct tokens " << counts.size() << ", most frequent token " << max_count << " times, mean p1 - p2 "
                            << mean_prob_margin << ", min logit margin " << min_logit_margin);
    CHECK(counts.size() >= 20);
    CHECK(max_count <= n_gen / 2);
    // Peaked: on average the best token is clearly ahead of the second.
    CHECK(mean_prob_margin > 0.05);
    // Never a near-tie, so greedy decoding is stable across backends and batchings.
    CHECK(min_logit_margin > 1e-3);
}

TEST_CASE("synth model bytes depend only on the spec and the seed", "[forward]") {
    SynthSpec spec = make_spec("qwen2", 64, 2, 4, 2, 96, 360, false, GgmlType::Q8_0, 5);
    auto w1 = synth_model(spec);
    auto w2 = synth_model(spec);
    REQUIRE(w1.ok());
    REQUIRE(w2.ok());
    const std::vector<uint8_t> b1 = w1->to_bytes();
    CHECK((b1 == w2->to_bytes()));
    spec.seed = 6;
    auto w3 = synth_model(spec);
    REQUIRE(w3.ok());
    const std::vector<uint8_t> b3 = w3->to_bytes();
    CHECK(b1.size() == b3.size());
    CHECK((b1 != b3));
}

TEST_CASE("synth draft keeps the first layers and the target's embeddings and output head", "[forward]") {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("steward_test_forward_" + std::to_string(getpid()));
    fs::create_directories(dir);
    for (const bool tied : {false, true}) {
        INFO((tied ? "tied" : "untied"));
        const std::string target_path = (dir / "target.gguf").string();
        const std::string draft_path = (dir / "draft.gguf").string();
        const SynthSpec spec = make_spec("llama", 64, 3, 4, 2, 96, 360, tied, GgmlType::F16, 9);
        auto w = synth_write(spec, target_path);
        INFO("synth_write: " << (w.ok() ? std::string("ok") : w.error().message));
        REQUIRE(w.ok());
        const int keep = 1;
        auto d = synth_draft(target_path, keep, draft_path);
        INFO("synth_draft: " << (d.ok() ? std::string("ok") : d.error().message));
        REQUIRE(d.ok());
        auto target = Model::load(target_path);
        auto draft = Model::load(draft_path);
        REQUIRE(target.ok());
        INFO("Model::load(draft): " << (draft.ok() ? std::string("ok") : draft.error().message));
        REQUIRE(draft.ok());
        const ModelParams& tp = (*target)->params();
        const ModelParams& dp = (*draft)->params();
        CHECK(dp.n_layer == keep);
        CHECK((int)(*draft)->weights().layers.size() == keep);
        CHECK(dp.n_embd == tp.n_embd);
        CHECK(dp.n_vocab == tp.n_vocab);
        CHECK(dp.n_head == tp.n_head);
        CHECK(dp.n_head_kv == tp.n_head_kv);
        CHECK(dp.arch == tp.arch);
        CHECK((*draft)->weights().tied_output == tied);

        for (const char* name : {"token_embd.weight", "output_norm.weight", "output.weight"}) {
            INFO(name);
            const std::vector<uint8_t> tb = tensor_bytes(**target, name);
            const std::vector<uint8_t> db = tensor_bytes(**draft, name);
            if (tied && std::string(name) == "output.weight" && tb.empty()) {
                CHECK(db.empty());
                continue;
            }
            REQUIRE_FALSE(tb.empty());
            CHECK((tb == db));
        }
        for (const GgufTensorInfo& t : (*draft)->file().tensors()) {
            INFO(t.name);
            CHECK((t.name.rfind("blk.", 0) != 0 || t.name.rfind("blk.0.", 0) == 0));
            if (t.name.rfind("blk.0.", 0) == 0)
                CHECK((tensor_bytes(**draft, t.name) == tensor_bytes(**target, t.name)));
        }
        // The same tokenizer, and the draft runs: against the reference on its own weights.
        CHECK((*draft)->tokenizer().n_vocab() == (*target)->tokenizer().n_vocab());
        const Agreement a = agree_with_reference(**draft, KvDtype::F32, false);
        INFO("draft: max |cpu - reference| = " << a.max_diff);
        CHECK(a.max_diff < kTolF32);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
}

TEST_CASE("cpu forward cut to its first n layers equals the forward of the draft cut to those layers", "[forward]") {
    // The self-speculative draft: the target's own weights, n of its layers, its final norm and
    // head. The reference is synth_draft's separate file of the same first layers.
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / ("steward_test_forward_cut_" + std::to_string(getpid()));
    fs::create_directories(dir);
    const std::string target_path = (dir / "target.gguf").string();
    const SynthSpec spec = make_spec("qwen2", 64, 3, 4, 2, 96, 360, false, GgmlType::F32, 13);
    REQUIRE(synth_write(spec, target_path).ok());
    auto target = Model::load(target_path);
    REQUIRE(target.ok());
    const std::vector<int32_t> prompt = {1, 40, 41, 300, 7, 99, 12};
    for (int keep : {1, 2}) {
        INFO("layers " << keep);
        const std::string draft_path = (dir / ("draft" + std::to_string(keep) + ".gguf")).string();
        REQUIRE(synth_draft(target_path, keep, draft_path).ok());
        auto draft = Model::load(draft_path);
        REQUIRE(draft.ok());
        CpuForward cut(**target, 1, 64, keep), whole(**draft, 1, 64);
        CHECK(cut.n_layers() == keep);
        KvStorage kv_cut(KvStorage::config_for((*draft)->params(), 2, 16, KvDtype::F32));
        KvStorage kv_whole(KvStorage::config_for((*draft)->params(), 2, 16, KvDtype::F32));
        const std::vector<int32_t> table = {0, 1};
        SeqInput in;
        in.tokens = prompt;
        in.block_table = table;
        in.logits = LogitsMode::ALL;
        std::vector<float> a, b;
        REQUIRE(cut.forward(kv_cut, std::span<const SeqInput>(&in, 1), a).ok());
        REQUIRE(whole.forward(kv_whole, std::span<const SeqInput>(&in, 1), b).ok());
        REQUIRE(a.size() == b.size());
        CHECK(a == b);  // the same weights through the same code: bit-identical
        // The full target's KV shape is refused by the cut forward.
        KvStorage kv_full(KvStorage::config_for((*target)->params(), 2, 16, KvDtype::F32));
        CHECK_FALSE(cut.forward(kv_full, std::span<const SeqInput>(&in, 1), a).ok());
    }
    // 0 or the whole count runs every layer.
    CHECK(CpuForward(**target, 1, 8, 0).n_layers() == 3);
    CHECK(CpuForward(**target, 1, 8, 3).n_layers() == 3);
    std::error_code ec;
    fs::remove_all(dir, ec);
}
