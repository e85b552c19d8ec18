// [cluster]'s trust keys: TLS files go together and must exist, insecure_loopback only with loopback
// workers, the bounds' ranges; each error names the key and the fix.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "config/config.h"

using namespace steward;

namespace {

std::string remote_pool(const std::string& address) {
    return "[[pool]]\nname = \"w\"\nremote = \"" + address + "\"\n";
}

}  // namespace

TEST_CASE("cluster trust keys: defaults, TLS files together, insecure_loopback only with loopback workers",
          "[config]") {
    auto d = parse_config(remote_pool("10.0.0.5:7600"), "<string>");
    REQUIRE(d.ok());
    CHECK_FALSE(d->cluster.tls());
    CHECK_FALSE(d->cluster.insecure_loopback);
    CHECK(d->cluster.max_frame_bytes == 64ll << 20);
    CHECK(d->cluster.max_connections == 64);
    CHECK(d->cluster.max_pending_bytes == 256ll << 20);

    auto lo = parse_config("[cluster]\ninsecure_loopback = true\nmax_frame_bytes = 1048576\nmax_connections = 8\n" +
                               remote_pool("127.0.0.1:7600"),
                           "<string>");
    REQUIRE(lo.ok());
    CHECK(lo->cluster.insecure_loopback);
    CHECK(lo->cluster.max_frame_bytes == 1048576);
    CHECK(lo->cluster.max_connections == 8);

    const auto dir = std::filesystem::temp_directory_path() / "steward_test_cluster_config";
    std::filesystem::create_directories(dir);
    for (const char* f : {"c.pem", "k.pem", "ca.pem"}) std::ofstream(dir / f) << "x\n";
    const std::string tls = "tls_cert = \"" + (dir / "c.pem").string() + "\"\ntls_key = \"" + (dir / "k.pem").string() +
                            "\"\ntls_ca = \"" + (dir / "ca.pem").string() + "\"\n";
    auto t = parse_config("[cluster]\n" + tls + remote_pool("10.0.0.5:7600"), "<string>");
    REQUIRE(t.ok());
    CHECK(t->cluster.tls());

    const std::pair<std::string, const char*> bad[] = {
        {"[cluster]\ninsecure_loopback = true\n" + remote_pool("10.0.0.5:7600"),
         "insecure_loopback = true allows only loopback"},
        {"[cluster]\ntls_cert = \"" + (dir / "c.pem").string() + "\"\n", "missing: tls_key tls_ca"},
        {"[cluster]\n" + tls + "insecure_loopback = true\n", "remove insecure_loopback"},
        {"[cluster]\ntls_cert = \"/nonexistent/c.pem\"\ntls_key = \"/nonexistent/k.pem\"\ntls_ca = "
         "\"/nonexistent/ca.pem\"\n",
         "tls_cert '/nonexistent/c.pem' is not a file"},
        {"[cluster]\nmax_frame_bytes = 100\n", "max_frame_bytes is 100"},
        {"[cluster]\nmax_frame_bytes = 4294967296\n", "max_frame_bytes is 4294967296"},
        {"[cluster]\nmax_frame_bytes = 1048576\nmax_pending_bytes = 65536\n",
         "max_pending_bytes (65536) is below max_frame_bytes"},
        {"[cluster]\nmax_connections = 0\n", "max_connections is 0"},
    };
    for (const auto& [text, want] : bad) {
        auto c = parse_config(text, "<string>");
        INFO(text);
        REQUIRE_FALSE(c.ok());
        INFO(c.error().message);
        CHECK(c.error().message.find(want) != std::string::npos);
    }
    std::filesystem::remove_all(dir);
}
