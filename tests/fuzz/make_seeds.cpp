// Writes the GGUF seeds of tests/fuzz/corpus/fuzz_gguf (checked in; rerun after a format change):
// tiny synthetic models (runtime/model/synth.*, F32/Q8_0, llama/qwen2, tied or not) and a
// vocabulary-only file carrying one value of every GGUF type. Usage: fuzz_make_seeds <dir>
#include <cstdio>
#include <string>

#include "model/gguf.h"
#include "model/synth.h"

using namespace steward;

int main(int argc, char** argv) {
    if (argc != 2) return std::fprintf(stderr, "usage: %s <dir>\n", argv[0]), 2;
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
