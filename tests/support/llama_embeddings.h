// llama.cpp's llama-embedding vectors for the real test models (tests/data/embeddings, whose README
// gives the command), read for the tests that check Steward's embeddings against them.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace steward_test {

struct LlamaEmbedding {
    std::string model;    // file name in the shared testdata's real/
    std::string pooling;  // mean, last, cls
    std::string prompt;
    std::vector<int32_t> ids;  // llama.cpp's tokens (BOS added)
    std::vector<float> vec;    // unit length
};

// Every row of the fixture; with model / pooling given, only those rows (in the fixture's prompt order).
inline std::vector<LlamaEmbedding> llama_embeddings(const std::string& model = "", const std::string& pooling = "") {
    std::ifstream in(std::string(STEWARD_SOURCE_DIR) + "/tests/data/embeddings/llama_embedding.tsv");
    REQUIRE(in.good());
    std::vector<LlamaEmbedding> out;
    for (std::string line; std::getline(in, line);) {
        std::vector<std::string> c;
        std::stringstream ss(line);
        for (std::string x; std::getline(ss, x, '\t');) c.push_back(x);
        REQUIRE(c.size() == 5);
        if ((!model.empty() && c[0] != model) || (!pooling.empty() && c[1] != pooling)) continue;
        LlamaEmbedding r{c[0], c[1], c[2], {}, {}};
        std::istringstream ids(c[3]), vec(c[4]);
        for (int32_t id; ids >> id;) r.ids.push_back(id);
        for (float v; vec >> v;) r.vec.push_back(v);
        out.push_back(std::move(r));
    }
    return out;
}

inline double cosine(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); i++)
        ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / std::sqrt(aa * bb);
}

}  // namespace steward_test
