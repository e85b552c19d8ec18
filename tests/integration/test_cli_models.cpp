// The CLI on the model families and file types users hold: `model synth --arch qwen3` and
// `--dtype q4_k_m`, then `model info` and `generate` on what it wrote.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "model/model.h"
#include "run_command.h"

namespace {

using Run = steward_test::CommandResult;

Run run(const std::string& args) {
    Run r = steward_test::run_steward(args);
    REQUIRE(r.rc != -1);
    return r;
}

std::string tmp_dir(const std::string& tag) {
    auto d = std::filesystem::temp_directory_path() / ("steward-cli-models-" + std::to_string(getpid()) + "-" + tag);
    std::filesystem::create_directories(d);
    return d.string();
}

}  // namespace

TEST_CASE("model synth --arch qwen3 writes a model that model info and generate accept", "[cli][qwen3]") {
    const std::string d = tmp_dir("qwen3");
    const std::string m = d + "/q3.gguf";
    // Head size 32 with dim 64 and 4 heads: not dim / heads, as in the real Qwen3 0.6B.
    Run w = run("model synth -o " + m + " --arch qwen3 --dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ffn 128 --vocab 400 --ctx 256");
    INFO(w.out);
    REQUIRE(w.rc == 0);
    Run info = run("model info " + m);
    INFO(info.out);
    REQUIRE(info.rc == 0);
    CHECK_THAT(info.out, Catch::Contains("architecture  qwen3"));
    CHECK_THAT(info.out, Catch::Contains("dim 64, 2 layers, 4 heads, 2 KV heads, head dim 32, ffn 128, vocab 400, context 256"));
    // KV per token in F16: 2 (K, V) x 2 layers x 2 KV heads x 32 dims x 2 bytes.
    CHECK_THAT(info.out, Catch::Contains("(" + std::to_string(2 * 2 * 2 * 32 * 2) + " bytes in F16"));
    auto model = steward::Model::load(m);
    REQUIRE(model);
    CHECK_THAT(info.out, Catch::Contains("(" + std::to_string((*model)->weight_bytes_per_token()) + " bytes: every matrix once"));
    Run gen = run("generate -m " + m + " -p \"the cat\" -n 6 --temp 0 -t 1 --ids");
    INFO(gen.out);
    CHECK(gen.rc == 0);
    std::filesystem::remove_all(d);
}

TEST_CASE("model synth --arch phi3 with RoPE scaling writes a model whose scaling model info names and generate runs",
          "[cli][phi3]") {
    const std::string d = tmp_dir("phi3");
    const std::string m = d + "/phi3.gguf";
    Run w = run("model synth -o " + m +
                " --arch phi3 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 400 --ctx 256 --rope-scale 4 "
                "--rope-freqs-ramp 8");
    INFO(w.out);
    REQUIRE(w.rc == 0);
    Run info = run("model info " + m);
    INFO(info.out);
    REQUIRE(info.rc == 0);
    CHECK_THAT(info.out, Catch::Contains("architecture  phi3"));
    CHECK_THAT(info.out, Catch::Contains("rope          freq base 10000, 16 dims; linear scaling, angles / 4; "
                                         "per-pair factors (rope_freqs.weight, 8)"));
    Run gen = run("generate -m " + m + " -p \"the cat\" -n 6 --temp 0 -t 1 --ids");
    INFO(gen.out);
    CHECK(gen.rc == 0);
    std::filesystem::remove_all(d);
}

TEST_CASE("model synth --dtype q4_k_m writes llama-quantize's mix, and generate runs it", "[cli][quantize]") {
    const std::string d = tmp_dir("q4km");
    const std::string m = d + "/q4km.gguf";
    Run w = run("model synth -o " + m + " --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 --ctx 256 --dtype q4_k_m");
    INFO(w.out);
    REQUIRE(w.rc == 0);
    Run info = run("model info " + m);
    INFO(info.out);
    REQUIRE(info.rc == 0);
    // Q4_K: 2 x 7 matrices + token_embd + output, less the 3 in Q6_K (blk.1's attn_v and ffn_down, the output).
    CHECK_THAT(info.out, Catch::Contains("Q4_K: 13 tensors"));
    CHECK_THAT(info.out, Catch::Contains("Q6_K: 3 tensors"));
    CHECK_THAT(info.out, Catch::Contains("F32: 5 tensors"));
    Run gen = run("generate -m " + m + " -p \"the cat\" -n 6 --temp 0 -t 1 --ids");
    INFO(gen.out);
    CHECK(gen.rc == 0);
    Run bad = run("model synth -o " + d + "/bad.gguf --dim 96 --heads 4 --kv-heads 2 --ffn 128 --vocab 512 --dtype q6_k");
    CHECK(bad.rc != 0);
    CHECK_THAT(bad.out, Catch::Contains("multiples of 256"));
    Run unknown = run("model synth -o " + d + "/bad.gguf --dtype q3_k_s");
    CHECK(unknown.rc != 0);
    CHECK_THAT(unknown.out, Catch::Contains("q4_k_m"));
    std::filesystem::remove_all(d);
}

TEST_CASE("model synth --arch bert writes an encoder that model info describes, embed runs and generate refuses",
          "[cli][encoder]") {
    const std::string d = tmp_dir("bert");
    const std::string m = d + "/bert.gguf";
    Run w = run("model synth -o " + m + " --arch bert --dim 64 --layers 2 --heads 4 --kv-heads 4 --ffn 128 --vocab 512 --ctx 64");
    INFO(w.out);
    REQUIRE(w.rc == 0);
    Run info = run("model info " + m);
    INFO(info.out);
    REQUIRE(info.rc == 0);
    CHECK_THAT(info.out, Catch::Contains("architecture  bert"));
    CHECK_THAT(info.out, Catch::Contains("encoder       bidirectional attention, absolute positions, pooling cls"));
    CHECK_THAT(info.out, !Catch::Contains("rope "));  // absolute positions: no RoPE line
    Run e = run("embed -m " + m + " -t 1 \"the cat\" \"a dog\"");
    INFO(e.out);
    REQUIRE(e.rc == 0);
    // Two JSON arrays of 64 unit-length floats, one per line.
    int n_vectors = 0;
    std::istringstream lines(e.out);
    for (std::string line; std::getline(lines, line);) {
        if (line.empty() || line[0] != '[') continue;
        auto v = nlohmann::json::parse(line);
        REQUIRE(v.size() == 64);
        double ss = 0;
        for (const auto& x : v) ss += x.get<double>() * x.get<double>();
        CHECK(std::abs(ss - 1.0) < 1e-5);
        n_vectors++;
    }
    CHECK(n_vectors == 2);
    Run gen = run("generate -m " + m + " -p \"the cat\" -n 4");
    INFO(gen.out);
    CHECK(gen.rc != 0);
    CHECK_THAT(gen.out, Catch::Contains("is an encoder (bert)") && Catch::Contains("steward embed"));
    std::filesystem::remove_all(d);
}

TEST_CASE("model synth --arch gemma2 and gemma3 write models whose window model info names and generate runs",
          "[cli][gemma]") {
    const std::string d = tmp_dir("gemma");
    for (const std::string arch : {"gemma2", "gemma3"}) {
        INFO(arch);
        const std::string m = d + "/" + arch + ".gguf";
        Run w = run("model synth -o " + m + " --arch " + arch +
                    " --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 400 --ctx 256 --sliding-window 16");
        INFO(w.out);
        REQUIRE(w.rc == 0);
        Run info = run("model info " + m);
        INFO(info.out);
        REQUIRE(info.rc == 0);
        CHECK_THAT(info.out, Catch::Contains("architecture  " + arch));
        CHECK_THAT(info.out, Catch::Contains(arch == "gemma2" ? "window        16 tokens on 1 of every 2 layers; "
                                                                "attention soft-cap 50; logit soft-cap 30"
                                                              : "window        16 tokens on 5 of every 6 layers"));
        Run gen = run("generate -m " + m + " -p \"the cat\" -n 6 --temp 0 -t 1 --ids");
        INFO(gen.out);
        CHECK(gen.rc == 0);
    }
    std::filesystem::remove_all(d);
}

TEST_CASE("model synth --arch qwen3moe and mixtral write mixtures of experts that model info counts by active experts "
          "and generate runs",
          "[cli][moe]") {
    const std::string d = tmp_dir("moe");
    for (const std::string arch : {"qwen3moe", "mixtral"}) {
        INFO(arch);
        const std::string m = d + "/" + arch + ".gguf";
        Run w = run("model synth -o " + m + " --arch " + arch +
                    " --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --experts 4 --experts-used 2 --vocab 400 --ctx 256");
        INFO(w.out);
        REQUIRE(w.rc == 0);
        Run info = run("model info " + m);
        INFO(info.out);
        REQUIRE(info.rc == 0);
        CHECK_THAT(info.out, Catch::Contains(arch == "mixtral" ? "architecture  llama" : "architecture  qwen3moe"));
        CHECK_THAT(info.out, Catch::Contains("experts       4 per layer, 2 per token"));
        auto model = steward::Model::load(m);
        REQUIRE(model);
        // The loader's count (active experts) is model info's.
        CHECK_THAT(info.out, Catch::Contains("(" + std::to_string((*model)->weight_bytes_per_token()) +
                                             " bytes: every matrix once, the active experts only"));
        Run gen = run("generate -m " + m + " -p \"the cat\" -n 6 --temp 0 -t 1 --ids");
        INFO(gen.out);
        CHECK(gen.rc == 0);
    }
    std::filesystem::remove_all(d);
}
