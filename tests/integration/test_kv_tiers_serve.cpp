// The disk KV tier across restarts, as a user meets it: `steward serve` with [pool.kv_tiers] answers
// a 1,000-token prompt, is stopped (SIGTERM: the pool's cached blocks go to disk), started again,
// and answers the same prompt from disk (usage.prompt_tokens_details.cached_tokens covers its full
// blocks) with the same output. A corrupted block file is dropped with a warning and the answer is
// still the same; another tenant's identical prompt gets nothing from any tier.
#include <fmt/format.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "http_client.h"
#include "serve_process.h"
#include "process_temp_dir.h"
#include "test_paths.h"

namespace {

const std::filesystem::path& temp_dir() {
    static const steward_test::ProcessTempDir dir("steward_test_kv_tiers_serve_");
    return dir.path();
}

struct Answer {
    std::string text;
    int cached = -1;
};

Answer complete(int port, const std::string& key, const std::vector<int>& prompt) {
    const nlohmann::json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
    const auto r = steward_test::post((uint16_t)port, "/v1/completions", body, {{"Authorization", "Bearer " + key}});
    INFO(r.body.substr(0, 400));
    REQUIRE(r.status == 200);
    const auto j = r.j();
    return {j["choices"][0]["text"].get<std::string>(), j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>()};
}

}  // namespace

TEST_CASE("a disk KV tier answers a long prompt again after a restart", "[kv_tiers][http][cli]") {
    const std::filesystem::path dir = temp_dir() / "kv";
    const std::string cfg = (temp_dir() / "serve.toml").string();
    {
        std::ofstream f(cfg);
        f << fmt::format(R"(
[reload]
watch = false
[server]
port = 0
[[tenant]]
name = "alice"
api_keys = ["key-alice"]
[[tenant]]
name = "bob"
api_keys = ["key-bob"]
[[pool]]
name = "tiny"
model = "{0}/tiny.gguf"
threads = 1
kv_blocks = 80
block_size = 16
[pool.synth]
dim = 64
layers = 2
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 1100
[pool.kv_tiers]
disk_gib = 0.5
disk_dir = "{0}/kv"
[[bucket]]
name = "default"
pool = "tiny"
)",
                         temp_dir().string());
    }
    std::vector<int> prompt;
    for (int i = 0; i < 1000; i++) prompt.push_back(3 + (i * 7919 + i / 13) % 500);
    const int full = (1000 - 1) / 16 * 16;  // every full block but the one holding the last token

    Answer first;
    {
        steward_test::ServeProcess s(cfg);
        first = complete(s.port, "key-alice", prompt);
        CHECK(first.cached == 0);
        s.stop();
    }
    struct stat st{};
    REQUIRE(::lstat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().extension() == ".kvb") files.push_back(e.path());
    CHECK(files.size() >= (size_t)(full / 16));

    {
        steward_test::ServeProcess s(cfg);
        const Answer again = complete(s.port, "key-alice", prompt);
        CHECK(again.cached == full);
        CHECK(again.text == first.text);
        // Another tenant's identical prompt hashes to other blocks: nothing from the pool or a tier.
        const Answer other = complete(s.port, "key-bob", prompt);
        CHECK(other.cached == 0);
        CHECK(other.text == first.text);
        s.stop();
    }

    // Corrupt one block file's bytes (past the 96-byte header): it is dropped, never served.
    REQUIRE(!files.empty());
    const std::filesystem::path victim = files[files.size() / 2];
    {
        std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
        REQUIRE(f);
        f.seekg(200);
        char c = 0;
        f.read(&c, 1);
        c = (char)(c ^ 0x5a);
        f.seekp(200);
        f.write(&c, 1);
    }
    {
        steward_test::ServeProcess s(cfg);
        const Answer after = complete(s.port, "key-alice", prompt);
        CHECK(after.cached < full);
        CHECK(after.text == first.text);
        s.stop();
        INFO(s.log);
        CHECK(s.log.find(victim.filename().string()) != std::string::npos);  // the warning names the file
    }
}
