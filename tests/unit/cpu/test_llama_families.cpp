// The families whose GGUFs say `llama` but bring another tokenizer (as llama.cpp converts them):
// SmolLM (StarCoder's BPE, pre-tokenizer smollm), DeepSeek-R1's Llama distills (Llama 3's BPE,
// llama-bpe), Mistral 7B (SentencePiece). A synth llama block with each family's vocabulary from
// testdata/tokenizers loads, tokenizes with the family's pre-tokenizer, and runs.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>
#include "test_paths.h"

#include "cpu/forward.h"
#include "kv/kv_storage.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"

using namespace steward;

namespace {

// Synth weights for the vocabulary's size, the vocabulary's tokenizer.* keys (pre overridden).
std::unique_ptr<Model> llama_with_vocab(const std::string& vocab_file, const std::string& arch, const std::string& pre) {
    auto vocab = GgufFile::open((std::filesystem::path(STEWARD_TESTDATA_DIR) / "tokenizers" / vocab_file).string());
    REQUIRE(vocab.ok());
    auto tokens = (*vocab)->get_string_array("tokenizer.ggml.tokens");
    REQUIRE(tokens);
    SynthSpec s;
    s.arch = arch;
    s.n_embd = 32;
    s.n_layer = 1;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.n_ff = 64;
    s.n_vocab = (int)tokens->size();
    s.n_ctx = 128;
    s.tied_output = true;
    auto synth = synth_model(s);
    REQUIRE(synth.ok());
    auto weights = GgufFile::from_bytes(synth->to_bytes());
    REQUIRE(weights.ok());
    GgufWriter w;
    for (const auto& [key, v] : (*weights)->metadata())
        if (key != "general.alignment" && key.rfind("tokenizer.", 0) != 0) REQUIRE(w.set_value(key, v).ok());
    for (const auto& [key, v] : (*vocab)->metadata())
        if (key.rfind("tokenizer.", 0) == 0 && key != "tokenizer.ggml.pre") REQUIRE(w.set_value(key, v).ok());
    if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
    for (const auto& t : (*weights)->tensors())
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                     std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    auto file = GgufFile::from_bytes(w.to_bytes());
    REQUIRE(file.ok());
    auto m = Model::from_gguf(std::move(file.value()));
    INFO(vocab_file << ": " << (m.ok() ? std::string("ok") : m.error().message));
    REQUIRE(m.ok());
    return std::move(m.value());
}

}  // namespace

TEST_CASE("llama-architecture files with the SmolLM, DeepSeek-R1-distill and Mistral tokenizers load and run",
          "[forward][families]") {
    struct Family {
        const char* name;
        const char* vocab;
        const char* arch;
        const char* pre;  // empty: a SentencePiece vocabulary has none
    };
    const Family families[] = {
        {"SmolLM", "ggml-vocab-starcoder.gguf", "llama", "smollm"},
        {"DeepSeek-R1-Distill-Llama", "ggml-vocab-llama-bpe.gguf", "llama", "llama-bpe"},
        {"Mistral 7B", "ggml-vocab-llama-spm.gguf", "llama", ""},
        {"Mistral 7B (a converter that writes `mistral`)", "ggml-vocab-llama-spm.gguf", "mistral", ""},
    };
    for (const Family& fam : families) {
        INFO(fam.name);
        auto model = llama_with_vocab(fam.vocab, fam.arch, fam.pre);
        CHECK(model->params().arch == fam.arch);
        CHECK(model->params().rope_type == RopeType::NORM);
        const std::vector<int32_t> ids = model->tokenizer().encode("Hello world, 12345!", true);
        REQUIRE(ids.size() >= 3);
        CHECK_THAT(model->tokenizer().decode(ids), Catch::Contains("Hello world, 12345!"));
        CpuForward fwd(*model, 1, 64);
        KvStorage kv(KvStorage::config_for(model->params(), 2, 16, KvDtype::F32));
        const std::vector<int32_t> table = {0, 1};
        SeqInput in;
        in.tokens = ids;
        in.block_table = table;
        in.logits = LogitsMode::LAST;
        std::vector<float> logits;
        auto r = fwd.forward(kv, std::span<const SeqInput>(&in, 1), logits);
        INFO((r.ok() ? std::string("ok") : r.error().message));
        REQUIRE(r.ok());
        REQUIRE((int)logits.size() == model->params().n_vocab);
        for (float x : logits) REQUIRE(std::isfinite(x));
    }
}
