// The synthetic encoder files and llama.cpp's embeddings of them (tests/data/encoders, whose README
// gives the command), shared by the unit and HTTP tests that check Steward against them.
#pragma once
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/synth.h"
#include "test_paths.h"

namespace steward_test {

// The files of tests/data/encoders/llama_embeddings.tsv (its script: `steward model synth --arch ARCH
// --dim 128 --layers 2 --heads 4 --kv-heads 4 --ffn FFN --vocab 1024 --ctx 512 --seed 41`, FFN 512 for
// bert and 384 for nomic-bert).
inline steward::SynthSpec encoder_spec(const std::string& arch, steward::GgmlType dtype) {
    steward::SynthSpec s;
    s.arch = arch;
    s.n_embd = 128;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 4;
    s.n_ff = arch == "bert" ? 512 : 384;
    s.n_vocab = 1024;
    s.n_ctx = 512;
    s.seed = 41;
    s.dtype = dtype;
    return s;
}

struct EncoderRow {
    std::string arch, dtype;
    int text = 0;              // index in the script's texts
    std::vector<int32_t> ids;  // llama.cpp's tokens ([CLS] ... [SEP])
    std::vector<float> vec;    // its unit-length embedding
};

inline std::vector<EncoderRow> encoder_reference_rows() {
    std::ifstream in(std::string(STEWARD_SOURCE_DIR) + "/tests/data/encoders/llama_embeddings.tsv");
    REQUIRE(in.good());
    std::vector<EncoderRow> out;
    for (std::string line; std::getline(in, line);) {
        std::vector<std::string> c;
        std::stringstream ss(line);
        for (std::string x; std::getline(ss, x, '\t');) c.push_back(x);
        REQUIRE(c.size() == 5);
        EncoderRow r{c[0], c[1], std::stoi(c[2]), {}, {}};
        std::istringstream ids(c[3]), vec(c[4]);
        for (int32_t id; ids >> id;) r.ids.push_back(id);
        for (float v; vec >> v;) r.vec.push_back(v);
        out.push_back(std::move(r));
    }
    REQUIRE(out.size() == 24);
    return out;
}

}  // namespace steward_test
