// GpuForward and GpuKv (gpu/forward.h): weights uploaded once, then the CPU forward's steps as
// kernels on one stream, read top to bottom as cpu/forward.cpp: validate (the shared check_batch),
// embed, per layer rmsnorm -> QKV (+ biases, q/k head norms) -> RoPE -> KV write -> attention ->
// output projection -> rmsnorm -> SwiGLU FFN, then the final norm and the output head.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/forward.h"
#include "gpu/kernels.h"

namespace steward {

namespace {

// A matrix on the device, F32 or F16 (what gpu::gemm takes): [n_rows][n_cols].
struct DevMatrix {
    GgmlType type = GgmlType::F32;
    void* data = nullptr;
    int64_t n_rows = 0, n_cols = 0;
};

struct DevLayer {
    float* attn_norm = nullptr;  // [n_embd]
    float* ffn_norm = nullptr;   // [n_embd]
    DevMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
    float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // optional biases
    float *q_norm = nullptr, *k_norm = nullptr;         // optional [head_dim] head gains
};

// Each forward's cuBLAS workspace (what PyTorch gives a handle on Hopper).
constexpr int64_t kCublasWorkspace = 32ll << 20;

// Makes a device buffer hold at least `need` elements (allocating twice that, so a growing batch
// reallocates rarely); what it held is not kept.
template <typename T>
Expected<bool> grow_device(T*& p, size_t& cap, size_t need) {
    if (need <= cap) return true;
    if (p) cudaFree(p);
    p = nullptr;
    cap = 0;
    CUDA_TRY(cudaMalloc(&p, need * 2 * sizeof(T)));
    cap = need * 2;
    return true;
}

// The type the token table keeps on the device: as stored where the embedding kernel reads it
// (F32, F16, BF16, Q8_0), else F16 (upload_matrix's rule).
GgmlType embed_device_type(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q8_0 ? t : GgmlType::F16;
}
// Whether the output head is the device's token table itself: tied, and the table a GEMM type.
bool output_is_embedding(const ModelWeights& W) {
    const GgmlType t = embed_device_type(W.tok_embd.type);
    return W.output.data == W.tok_embd.data && (t == GgmlType::F32 || t == GgmlType::F16);
}
// Device bytes of a matrix as upload_matrix keeps it: F32 as stored, everything else F16.
int64_t matrix_device_bytes(const WeightView& w) {
    return w ? w.n_rows * w.n_cols * (w.type == GgmlType::F32 ? 4 : 2) : 0;
}

}  // namespace

struct GpuForward::Impl {
    ModelParams p;
    int max_tokens = 0;
    int n_layers = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    std::vector<void*> allocs;  // everything cudaMalloc'd, freed in the destructor
    int64_t weight_bytes = 0;
    // A sharing forward's (create_sharing): the forward whose weights tok_embd, output,
    // output_norm and layers point into, kept alive with them.
    std::shared_ptr<const Impl> source;

    DevMatrix tok_embd;  // as stored when F32 / F16 / BF16 / Q8_0, else F16
    DevMatrix output;    // F32 or F16
    float* output_norm = nullptr;
    float* rope_factors = nullptr;  // [n_rot / 2] ModelParams::rope_freq_factors; null: none
    std::vector<DevLayer> layers;

    // Scratch for max_tokens rows.
    float *x = nullptr, *xn = nullptr;  // [T][n_embd]
    float *q = nullptr, *att = nullptr; // [T][n_head * head_dim]
    float *k = nullptr, *v = nullptr;   // [T][n_head_kv * head_dim]
    float *gate = nullptr, *up = nullptr;  // [T][n_ff]
    float* tmp = nullptr;      // [T][max(n_embd, n_head * head_dim)]
    float* logits = nullptr;   // [T][n_vocab]
    uint16_t* x16 = nullptr;   // [T][max(n_embd, n_ff, n_head * head_dim)] F16 activations for the GEMMs
    int32_t* argmax = nullptr; // [T]
    // Per-batch tables (tokens, positions, slots, block tables, ...): grown as needed.
    int32_t* ints = nullptr;
    size_t ints_cap = 0;
    uint8_t* mask = nullptr;
    size_t mask_cap = 0;
    std::vector<int32_t> h_ints;
    std::vector<uint8_t> h_mask;

    ~Impl() {
        drop_graphs();
        if (blas)  // before its workspace (in allocs) is freed
            if (auto api = gpu::cublas()) (*api)->destroy(blas);
        for (void* a : allocs) cudaFree(a);
        if (ints) cudaFree(ints);
        if (mask) cudaFree(mask);
        if (stream) cudaStreamDestroy(stream);
    }

    template <typename T>
    Expected<T*> alloc(int64_t n) {
        void* d = nullptr;
        CUDA_TRY(cudaMalloc(&d, (size_t)std::max<int64_t>(n, 1) * sizeof(T)));
        allocs.push_back(d);
        return static_cast<T*>(d);
    }

    Expected<bool> init(int max_tok, int n_lay) {
        CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        auto api = gpu::cublas();
        if (!api) return api.error();
        CUBLAS_TRY((*api)->create(&blas));
        CUBLAS_TRY((*api)->set_stream(blas, stream));
        // cuBLAS's workspace, ours and fixed (after set_stream, which resets it): a decode graph's
        // GEMMs capture this buffer instead of one cuBLAS would allocate per capture.
        auto ws = alloc<uint8_t>(kCublasWorkspace);
        if (!ws) return ws.error();
        CUBLAS_TRY((*api)->set_workspace(blas, *ws, kCublasWorkspace));
        // The attention's shared-memory limit is set up now, outside any capture.
        if (auto lim = gpu::attention_max_slots(p.head_dim); !lim) return lim.error();
        max_tokens = max_tok;
        n_layers = forward_layers(p, n_lay);
        const int64_t T = max_tok, QD = (int64_t)p.n_head * p.head_dim, KVD = (int64_t)p.n_head_kv * p.head_dim;
        const int64_t wide = std::max<int64_t>({p.n_embd, p.n_ff, QD});
        auto a = [&](float*& f, int64_t n) -> Expected<bool> {
            auto r = alloc<float>(n);
            if (!r) return r.error();
            f = *r;
            return true;
        };
        STEWARD_TRY(a(x, T * p.n_embd));
        STEWARD_TRY(a(xn, T * p.n_embd));
        STEWARD_TRY(a(q, T * QD));
        STEWARD_TRY(a(att, T * QD));
        STEWARD_TRY(a(k, T * KVD));
        STEWARD_TRY(a(v, T * KVD));
        STEWARD_TRY(a(gate, T * p.n_ff));
        STEWARD_TRY(a(up, T * p.n_ff));
        STEWARD_TRY(a(tmp, T * std::max<int64_t>(p.n_embd, QD)));
        STEWARD_TRY(a(logits, T * p.n_vocab));
        auto h = alloc<uint16_t>(T * wide);
        if (!h) return h.error();
        x16 = *h;
        auto am = alloc<int32_t>(T);
        if (!am) return am.error();
        argmax = *am;
        return true;
    }

    // A vector (norm gain, bias) as F32 on the device; null view -> nullptr.
    Expected<float*> upload_vector(const WeightView& w) {
        if (!w) return (float*)nullptr;
        const int64_t n = w.n_cols * std::max<int64_t>(w.n_rows, 1);
        std::vector<float> host((size_t)n);
        if (w.type == GgmlType::F32)
            std::memcpy(host.data(), w.data, (size_t)n * 4);
        else
            dequantize_row(w.type, w.data, host.data(), n);
        auto d = alloc<float>(n);
        if (!d) return d.error();
        CUDA_TRY(cudaMemcpyAsync(*d, host.data(), (size_t)n * 4, cudaMemcpyHostToDevice, stream));
        CUDA_TRY(cudaStreamSynchronize(stream));
        weight_bytes += n * 4;
        return *d;
    }

    // A matrix as F32 (F32 stored) or F16 (everything else): F16 copied, Q8_0 / Q4_K dequantized
    // on the device, other types dequantized row by row on the host.
    Expected<DevMatrix> upload_matrix(const WeightView& w) {
        DevMatrix m;
        m.n_rows = w.n_rows;
        m.n_cols = w.n_cols;
        const int64_t n = w.n_rows * w.n_cols;
        if (w.type == GgmlType::F32) {
            auto d = alloc<float>(n);
            if (!d) return d.error();
            CUDA_TRY(cudaMemcpyAsync(*d, w.data, (size_t)n * 4, cudaMemcpyHostToDevice, stream));
            m.type = GgmlType::F32;
            m.data = *d;
            weight_bytes += n * 4;
            CUDA_TRY(cudaStreamSynchronize(stream));
            return m;
        }
        auto d = alloc<uint16_t>(n);
        if (!d) return d.error();
        m.type = GgmlType::F16;
        m.data = *d;
        weight_bytes += n * 2;
        if (w.type == GgmlType::F16) {
            CUDA_TRY(cudaMemcpyAsync(*d, w.data, (size_t)n * 2, cudaMemcpyHostToDevice, stream));
        } else if (w.type == GgmlType::Q8_0 || w.type == GgmlType::Q4_K) {
            void* raw = nullptr;
            const size_t bytes = (size_t)p_bytes(w);
            CUDA_TRY(cudaMalloc(&raw, bytes));
            auto copied = [&]() -> Expected<bool> {
                CUDA_TRY(cudaMemcpyAsync(raw, w.data, bytes, cudaMemcpyHostToDevice, stream));
                STEWARD_TRY(gpu::dequantize_to_f16(w.type, raw, n, *d, stream));
                CUDA_TRY(cudaStreamSynchronize(stream));
                return true;
            }();
            cudaFree(raw);
            if (!copied) return copied.error();
        } else {
            std::vector<float> row((size_t)w.n_cols);
            std::vector<uint16_t> host((size_t)n);
            for (int64_t r = 0; r < w.n_rows; r++) {
                dequantize_row(w.type, w.row(r), row.data(), w.n_cols);
                for (int64_t c = 0; c < w.n_cols; c++) host[(size_t)(r * w.n_cols + c)] = f32_to_f16(row[(size_t)c]);
            }
            CUDA_TRY(cudaMemcpyAsync(*d, host.data(), (size_t)n * 2, cudaMemcpyHostToDevice, stream));
        }
        CUDA_TRY(cudaStreamSynchronize(stream));
        return m;
    }

    Expected<bool> upload(const Model& model) {
        const ModelWeights& W = model.weights();
        const WeightView& te = W.tok_embd;
        if (embed_device_type(te.type) == te.type) {
            auto d = alloc<uint8_t>(p_bytes(te));
            if (!d) return d.error();
            CUDA_TRY(cudaMemcpyAsync(*d, te.data, (size_t)p_bytes(te), cudaMemcpyHostToDevice, stream));
            CUDA_TRY(cudaStreamSynchronize(stream));
            tok_embd = {te.type, *d, te.n_rows, te.n_cols};
            weight_bytes += p_bytes(te);
        } else {
            auto m = upload_matrix(te);
            if (!m) return m.error();
            tok_embd = *m;
        }
        if (output_is_embedding(W)) {
            output = tok_embd;  // tied, and already a GEMM type
        } else {
            auto m = upload_matrix(W.output);
            if (!m) return m.error();
            output = *m;
        }
        auto on = upload_vector(W.output_norm);
        if (!on) return on.error();
        output_norm = *on;
        if (!p.rope_freq_factors.empty()) {
            auto rf = upload_vector(WeightView{GgmlType::F32, p.rope_freq_factors.data(), (int64_t)p.rope_freq_factors.size(), 1});
            if (!rf) return rf.error();
            rope_factors = *rf;
        }
        layers.resize(n_layers);
        for (int l = 0; l < n_layers; l++) {
            const LayerWeights& L = W.layers[l];
            DevLayer& D = layers[l];
            struct { const WeightView* w; DevMatrix* d; } mats[] = {{&L.wq, &D.wq}, {&L.wk, &D.wk}, {&L.wv, &D.wv},
                {&L.wo, &D.wo}, {&L.w_gate, &D.w_gate}, {&L.w_up, &D.w_up}, {&L.w_down, &D.w_down}};
            for (auto& mm : mats) {
                auto m = upload_matrix(*mm.w);
                if (!m) return make_error("layer ", l, ": ", m.error().message);
                *mm.d = *m;
            }
            struct { const WeightView* w; float** d; } vecs[] = {{&L.attn_norm, &D.attn_norm}, {&L.ffn_norm, &D.ffn_norm},
                {&L.bq, &D.bq}, {&L.bk, &D.bk}, {&L.bv, &D.bv}, {&L.q_norm, &D.q_norm}, {&L.k_norm, &D.k_norm}};
            for (auto& vv : vecs) {
                auto v2 = upload_vector(*vv.w);
                if (!v2) return make_error("layer ", l, ": ", v2.error().message);
                *vv.d = *v2;
            }
        }
        return true;
    }

    Expected<DevMatrix> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
        auto d = alloc<uint16_t>(rows * cols);
        if (!d) return d.error();
        STEWARD_TRY(gpu::fill_random_f16(*d, rows * cols, std::sqrt(3.0f / (float)cols), seed, stream));
        weight_bytes += rows * cols * 2;
        return DevMatrix{GgmlType::F16, *d, rows, cols};
    }
    Expected<float*> ones(int64_t n) {
        auto d = alloc<float>(n);
        if (!d) return d.error();
        STEWARD_TRY(gpu::fill_f32(*d, n, 1.0f, stream));
        weight_bytes += n * 4;
        return *d;
    }

    Expected<bool> synthesize(uint64_t seed) {
        const int64_t E = p.n_embd, QD = (int64_t)p.n_head * p.head_dim, KVD = (int64_t)p.n_head_kv * p.head_dim;
        auto te = random_matrix(p.n_vocab, E, seed * 1000 + 1);
        if (!te) return te.error();
        tok_embd = *te;
        auto out = random_matrix(p.n_vocab, E, seed * 1000 + 2);
        if (!out) return out.error();
        output = *out;
        auto on = ones(E);
        if (!on) return on.error();
        output_norm = *on;
        layers.resize(n_layers);
        for (int l = 0; l < n_layers; l++) {
            DevLayer& D = layers[l];
            const uint64_t s = seed * 1000 + 10 + 10 * (uint64_t)l;
            struct { DevMatrix* d; int64_t r, c; } mats[] = {{&D.wq, QD, E}, {&D.wk, KVD, E}, {&D.wv, KVD, E},
                {&D.wo, E, QD}, {&D.w_gate, p.n_ff, E}, {&D.w_up, p.n_ff, E}, {&D.w_down, E, p.n_ff}};
            int i = 0;
            for (auto& mm : mats) {
                auto m = random_matrix(mm.r, mm.c, s + i++);
                if (!m) return m.error();
                *mm.d = *m;
            }
            auto a = ones(E), f = ones(E);
            if (!a) return a.error();
            if (!f) return f.error();
            D.attn_norm = *a;
            D.ffn_norm = *f;
        }
        CUDA_TRY(cudaStreamSynchronize(stream));
        return true;
    }

    Expected<bool> ensure_tables(size_t n_ints, size_t n_mask) {
        STEWARD_TRY(grow_device(ints, ints_cap, n_ints));
        return grow_device(mask, mask_cap, n_mask);
    }

    // Where one batch's tables sit in the device int buffer (sections at these offsets) and the
    // batch's sizes. Decode batches of the same number of sequences have the same offsets: a
    // captured graph reads its tables from the same addresses step after step.
    struct Layout {
        int n_tok = 0, n_seq = 0, n_out = 0, n_bt = 0, max_slots = 0;
        size_t o_tok = 0, o_pos = 0, o_slot = 0, o_tseq = 0, o_ti = 0, o_past = 0, o_new = 0, o_bto = 0, o_mo = 0,
               o_out = 0, o_bt = 0, n_ints = 0, n_mask = 0;
    };

    // Fills h_ints and h_mask with the batch's tables (tokens, positions, slots, block tables, ...).
    Layout build_tables(const KvConfig& kc, std::span<const SeqInput> batch, int n_out) {
        Layout L;
        L.n_seq = (int)batch.size();
        L.n_out = n_out;
        const int bs = kc.block_size;
        for (const SeqInput& in : batch) {
            const int n = (int)in.tokens.size();
            L.n_tok += n;
            L.n_bt += (in.n_past + n + bs - 1) / bs;
            L.max_slots = std::max(L.max_slots, in.n_past + n);
            L.n_mask += in.mask.size();
        }
        const int n_tok = L.n_tok, n_seq = L.n_seq;
        L.o_tok = 0, L.o_pos = L.o_tok + n_tok, L.o_slot = L.o_pos + n_tok, L.o_tseq = L.o_slot + n_tok,
        L.o_ti = L.o_tseq + n_tok, L.o_past = L.o_ti + n_tok, L.o_new = L.o_past + n_seq, L.o_bto = L.o_new + n_seq,
        L.o_mo = L.o_bto + n_seq, L.o_out = L.o_mo + n_seq, L.o_bt = L.o_out + n_out, L.n_ints = L.o_bt + L.n_bt;
        h_ints.assign(L.n_ints, 0);
        h_mask.clear();
        int t = 0, bt_at = 0, o = 0;
        for (int s = 0; s < n_seq; s++) {
            const SeqInput& in = batch[s];
            const int n = (int)in.tokens.size();
            h_ints[L.o_past + s] = in.n_past;
            h_ints[L.o_new + s] = n;
            h_ints[L.o_bto + s] = bt_at;
            h_ints[L.o_mo + s] = in.mask.empty() ? -1 : (int)h_mask.size();
            h_mask.insert(h_mask.end(), in.mask.begin(), in.mask.end());
            const int nb = (in.n_past + n + bs - 1) / bs;
            for (int b = 0; b < nb; b++) h_ints[L.o_bt + bt_at + b] = in.block_table[b];
            bt_at += nb;
            for (int i = 0; i < n; i++, t++) {
                const int slot = in.n_past + i;
                h_ints[L.o_tok + t] = in.tokens[i];
                h_ints[L.o_pos + t] = in.positions.empty() ? slot : in.positions[i];
                h_ints[L.o_slot + t] = in.block_table[slot / bs] * bs + slot % bs;
                h_ints[L.o_tseq + t] = s;
                h_ints[L.o_ti + t] = i;
            }
            if (n > 0 && in.logits == LogitsMode::ALL)
                for (int i = 0; i < n; i++) h_ints[L.o_out + o++] = t - n + i;
            else if (n > 0 && in.logits == LogitsMode::LAST)
                h_ints[L.o_out + o++] = t - 1;
        }
        return L;
    }

    // Queues the forward's kernels on `stream`, reading the tables at dev_ints / dev_mask (laid out
    // as L); the attention's shared memory is sized for attn_slots (>= L.max_slots). Makes no
    // allocation and no synchronising call: a decode graph captures exactly this.
    Expected<bool> launch(GpuKv& kv, const Layout& L, const int32_t* dev_ints, const uint8_t* dev_mask, int attn_slots) {
        const KvConfig& kc = kv.config();
        const int bs = kc.block_size, n_tok = L.n_tok, n_out = L.n_out;
        gpu::AttnBatch ab;
        ab.tok_seq = dev_ints + L.o_tseq;
        ab.tok_i = dev_ints + L.o_ti;
        ab.seq_n_past = dev_ints + L.o_past;
        ab.seq_n_new = dev_ints + L.o_new;
        ab.seq_bt_off = dev_ints + L.o_bto;
        ab.seq_mask_off = dev_ints + L.o_mo;
        ab.bt = dev_ints + L.o_bt;
        ab.mask = dev_mask;
        ab.max_slots = attn_slots;
        const int32_t* pos = dev_ints + L.o_pos;

        const int E = p.n_embd, HD = p.head_dim, NH = p.n_head, NKV = p.n_head_kv;
        const int QD = NH * HD, KVD = NKV * HD;
        const float scale = 1.0f / std::sqrt((float)HD);
        cudaStream_t st = stream;

        // ---- embeddings
        STEWARD_TRY(gpu::embed_rows(tok_embd.type, tok_embd.data, ggml_row_bytes(tok_embd.type, E), dev_ints + L.o_tok, n_tok, E, x, st));
        auto mm = [&](const DevMatrix& w, const float* in, float* out) {
            return gpu::gemm(blas, w.type, w.data, w.n_rows, w.n_cols, in, n_tok, x16, out);
        };
        for (int l = 0; l < n_layers; l++) {
            const DevLayer& D = layers[l];
            // -- attention block
            STEWARD_TRY(gpu::rmsnorm(x, D.attn_norm, p.rms_eps, E, n_tok, xn, st));
            STEWARD_TRY(mm(D.wq, xn, q));  // [n_tok][QD]
            STEWARD_TRY(mm(D.wk, xn, k));  // [n_tok][KVD]
            STEWARD_TRY(mm(D.wv, xn, v));  // [n_tok][KVD]
            if (D.bq) STEWARD_TRY(gpu::add_bias(q, D.bq, QD, n_tok, st));
            if (D.bk) STEWARD_TRY(gpu::add_bias(k, D.bk, KVD, n_tok, st));
            if (D.bv) STEWARD_TRY(gpu::add_bias(v, D.bv, KVD, n_tok, st));
            if (D.q_norm) STEWARD_TRY(gpu::rmsnorm(q, D.q_norm, p.rms_eps, HD, n_tok * NH, q, st));
            if (D.k_norm) STEWARD_TRY(gpu::rmsnorm(k, D.k_norm, p.rms_eps, HD, n_tok * NKV, k, st));
            STEWARD_TRY(gpu::rope(q, pos, n_tok, NH, HD, p.n_rot, p.rope_freq_base, p.rope_freq_scale, rope_factors, p.rope_type, st));
            STEWARD_TRY(gpu::rope(k, pos, n_tok, NKV, HD, p.n_rot, p.rope_freq_base, p.rope_freq_scale, rope_factors, p.rope_type, st));
            STEWARD_TRY(gpu::kv_write(k, v, dev_ints + L.o_slot, n_tok, KVD, kc.dtype_k, kc.dtype_v, kv.k_layer(l), kv.v_layer(l), st));
            STEWARD_TRY(gpu::attention(q, kv.k_layer(l), kv.v_layer(l), kc.dtype_k, kc.dtype_v, bs, NH, NKV, HD, scale, ab, n_tok, att, st));
            STEWARD_TRY(mm(D.wo, att, tmp));  // [n_tok][E]
            STEWARD_TRY(gpu::add(x, tmp, (int64_t)n_tok * E, st));
            // -- feed-forward block
            STEWARD_TRY(gpu::rmsnorm(x, D.ffn_norm, p.rms_eps, E, n_tok, xn, st));
            STEWARD_TRY(mm(D.w_gate, xn, gate));  // [n_tok][n_ff]
            STEWARD_TRY(mm(D.w_up, xn, up));      // [n_tok][n_ff]
            STEWARD_TRY(gpu::swiglu(gate, up, (int64_t)n_tok * p.n_ff, st));
            STEWARD_TRY(mm(D.w_down, gate, tmp));  // [n_tok][E]
            STEWARD_TRY(gpu::add(x, tmp, (int64_t)n_tok * E, st));
        }
        // ---- output head for the rows that want logits
        if (n_out == 0) return true;
        STEWARD_TRY(gpu::gather_rows(x, dev_ints + L.o_out, n_out, E, tmp, st));
        STEWARD_TRY(gpu::rmsnorm(tmp, output_norm, p.rms_eps, E, n_out, xn, st));
        STEWARD_TRY(gpu::gemm(blas, output.type, output.data, output.n_rows, output.n_cols, xn, n_out, x16, logits));
        return true;
    }

    // ---- decode graphs: a decode step (every sequence one new token, causal, its logits wanted)
    // replays a CUDA graph of launch() captured for its number of sequences and the attention's
    // slot bucket (its longest sequence rounded up to a power of two >= 256, past 8192 slots to a
    // multiple of 8192), over one KV pool. The graph's tables live in its own device buffer, sized
    // for the bucket's block tables, so every replay reads them at the addresses captured;
    // everything else launch() touches (weights, scratch, KV) is fixed for the forward's life.
    // Kernels read sequence lengths from the tables, so one graph serves every step of its bucket.
    // A shape's first step runs plainly (the warm-up PyTorch and vLLM do before a capture: lazily
    // loaded kernels and cuBLAS's choices for the shape are settled outside the capture); its
    // second is captured. Least recently used graphs are dropped past max_graphs.
    struct GraphKey {
        int n_seq = 0, slots = 0;
        uint64_t kv = 0;  // the KV pool's id
        bool operator==(const GraphKey&) const = default;
    };
    struct DecodeGraph {
        GraphKey key;
        int32_t* ints = nullptr;  // the tables, for the bucket's most block-table entries
        cudaGraphExec_t exec = nullptr;
        uint64_t used = 0;
    };
    std::vector<DecodeGraph> graphs;
    std::vector<GraphKey> warmed;  // shapes run once, plainly: the next step of one is captured
    int max_graphs = GpuForward::kDefaultMaxGraphs;
    uint64_t graph_clock = 0;
    GpuForward::GraphStats gstats;

    static void drop(DecodeGraph& g) {
        if (g.exec) cudaGraphExecDestroy(g.exec);
        if (g.ints) cudaFree(g.ints);
        g.exec = nullptr, g.ints = nullptr;
    }
    void drop_graphs() {
        for (DecodeGraph& g : graphs) drop(g);
        graphs.clear();
    }

    static bool decode_shaped(std::span<const SeqInput> batch) {
        for (const SeqInput& in : batch)
            if (in.tokens.size() != 1 || !in.mask.empty() || in.logits == LogitsMode::NONE) return false;
        return !batch.empty();
    }

    // Captures launch() for L's shape into g, reading its tables from g.ints (copied there before
    // each launch). Errors: what stream capture or instantiation refused; nothing is left captured
    // or queued.
    Expected<bool> capture(GpuKv& kv, const Layout& L, DecodeGraph& g) {
        cudaGraph_t graph = nullptr;
        if (const cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
            (void)cudaGetLastError();  // not left for the plain path's first launch check
            return cuda_error(e, "cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal)", __FILE__, __LINE__);
        }
        auto queued = launch(kv, L, g.ints, nullptr, g.key.slots);
        const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
        if (!queued || ended != cudaSuccess) {
            if (graph) cudaGraphDestroy(graph);
            (void)cudaGetLastError();  // the capture's error, not a later launch's
            if (!queued) return queued.error();
            return cuda_error(ended, "cudaStreamEndCapture(stream, &graph)", __FILE__, __LINE__);
        }
        const cudaError_t made = cudaGraphInstantiate(&g.exec, graph, 0);
        cudaGraphDestroy(graph);
        if (made != cudaSuccess) {
            (void)cudaGetLastError();
            g.exec = nullptr;
            return cuda_error(made, "cudaGraphInstantiate(&g.exec, graph, 0)", __FILE__, __LINE__);
        }
        return true;
    }

    // The decode step through a graph. Returns false (nothing queued) where this batch takes the
    // plain path: graphs off, or a capture refused (graphs are then off for this forward, the
    // reason kept in gstats.disabled).
    Expected<bool> run_graph(GpuKv& kv, const Layout& L) {
        if (max_graphs <= 0) return false;
        auto attn_slot_limit = gpu::attention_max_slots(p.head_dim);  // asked of the device once per process
        if (!attn_slot_limit) return attn_slot_limit.error();
        // Powers of two up to 8192 slots, then multiples of 8192: the attention's shared memory is
        // at most 32 KiB over what the step needs (a long context keeps its blocks per SM).
        int slots = 256;
        while (slots < L.max_slots && slots < 8192) slots *= 2;
        if (slots < L.max_slots) slots = (L.max_slots + 8191) / 8192 * 8192;
        slots = std::min(slots, *attn_slot_limit);
        if (slots < L.max_slots) return false;  // the plain path names the limit
        const GraphKey key{L.n_seq, slots, kv.id()};
        DecodeGraph* g = nullptr;
        for (DecodeGraph& c : graphs)
            if (c.key == key) g = &c;
        if (!g && std::find(warmed.begin(), warmed.end(), key) == warmed.end()) {
            if (warmed.size() >= 4 * (size_t)max_graphs + 16) warmed.clear();
            warmed.push_back(key);
            gstats.warmups++;
            return false;
        }
        if (!g) {
            if ((int)graphs.size() >= max_graphs) {
                auto lru = std::min_element(graphs.begin(), graphs.end(),
                                            [](const DecodeGraph& a, const DecodeGraph& b) { return a.used < b.used; });
                drop(*lru);
                graphs.erase(lru);
                gstats.evicted++;
            }
            DecodeGraph made;
            made.key = key;
            const int bs = kv.config().block_size;
            const size_t ints_cap = L.o_bt + (size_t)L.n_seq * (size_t)((slots + bs - 1) / bs);
            if (cudaMalloc(&made.ints, ints_cap * sizeof(int32_t)) != cudaSuccess) {
                (void)cudaGetLastError();  // out of device memory for the tables: this step runs plainly
                made.ints = nullptr;
                return false;
            }
            if (auto c = capture(kv, L, made); !c) {
                drop(made);
                gstats.disabled = c.error().message;
                max_graphs = 0;
                drop_graphs();
                return false;
            }
            gstats.captured++;
            graphs.push_back(made);
            g = &graphs.back();
        }
        g->used = ++graph_clock;
        CUDA_TRY(cudaMemcpyAsync(g->ints, h_ints.data(), L.n_ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
        CUDA_TRY(cudaGraphLaunch(g->exec, stream));
        gstats.replays++;
        return true;
    }

    // The forward up to the logits, left on the device in `logits` ([n_out][n_vocab]); returns n_out.
    Expected<int> run(GpuKv& kv, std::span<const SeqInput> batch) {
        const KvConfig& kc = kv.config();
        auto checked = check_batch(p, kc, n_layers, max_tokens, batch);
        if (!checked) return checked.error();
        const int n_out = *checked;
        const Layout L = build_tables(kc, batch, n_out);
        if (L.n_tok == 0) return n_out;
        if (decode_shaped(batch)) {
            const int64_t warm = gstats.warmups;
            auto graphed = run_graph(kv, L);
            if (!graphed) return graphed.error();
            if (*graphed) return n_out;
            if (gstats.warmups == warm) gstats.eager_decodes++;
        }
        STEWARD_TRY(ensure_tables(L.n_ints, std::max<size_t>(L.n_mask, 1)));
        CUDA_TRY(cudaMemcpyAsync(ints, h_ints.data(), L.n_ints * 4, cudaMemcpyHostToDevice, stream));
        if (L.n_mask) CUDA_TRY(cudaMemcpyAsync(mask, h_mask.data(), L.n_mask, cudaMemcpyHostToDevice, stream));
        STEWARD_TRY(launch(kv, L, ints, mask, L.max_slots));
        return n_out;
    }
};

// ---- GpuKv

GpuKv::GpuKv(const KvConfig& cfg) : cfg_(cfg) {
    static std::atomic<uint64_t> next{1};
    id_ = next.fetch_add(1);
}

Expected<std::unique_ptr<GpuKv>> GpuKv::create(const KvConfig& cfg) {
    std::unique_ptr<GpuKv> kv(new GpuKv(cfg));
    if (auto ok = check_kv_types(cfg, true); !ok) return ok.error();
    const int64_t n_slots = (int64_t)cfg.n_layer * cfg.n_blocks * cfg.block_size;
    const size_t kbytes = (size_t)(n_slots * cfg.k_slot_bytes()), vbytes = (size_t)(n_slots * cfg.v_slot_bytes());
    CUDA_TRY(cudaMalloc(&kv->k_, std::max<size_t>(kbytes, 1)));
    CUDA_TRY(cudaMalloc(&kv->v_, std::max<size_t>(vbytes, 1)));
    CUDA_TRY(cudaMemset(kv->k_, 0, kbytes));
    CUDA_TRY(cudaMemset(kv->v_, 0, vbytes));
    // cudaMemset runs on the legacy stream, which the forwards' non-blocking stream does not wait
    // for: finish it here, or a first forward's KV writes could be zeroed behind it. The legacy
    // stream alone, not the device: another engine's forward may be capturing a decode graph.
    CUDA_TRY(cudaStreamSynchronize(nullptr));
    return std::move(kv);
}

Expected<int> GpuKv::blocks_for_free_memory(const KvConfig& shape, double fraction) {
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    KvConfig one = shape;
    one.n_blocks = 1;
    const double n = std::floor(free_b * fraction / (double)kv_bytes(one));
    if (n < 1)
        return make_error("GPU KV: ", fraction, " of the device's ", (int64_t)free_b, " free bytes holds no block of ",
                          kv_bytes(one), " bytes; raise the fraction or free device memory");
    return (int)std::min(n, 1e9);
}

GpuKv::~GpuKv() {
    if (k_) cudaFree(k_);
    if (v_) cudaFree(v_);
    if (idx_) cudaFree(idx_);
    if (tmp_) cudaFree(tmp_);
}

void* GpuKv::k_layer(int l) const {
    return static_cast<uint8_t*>(k_) + (int64_t)cfg_.n_blocks * cfg_.block_size * cfg_.k_slot_bytes() * l;
}
void* GpuKv::v_layer(int l) const {
    return static_cast<uint8_t*>(v_) + (int64_t)cfg_.n_blocks * cfg_.block_size * cfg_.v_slot_bytes() * l;
}

Expected<bool> GpuKv::download(KvStorage& out) const {
    const int64_t n_slots = (int64_t)cfg_.n_layer * cfg_.n_blocks * cfg_.block_size;
    const size_t kbytes = (size_t)(n_slots * cfg_.k_slot_bytes()), vbytes = (size_t)(n_slots * cfg_.v_slot_bytes());
    if (out.bytes() != (int64_t)(kbytes + vbytes) || out.k_slot_bytes() != cfg_.k_slot_bytes())
        return make_error("GpuKv::download: host KV of ", out.bytes(), " bytes, expected ", (int64_t)(kbytes + vbytes));
    CUDA_TRY(cudaMemcpy(out.k_slot(0, 0, 0), k_, kbytes, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(out.v_slot(0, 0, 0), v_, vbytes, cudaMemcpyDeviceToHost));
    return true;
}

Expected<bool> GpuKv::upload(const KvStorage& in) {
    const int64_t n_slots = (int64_t)cfg_.n_layer * cfg_.n_blocks * cfg_.block_size;
    const size_t kbytes = (size_t)(n_slots * cfg_.k_slot_bytes()), vbytes = (size_t)(n_slots * cfg_.v_slot_bytes());
    if (in.bytes() != (int64_t)(kbytes + vbytes) || in.k_slot_bytes() != cfg_.k_slot_bytes())
        return make_error("GpuKv::upload: host KV of ", in.bytes(), " bytes, expected ", (int64_t)(kbytes + vbytes));
    CUDA_TRY(cudaMemcpy(k_, in.k_slot(0, 0, 0), kbytes, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(v_, in.v_slot(0, 0, 0), vbytes, cudaMemcpyHostToDevice));
    return true;
}

Expected<bool> GpuKv::export_block(int block, uint8_t* dst) const {
    if (block < 0 || block >= cfg_.n_blocks) return make_error("GpuKv::export_block: block ", block, " of ", cfg_.n_blocks);
    const size_t kb = (size_t)cfg_.block_size * (size_t)cfg_.k_slot_bytes(), vb = (size_t)cfg_.block_size * (size_t)cfg_.v_slot_bytes();
    for (int l = 0; l < cfg_.n_layer; l++) {
        CUDA_TRY(cudaMemcpy(dst, static_cast<const uint8_t*>(k_layer(l)) + kb * (size_t)block, kb, cudaMemcpyDeviceToHost));
        dst += kb;
        CUDA_TRY(cudaMemcpy(dst, static_cast<const uint8_t*>(v_layer(l)) + vb * (size_t)block, vb, cudaMemcpyDeviceToHost));
        dst += vb;
    }
    return true;
}

Expected<bool> GpuKv::import_block(int block, const uint8_t* src) {
    if (block < 0 || block >= cfg_.n_blocks) return make_error("GpuKv::import_block: block ", block, " of ", cfg_.n_blocks);
    const size_t kb = (size_t)cfg_.block_size * (size_t)cfg_.k_slot_bytes(), vb = (size_t)cfg_.block_size * (size_t)cfg_.v_slot_bytes();
    for (int l = 0; l < cfg_.n_layer; l++) {
        CUDA_TRY(cudaMemcpy(static_cast<uint8_t*>(k_layer(l)) + kb * (size_t)block, src, kb, cudaMemcpyHostToDevice));
        src += kb;
        CUDA_TRY(cudaMemcpy(static_cast<uint8_t*>(v_layer(l)) + vb * (size_t)block, src, vb, cudaMemcpyHostToDevice));
        src += vb;
    }
    return true;
}

Expected<bool> GpuKv::copy_slots(std::span<const int32_t> src_table, std::span<const int32_t> src_slots,
                                 std::span<const int32_t> dst_table, std::span<const int32_t> dst_slots) {
    const int n = (int)src_slots.size(), bs = cfg_.block_size;
    if (dst_slots.size() != src_slots.size()) return make_error("GpuKv::copy_slots: ", n, " sources for ", dst_slots.size(), " destinations");
    if (n == 0) return true;
    std::vector<int32_t> h(2 * (size_t)n);
    for (int i = 0; i < n; i++) {
        h[i] = src_table[src_slots[i] / bs] * bs + src_slots[i] % bs;
        h[n + i] = dst_table[dst_slots[i] / bs] * bs + dst_slots[i] % bs;
    }
    const size_t tmp_bytes = (size_t)n * (size_t)(cfg_.k_slot_bytes() + cfg_.v_slot_bytes());
    STEWARD_TRY(grow_device(idx_, idx_cap_, h.size()));
    STEWARD_TRY(grow_device(tmp_, tmp_cap_, tmp_bytes));
    // On the legacy stream, waited for before returning: the forwards (their own stream) have all
    // finished by the time the engine copies, and the next forward starts after this returns.
    CUDA_TRY(cudaMemcpy(idx_, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    for (int l = 0; l < cfg_.n_layer; l++)
        if (auto r = gpu::kv_copy_slots(idx_, idx_ + n, n, cfg_.k_slot_bytes(), cfg_.v_slot_bytes(), k_layer(l), v_layer(l), tmp_, nullptr); !r) {
            cudaStreamSynchronize(nullptr);  // the layers before it were queued
            return r.error();
        }
    CUDA_TRY(cudaStreamSynchronize(nullptr));
    return true;
}

// ---- GpuForward

GpuForward::GpuForward(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuForward::~GpuForward() = default;

Expected<std::unique_ptr<GpuForward>> GpuForward::create(const Model& model, int max_tokens, int n_layers) {
    auto impl = std::make_unique<Impl>();
    impl->p = model.params();
    STEWARD_TRY(impl->init(max_tokens, n_layers));
    if (auto u = impl->upload(model); !u) return make_error("uploading the weights to the GPU: ", u.error().message);
    return std::unique_ptr<GpuForward>(new GpuForward(std::move(impl)));
}

Expected<std::unique_ptr<GpuForward>> GpuForward::create_sharing(const GpuForward& source, int max_tokens, int n_layers) {
    const std::shared_ptr<Impl>& src = source.impl_;
    const int want = forward_layers(src->p, n_layers);
    if (want > src->n_layers)
        return make_error("GpuForward::create_sharing: ", want, " layers asked of a forward holding ", src->n_layers);
    auto impl = std::make_unique<Impl>();
    impl->p = src->p;
    STEWARD_TRY(impl->init(max_tokens, want));
    impl->tok_embd = src->tok_embd;
    impl->output = src->output;
    impl->output_norm = src->output_norm;
    impl->layers.assign(src->layers.begin(), src->layers.begin() + impl->n_layers);
    impl->source = src;
    return std::unique_ptr<GpuForward>(new GpuForward(std::move(impl)));
}

Expected<std::unique_ptr<GpuForward>> GpuForward::create_synthetic(const ModelParams& params, int max_tokens,
                                                                   uint64_t seed) {
    auto impl = std::make_unique<Impl>();
    impl->p = params;
    STEWARD_TRY(impl->init(max_tokens, 0));
    STEWARD_TRY(impl->synthesize(seed));
    return std::unique_ptr<GpuForward>(new GpuForward(std::move(impl)));
}

Expected<bool> GpuForward::forward(GpuKv& kv, std::span<const SeqInput> batch, std::vector<float>& logits) {
    auto n_out = impl_->run(kv, batch);
    if (!n_out) {
        // A launch that failed part-way left the kernels before it queued: let them finish so that
        // nothing after this (a KV copy on another stream) overlaps them.
        cudaStreamSynchronize(impl_->stream);
        return n_out.error();
    }
    logits.assign((size_t)*n_out * impl_->p.n_vocab, 0.0f);
    if (*n_out > 0)
        CUDA_TRY(cudaMemcpyAsync(logits.data(), impl_->logits, logits.size() * 4, cudaMemcpyDeviceToHost, impl_->stream));
    CUDA_TRY(cudaStreamSynchronize(impl_->stream));
    return true;
}

Expected<bool> GpuForward::forward_greedy(GpuKv& kv, std::span<const SeqInput> batch, std::vector<int32_t>& tokens) {
    auto n_out = impl_->run(kv, batch);
    if (!n_out) {
        cudaStreamSynchronize(impl_->stream);
        return n_out.error();
    }
    tokens.assign((size_t)*n_out, -1);
    if (*n_out > 0) {
        STEWARD_TRY(gpu::argmax_rows(impl_->logits, *n_out, impl_->p.n_vocab, impl_->argmax, impl_->stream));
        CUDA_TRY(cudaMemcpyAsync(tokens.data(), impl_->argmax, tokens.size() * 4, cudaMemcpyDeviceToHost, impl_->stream));
    }
    CUDA_TRY(cudaStreamSynchronize(impl_->stream));
    return true;
}

Expected<bool> GpuForward::synchronize() {
    CUDA_TRY(cudaStreamSynchronize(impl_->stream));
    return true;
}

int64_t GpuForward::device_bytes(const Model& model, int max_tokens, int n_layers, bool with_weights) {
    const ModelParams& p = model.params();
    // Impl::init's scratch: x, xn, q, att, k, v, gate, up, tmp and logits in F32, x16, argmax.
    const int64_t T = max_tokens, QD = (int64_t)p.n_head * p.head_dim, KVD = (int64_t)p.n_head_kv * p.head_dim;
    const int64_t wide = std::max<int64_t>({p.n_embd, p.n_ff, QD});
    int64_t b = T * (2 * p.n_embd + 2 * QD + 2 * KVD + 2 * p.n_ff + std::max<int64_t>(p.n_embd, QD) + p.n_vocab) * 4;
    b += T * wide * 2 + T * 4 + kCublasWorkspace;
    if (!with_weights) return b;
    // Impl::upload's weights.
    const ModelWeights& W = model.weights();
    const WeightView& te = W.tok_embd;
    b += embed_device_type(te.type) == te.type ? p_bytes(te) : matrix_device_bytes(te);
    if (!output_is_embedding(W)) b += matrix_device_bytes(W.output);
    b += (int64_t)p.n_embd * 4;
    for (int l = 0; l < forward_layers(p, n_layers); l++) {
        const LayerWeights& lw = W.layers[(size_t)l];
        for (const WeightView* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) b += matrix_device_bytes(*w);
        for (const WeightView* w : {&lw.attn_norm, &lw.ffn_norm, &lw.bq, &lw.bk, &lw.bv, &lw.q_norm, &lw.k_norm})
            b += w->n_cols * std::max<int64_t>(w->n_rows, 1) * 4;
    }
    return b;
}

void GpuForward::set_max_graphs(int max_graphs) {
    Impl& m = *impl_;
    m.max_graphs = std::max(0, max_graphs);
    if (m.max_graphs > 0) m.gstats.disabled.clear();
    // The most recently used are kept.
    std::sort(m.graphs.begin(), m.graphs.end(), [](const auto& a, const auto& b) { return a.used > b.used; });
    while ((int)m.graphs.size() > m.max_graphs) {
        Impl::drop(m.graphs.back());
        m.graphs.pop_back();
    }
}
const GpuForward::GraphStats& GpuForward::graph_stats() const { return impl_->gstats; }

const ModelParams& GpuForward::params() const { return impl_->p; }
int GpuForward::max_tokens() const { return impl_->max_tokens; }
int GpuForward::n_layers() const { return impl_->n_layers; }
int64_t GpuForward::weight_bytes() const { return impl_->weight_bytes; }

}  // namespace steward
