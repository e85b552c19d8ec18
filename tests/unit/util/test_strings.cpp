// String helpers: split_host_port against hand-written cases (IPv6 brackets, port range, junk).
#include <catch2/catch.hpp>

#include "util/strings.h"

using namespace steward;

TEST_CASE("split_host_port splits at the last colon and range-checks the port", "[strings]") {
    std::string host;
    int port = -1;
    CHECK(split_host_port("10.0.0.5:7600", host, port));
    CHECK(host == "10.0.0.5");
    CHECK(port == 7600);
    CHECK(split_host_port("[::1]:65535", host, port));
    CHECK(host == "[::1]");
    CHECK(port == 65535);
    CHECK(split_host_port("h:0", host, port, 0));  // an ephemeral port where the caller allows it
    CHECK(port == 0);
    for (const char* bad : {"h:0", "h:65536", "h:", ":80", "h", "", "h:8o", "h:-1", "h:+80", "h:123456", "h: 80"}) {
        INFO(bad);
        CHECK_FALSE(split_host_port(bad, host, port));
    }
    CHECK(split_list("a,,b") == std::vector<std::string>{"a", "b"});
}
