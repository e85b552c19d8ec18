// The steward binary as a user runs it: synth a model, generate from it (same seed, same text),
// and clear errors (exit 1, one line naming the problem) for a corrupt model or a bad config.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
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

std::string tmp_dir() {
    auto d = std::filesystem::temp_directory_path() / ("steward-cli-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d.string();
}

}  // namespace

TEST_CASE("model synth then generate prints text, and the same seed gives the same output twice", "[cli]") {
    const std::string d = tmp_dir();
    const std::string m = d + "/m.gguf";
    Run s = run("model synth -o " + m + " --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 512 --ctx 256");
    REQUIRE(s.rc == 0);
    const std::string gen = "generate -m " + m + " -p \"Once upon a time\" -n 24 --temp 0.9 --top-p 0.95 -t 1 --ids";
    Run a = run(gen + " --seed 5"), b = run(gen + " --seed 5"), c = run(gen + " --seed 6");
    REQUIRE(a.rc == 0);
    REQUIRE(b.rc == 0);
    // The output is the prompt, the generated text, a line of ids and a speed line on stderr.
    auto body = [](const std::string& o) { return o.substr(0, o.find("prompt ")); };
    CHECK(body(a.out).rfind("Once upon a time", 0) == 0);
    CHECK(body(a.out).size() > std::string("Once upon a time\n").size() + 10);
    CHECK(body(a.out) == body(b.out));
    CHECK(body(a.out) != body(c.out));
    // An empty prompt starts from BOS alone.
    Run e = run("generate -m " + m + " -p \"\" -n 8 --temp 0 -t 1 --ids");
    CHECK(e.rc == 0);
    // A draft keeps the first layers.
    Run dr = run("model synth -o " + d + "/draft.gguf --draft-from " + m + " --keep-layers 1");
    CHECK(dr.rc == 0);
    CHECK(run("generate -m " + d + "/draft.gguf -p hi -n 4 --temp 0 -t 1").rc == 0);
    std::filesystem::remove_all(d);
}

TEST_CASE("a corrupt model, a missing file and a bad config give one clear error line and exit 1", "[cli]") {
    const std::string d = tmp_dir();
    {
        std::ofstream f(d + "/bad.gguf", std::ios::binary);
        f << "GGUF\x03\x00\x00\x00garbage";
    }
    Run a = run("generate -m " + d + "/bad.gguf -p hi -n 4");
    CHECK(a.rc == 1);
    CHECK_THAT(a.out, Catch::Contains("steward: error:") && Catch::Contains("bad.gguf"));
    Run b = run("generate -m " + d + "/nope.gguf -p hi -n 4");
    CHECK(b.rc == 1);
    CHECK_THAT(b.out, Catch::Contains("cannot open"));
    {
        std::ofstream f(d + "/bad.toml");
        f << "[[pool]]\nname = \"p\"\nmodel = \"m.gguf\"\nmax_batch = -1\n";
    }
    Run c = run("config check " + d + "/bad.toml");
    CHECK(c.rc == 1);
    CHECK_THAT(c.out, Catch::Contains("bad.toml:4:13") && Catch::Contains("max_batch"));
    std::filesystem::remove_all(d);
}

TEST_CASE("steward --version prints the project version and exits 0", "[cli]") {
    Run v = run("--version");
    CHECK(v.rc == 0);
    CHECK(v.out == "steward " STEWARD_VERSION "\n");
}

TEST_CASE("hostile CLI input gets one clear error line and exit 1, never an abort or a hang", "[cli][hostile]") {
    const std::string d = tmp_dir() + "-hostile";
    std::filesystem::create_directories(d);
    const std::string m = d + "/m.gguf";
    // A model claiming a 2^24-token context: generate sizes KV for the request, not for that.
    REQUIRE(run("model synth -o " + m + " --dim 64 --layers 1 --heads 2 --kv-heads 2 --ffn 128 --vocab 512 --ctx 16777216").rc == 0);
    Run ok = run("generate -m " + m + " -p hi -n 4 --temp 0 -t 1");
    CHECK(ok.rc == 0);
    Run t = run("generate -m " + m + " -p hi -n 4 -t 100000");
    CHECK(t.rc == 1);
    CHECK_THAT(t.out, Catch::Contains("steward: error: -t/--threads is 100000"));
    for (const char* bad : {"--temp nan", "--temp -1", "--top-p 0", "--top-p nan", "--top-k -2"}) {
        Run s = run("generate -m " + m + " -p hi -n 4 " + bad);
        INFO(bad << ": " << s.out);
        CHECK(s.rc == 1);
        CHECK_THAT(s.out, Catch::Contains("steward: error:") && Catch::Contains("it must be"));
    }
    // Seeds: -1 draws a random one (llama.cpp's convention) and prints it; nothing wraps around.
    for (const char* bad : {"--seed -2", "--seed 18446744073709551616", "--seed 1e3", "--seed abc"}) {
        Run s = run("generate -m " + m + " -p hi -n 2 " + bad);
        INFO(bad << ": " << s.out);
        CHECK(s.rc != 0);
        CHECK_THAT(s.out, Catch::Contains("is not a seed"));
    }
    Run rs = run("generate -m " + m + " -p hi -n 2 --seed -1");
    CHECK(rs.rc == 0);
    CHECK_THAT(rs.out, Catch::Contains("--seed -1 drew seed"));
    // The generated workload's knobs.
    for (const char* bad : {"--rate -1", "--rate inf", "--scale 0", "--scale nan", "--requests 0"}) {
        Run s = run(std::string("run ") + bad + " -o " + d + "/r.json");
        INFO(bad << ": " << s.out);
        CHECK(s.rc == 1);
        CHECK_THAT(s.out, Catch::Contains("steward: error: --"));
    }
    // FIFOs: nobody writes them, so any blocking open would hang the test (ctest's timeout).
    const std::string fifo = d + "/fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    Run g = run("generate -m " + fifo + " -p hi -n 4");
    CHECK(g.rc == 1);
    CHECK_THAT(g.out, Catch::Contains("not a regular file"));
    Run c = run("config check " + fifo);
    CHECK(c.rc == 1);
    CHECK_THAT(c.out, Catch::Contains("not a regular file"));
    Run w = run("run -c " + fifo + " -w " + fifo + " -o " + d + "/r.json");
    CHECK(w.rc == 1);
    CHECK_THAT(w.out, Catch::Contains("workload file") && Catch::Contains("not a regular file"));
    // What `run` would abort on, `config check` refuses with file:line:column.
    struct Case {
        std::string toml, want;
    };
    const std::vector<Case> cases = {
        {"kv_blocks = 4294967297\n", "c.toml:4:13: [[pool]].kv_blocks is 4294967297, out of range"},
        {"kv_blocks = true\n", "c.toml:4:13: [[pool]].kv_blocks must be an integer, got a boolean"},
        {"kv_blocks = 2147483647\n", "c.toml:4:13: [[pool]].kv_blocks is 2147483647"},
        {"max_batch_tokens = 2147483647\n", "c.toml:4:20: [[pool]].max_batch_tokens is 2147483647"},
        {"threads = 100000\n", "c.toml:4:11: [[pool]].threads is 100000"},
        {"price_prompt = nan\n", "c.toml:4:16: [[pool]].price_prompt is nan"},
        {"[pool.synth]\ndraft_from = \"p\"\nkeep_layers = 1\n", "c.toml:4:1: [pool.synth] of pool 'p': draft_from names the pool itself"},
    };
    for (const auto& k : cases) {
        {
            std::ofstream f(d + "/c.toml");
            f << "[[pool]]\nname = \"p\"\nmodel = \"m.gguf\"\n" << k.toml;
        }
        Run r = run("config check " + d + "/c.toml");
        INFO(k.toml << ": " << r.out);
        CHECK(r.rc == 1);
        CHECK_THAT(r.out, Catch::Contains(k.want));
    }
    std::filesystem::remove_all(d);
}

TEST_CASE("model info names the shape, the tensor types and the roofline figures, and refuses what cannot load", "[cli][model_info]") {
    const std::string d = tmp_dir() + "-info";
    std::filesystem::create_directories(d);
    const std::string m = d + "/m.gguf";
    REQUIRE(run("model synth -o " + m + " --dim 128 --layers 3 --heads 4 --kv-heads 2 --ffn 256 --vocab 512 --ctx 1024 --dtype q8_0").rc == 0);
    Run r = run("model info " + m);
    INFO(r.out);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Catch::Contains("architecture  llama"));
    CHECK_THAT(r.out, Catch::Contains("dim 128, 3 layers, 4 heads, 2 KV heads, head dim 32, ffn 256, vocab 512, context 1024"));
    CHECK_THAT(r.out, Catch::Contains("Q8_0: "));
    CHECK_THAT(r.out, Catch::Contains("chat template no"));
    // KV per token in F16: 2 (K, V) x 3 layers x 2 KV heads x 32 dims x 2 bytes.
    CHECK_THAT(r.out, Catch::Contains("(" + std::to_string(2 * 3 * 2 * 32 * 2) + " bytes in F16"));
    // The weight bytes per decoded token: the loaded model's own figure (a second path).
    auto model = steward::Model::load(m);
    REQUIRE(model);
    CHECK_THAT(r.out, Catch::Contains("(" + std::to_string((*model)->weight_bytes_per_token()) + " bytes: every matrix once"));
    Run bad = run("model info " + d + "/missing.gguf");
    CHECK(bad.rc == 1);
    CHECK_THAT(bad.out, Catch::Contains("steward: error:"));
    std::filesystem::remove_all(d);
}

TEST_CASE("generate on a llama-quantize k-quant file prints llama.cpp's greedy ids", "[cli][quant]") {
    // Q3_K_M (q3_K, q4_K, q5_K, q6_K mixed): its 32 greedy steps have no near-tie (our top-2
    // margin stays above 0.15 logits), so activation quantization in llama.cpp cannot flip one.
    const std::string base = std::string(STEWARD_TESTDATA_DIR) + "/quant/synth-Q3_K_M";
    std::ifstream ref(base + ".greedy.txt");
    REQUIRE(ref);
    std::string line, want;
    while (std::getline(ref, line))
        if (line.rfind("greedy: ", 0) == 0) want = line.substr(8);
    REQUIRE(!want.empty());
    Run r = run("generate -m " + base + ".gguf -p \"the quick brown fox jumps over the lazy dog\" -n 32 --temp 0 -t 1 --ids");
    REQUIRE(r.rc == 0);
    CHECK(r.out.find("\n" + want + "\n") != std::string::npos);
}
