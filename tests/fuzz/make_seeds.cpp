// Writes the GGUF seeds of tests/fuzz/corpus/fuzz_gguf (checked in; rerun after a format change):
// tiny synthetic models (runtime/model/synth.*, F32/Q8_0, llama/qwen2, tied or not) and a
// vocabulary-only file carrying one value of every GGUF type. With a second directory, also the KV
// tier block files of tests/fuzz/corpus/fuzz_kv_tier_file (valid for fuzz_kv_tier.h's identity).
// Usage: fuzz_make_seeds <gguf dir> [kv tier dir]
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_kv_tier.h"
#include "model/gguf.h"
#include "model/synth.h"

using namespace steward;

namespace {

// Block files of the fuzz identity: a private block, a public one, and a header alone.
int write_kv_tier_seeds(const std::string& dir) {
    const KvTierIdentity& id = steward_fuzz::k_kv_tier_identity;
    struct Seed {
        const char* name;
        TierBlockMeta meta;
        bool with_payload;
    } seeds[] = {{"block-tenant3.kvb", {0x0123456789abcdefull, 3, false, 2, 5}, true},
                 {"block-public.kvb", {0xfedcba9876543210ull, -1, true, 0, 0}, true},
                 {"header-only.kvb", {0x1111111111111111ull, 0, false, 7, 1}, false}};
    for (const Seed& s : seeds) {
        std::vector<uint8_t> payload((size_t)id.payload_bytes);
        for (size_t i = 0; i < payload.size(); i++) payload[i] = (uint8_t)(i * 37 + s.meta.hash);
        TierFileHeader h;
        h.layout = id.layout, h.salts = id.salts, h.meta = s.meta, h.payload_bytes = id.payload_bytes;
        h.payload_crc32 = (uint32_t)crc32(0, payload.data(), (uInt)payload.size());
        std::vector<uint8_t> file = encode_tier_header(h);
        if (s.with_payload) file.insert(file.end(), payload.begin(), payload.end());
        std::ofstream f(dir + "/" + s.name, std::ios::binary | std::ios::trunc);
        f.write((const char*)file.data(), (std::streamsize)file.size());
        if (!f) return std::fprintf(stderr, "%s/%s: cannot write\n", dir.c_str(), s.name), 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2 && argc != 3) return std::fprintf(stderr, "usage: %s <gguf dir> [kv tier dir]\n", argv[0]), 2;
    if (argc == 3)
        if (int rc = write_kv_tier_seeds(argv[2]); rc != 0) return rc;
    const std::string dir = argv[1];
    struct Seed {
        const char* name;
        const char* arch;
        GgmlType dtype;
        bool tied;
        int n_head_kv;
    } seeds[] = {{"synth-llama-q8.gguf.seed", "llama", GgmlType::Q8_0, false, 2},
                 {"synth-qwen2-q8-tied.gguf.seed", "qwen2", GgmlType::Q8_0, true, 1},
                 {"synth-llama-f32-tied.gguf.seed", "llama", GgmlType::F32, true, 2}};
    for (const Seed& s : seeds) {
        SynthSpec spec;
        spec.arch = s.arch;
        spec.n_embd = 32, spec.n_layer = 1, spec.n_head = 2, spec.n_head_kv = s.n_head_kv, spec.n_ff = 64;
        spec.n_vocab = s.dtype == GgmlType::F32 ? 354 : 400, spec.n_ctx = 64;
        spec.dtype = s.dtype, spec.tied_output = s.tied;
        if (auto ok = synth_write(spec, dir + "/" + s.name); !ok)
            return std::fprintf(stderr, "%s: %s\n", s.name, ok.error().message.c_str()), 1;
    }
    GgufWriter w;
    w.set_u32("general.alignment", 64);
    w.set_string("general.architecture", "llama");
    w.set_i32("llama.context_length", 16);
    w.set_u64("llama.big", 1ull << 40);
    w.set_f32("llama.rope.freq_base", 10000.0f);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "llama-bpe");
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "<|end|>", "\xC4\xA0"});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 3, 1});
    w.set_string_array("tokenizer.ggml.merges", {"a b"});
    w.set_f32_array("tokenizer.ggml.scores", {0, 0, -1, 0, 0});
    w.set_i32("tokenizer.ggml.eos_token_id", 3);
    w.add_tensor("t.weight", GgmlType::F32, {4, 2}, std::vector<uint8_t>(32, 0x3f));
    if (auto ok = w.write(dir + "/vocab-only-every-type.gguf.seed", 64); !ok)
        return std::fprintf(stderr, "vocab: %s\n", ok.error().message.c_str()), 1;
    return 0;
}
