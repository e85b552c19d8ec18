// Fuzzes the worker gate's BASP frame reader (runtime/cluster/basp_frame.h) on what a hostile peer
// sends, cut into reads of sizes the input picks. Invariants: what it passes on is always a prefix of
// what came in, byte for byte; it never passes a header that announces more than the limit, nor a
// byte past the end of a frame it accepted; after a refusal it passes nothing; and an independent
// walk over the frames agrees on where it stops.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cluster/basp_frame.h"

using namespace steward;

namespace {

void fail(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_basp_frame invariant broken: %s: %s\n", what, detail.c_str());
    std::abort();
}

// The shadow: how many bytes of `in` a correct reader passes on under `lim`, and whether it refuses.
size_t shadow_accepted(const uint8_t* in, size_t n, const BaspLimits& lim, bool& refused) {
    size_t pos = 0, passed = 0;
    uint64_t n_frames = 0;
    refused = false;
    while (pos + k_basp_header_size <= n) {
        const uint8_t op = in[pos];
        const uint32_t len =
            (uint32_t)in[pos + 4] << 24 | (uint32_t)in[pos + 5] << 16 | (uint32_t)in[pos + 6] << 8 | in[pos + 7];
        const uint32_t limit =
            n_frames == 0 ? std::min(lim.max_handshake_bytes, lim.max_frame_bytes) : lim.max_frame_bytes;
        if ((n_frames == 0 && op != k_basp_client_handshake) || op > k_basp_max_operation || len > limit) {
            refused = true;
            return passed;
        }
        n_frames++;
        pos += k_basp_header_size;
        const size_t take = std::min<size_t>(len, n - pos);
        pos += take;
        passed = pos;
        if (take < len) return passed;
    }
    return passed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) return 0;
    // Byte 0: the frame limit (small, so that payloads fit in an input); byte 1: read sizes' seed.
    BaspLimits lim;
    lim.max_frame_bytes = 1u + data[0] * 16u;
    lim.max_handshake_bytes = 1u + data[0] * 4u;
    uint32_t seed = data[1] | 1u;
    const uint8_t* in = data + 2;
    const size_t n = size - 2;

    BaspFrameReader r(lim);
    std::vector<uint8_t> out;
    size_t pos = 0;
    bool ok = true;
    while (pos < n) {
        seed = seed * 1103515245u + 12345u;
        const size_t chunk = std::min<size_t>(n - pos, 1 + (seed >> 16) % 97);
        const size_t before = out.size();
        ok = r.feed(in + pos, chunk, out);
        if (out.size() - before > chunk + k_basp_header_size)
            fail("appended more than a read plus a header", std::to_string(out.size() - before));
        pos += chunk;
        if (!ok) break;
    }
    if (!ok) {
        std::vector<uint8_t> more;
        const uint8_t zero[k_basp_header_size] = {};
        if (r.feed(zero, sizeof zero, more) || !more.empty()) fail("fed after a refusal", "it passed bytes on");
        if (r.error().empty()) fail("refused without an error", "");
    }
    if (out.size() > n || (!out.empty() && std::memcmp(out.data(), in, out.size()) != 0))
        fail("output is not a prefix of the input", std::to_string(out.size()));
    bool refused = false;
    const size_t want = shadow_accepted(in, n, lim, refused);
    if (refused == ok) fail("refusal disagrees with the shadow", refused ? "shadow refused" : "shadow accepted");
    if (out.size() != want)
        fail("passed a different number of bytes than the shadow",
             std::to_string(out.size()) + " vs " + std::to_string(want));
    return 0;
}
