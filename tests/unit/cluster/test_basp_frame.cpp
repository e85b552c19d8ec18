// The worker gate's BASP frame reader: headers decode as CAF writes them; a frame over the limit is
// refused before any of it is passed on; a stream cut anywhere passes on exactly the same bytes.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "cluster/basp_frame.h"
#include "util/strings.h"

using namespace steward;

namespace {

std::vector<uint8_t> header(uint8_t op, uint32_t len, uint64_t dst = 0) {
    std::vector<uint8_t> h(k_basp_header_size, 0);
    h[0] = op;
    for (int i = 0; i < 4; i++) h[4 + i] = (uint8_t)(len >> (24 - 8 * i));
    for (int i = 0; i < 8; i++) h[24 + i] = (uint8_t)(dst >> (56 - 8 * i));
    return h;
}

std::vector<uint8_t> frame(uint8_t op, uint32_t len, uint64_t dst = 0) {
    auto f = header(op, len, dst);
    for (uint32_t i = 0; i < len; i++) f.push_back((uint8_t)i);
    return f;
}

std::vector<uint8_t> cat(std::initializer_list<std::vector<uint8_t>> parts) {
    std::vector<uint8_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

}  // namespace

TEST_CASE("a BASP header decodes big-endian, as CAF 0.17 serializes it", "[cluster]") {
    auto h = header(2, 0x01020304u, 0x0a0b0c0d0e0f1011ull);
    const BaspHeader d = decode_basp_header(h.data());
    CHECK(d.operation == 2);
    CHECK(d.payload_len == 0x01020304u);
    CHECK(d.dest_actor == 0x0a0b0c0d0e0f1011ull);
}

TEST_CASE("frames within the limits pass on byte for byte, however the reads cut them", "[cluster]") {
    const auto in = cat({frame(1, 40), frame(2, 1000, 7), frame(6, 0), frame(3, 3, 9)});
    for (size_t cut : {1, 5, 31, 32, 33, 100, 4096}) {
        BaspFrameReader r(BaspLimits{2048, 64});
        std::vector<uint8_t> out;
        for (size_t i = 0; i < in.size(); i += cut) REQUIRE(r.feed(in.data() + i, std::min(cut, in.size() - i), out));
        INFO("cut " << cut);
        CHECK(out == in);
        CHECK(r.n_frames() == 4);
        CHECK(r.n_payload_left() == 0);
    }
}

TEST_CASE("a header is held back until it is whole and accepted", "[cluster]") {
    BaspFrameReader r(BaspLimits{});
    const auto h = header(1, 0);
    std::vector<uint8_t> out;
    REQUIRE(r.feed(h.data(), 31, out));
    CHECK(out.empty());
    REQUIRE(r.feed(h.data() + 31, 1, out));
    CHECK(out == h);
}

TEST_CASE("a frame announcing 4 GiB is refused at its header, and nothing of it passes on", "[cluster]") {
    // The probe's attack: a front's handshake with its length set to 0xffffffff.
    {
        BaspFrameReader r(BaspLimits{});
        const auto h = header(1, 0xffffffffu);
        std::vector<uint8_t> out;
        CHECK_FALSE(r.feed(h.data(), h.size(), out));
        CHECK(out.empty());
        CHECK(r.error().find("handshake") != std::string::npos);
    }
    // After a good handshake: a message over max_frame_bytes. The handshake passed; the message's
    // header does not, and the reader stays closed.
    {
        BaspFrameReader r(BaspLimits{1 << 20, 64 << 10});
        const auto in = cat({frame(1, 10), header(2, 0xffffffffu, 1)});
        std::vector<uint8_t> out;
        CHECK_FALSE(r.feed(in.data(), in.size(), out));
        CHECK(out.size() == k_basp_header_size + 10);
        CHECK(r.error().find("max_frame_bytes") != std::string::npos);
        const auto more = frame(6, 0);
        CHECK_FALSE(r.feed(more.data(), more.size(), out));
        CHECK(out.size() == k_basp_header_size + 10);
    }
}

TEST_CASE("a first frame that is not a client handshake, or an unknown operation, is refused", "[cluster]") {
    std::vector<uint8_t> out;
    BaspFrameReader a(BaspLimits{});
    const auto http = std::string("GET / HTTP/1.1\r\nHost: worker:7600\r\n\r\n");
    CHECK_FALSE(a.feed((const uint8_t*)http.data(), http.size(), out));
    CHECK(out.empty());
    BaspFrameReader b(BaspLimits{});
    const auto in = cat({frame(1, 0), frame(9, 0)});
    CHECK_FALSE(b.feed(in.data(), in.size(), out));
    CHECK(out.size() == k_basp_header_size);
}

TEST_CASE("loopback hosts are told from the others", "[cluster]") {
    for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"}) CHECK(is_loopback_host(h));
    for (const char* h :
         {"0.0.0.0", "10.0.0.5", "127.0.0.1.example.com", "localhost.evil", "", "::", "[::]", "1.127.0.0"})
        CHECK_FALSE(is_loopback_host(h));
}
