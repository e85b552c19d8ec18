// `steward serve` as a user runs it: the binary on a config with port 0 prints the address it got,
// says "ready" once the models are loaded, serves, and exits 0 on SIGTERM. The test reads the
// process's own output to know when it is ready (no polling, no sleeps).
#include <fmt/format.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include "test_paths.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "process_temp_dir.h"
#include "serve_process.h"

namespace {

const std::filesystem::path& temp_dir() {
    static const steward_test::ProcessTempDir dir("steward_test_http_cli_");
    return dir.path();
}

// One plain HTTP/1.0 exchange over a socket; the whole answer (the server closes after it).
std::string http_get(int port, const std::string& path) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    REQUIRE(::connect(fd, (sockaddr*)&a, sizeof a) == 0);
    const std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
    REQUIRE(::write(fd, req.data(), req.size()) == (ssize_t)req.size());
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, (size_t)n);
    ::close(fd);
    return out;
}

}  // namespace

TEST_CASE("steward serve prints its address, serves once ready and exits 0 on SIGTERM", "[http][cli]") {
    const std::string cfg = (temp_dir() / "serve.toml").string();
    {
        std::ofstream f(cfg);
        f << fmt::format(R"(
[reload]
watch = false
[server]
port = 0
[[pool]]
name = "tiny"
model = "{}/tiny.gguf"
threads = 1
kv_blocks = 32
[pool.synth]
dim = 64
layers = 1
heads = 4
kv_heads = 2
ffn = 128
vocab = 512
ctx = 256
[[bucket]]
name = "default"
pool = "tiny"
)",
                         temp_dir().string());
    }
    steward_test::ServeProcess s(cfg);
    const std::string health = http_get(s.port, "/health");
    CHECK(health.rfind("HTTP/1.0 200", 0) == 0);
    CHECK(health.find("{\"status\":\"ok\"}") != std::string::npos);
    const std::string models = http_get(s.port, "/v1/models");
    CHECK(models.find("\"id\":\"tiny\"") != std::string::npos);
    s.stop();  // SIGTERM: exits 0
}
