// Fuzzes the KV disk tier's block file reader (runtime/kv/kv_tier.h: parse_tier_header,
// check_tier_file) on whatever a file in the tier directory may hold. Invariants: no crash or
// sanitizer report; every refusal has a message; a header that parses re-encodes to the same 96 bytes;
// a file that passes its check has this identity, its exact size and a payload whose CRC-32 (computed
// here independently) is the stored one; and a file written from the input's fields passes, with
// every single-byte change of it refused.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_kv_tier.h"

using namespace steward;

namespace {

void fail(const char* what) {
    std::fprintf(stderr, "fuzz_kv_tier_file invariant broken: %s\n", what);
    std::abort();
}

// CRC-32 (IEEE, reflected 0xEDB88320), bit by bit: independent of the zlib the reader uses.
uint32_t crc32_reference(const uint8_t* p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

uint64_t take_u64(const uint8_t*& p, size_t& n) {
    uint64_t v = 0;
    for (int i = 0; i < 8 && n > 0; i++, p++, n--) v |= (uint64_t)*p << (8 * i);
    return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const KvTierIdentity& id = steward_fuzz::k_kv_tier_identity;
    const std::span<const uint8_t> in(data, size);

    auto h = parse_tier_header(in);
    if (!h) {
        if (h.error().message.empty()) fail("a header refusal with no message");
    } else {
        if (size < k_tier_header_bytes) fail("a header parsed from fewer than 96 bytes");
        if (h->payload_bytes < 0 || h->meta.depth < 0 || h->meta.n_hits < 0)
            fail("a parsed header holds a negative size");
        const auto again = encode_tier_header(*h);
        if (again.size() != k_tier_header_bytes || std::memcmp(again.data(), data, k_tier_header_bytes) != 0)
            fail("a parsed header does not re-encode to its bytes");
    }

    auto f = check_tier_file(in, id);
    if (!f) {
        if (f.error().message.empty()) fail("a file refusal with no message");
    } else {
        if (!h) fail("a file passed whose header does not parse");
        if (f->layout != id.layout || f->salts != id.salts || f->payload_bytes != id.payload_bytes)
            fail("a file of another identity passed");
        if (size != k_tier_header_bytes + (size_t)id.payload_bytes) fail("a file of the wrong size passed");
        if (crc32_reference(data + k_tier_header_bytes, size - k_tier_header_bytes) != f->payload_crc32)
            fail("a file whose payload CRC differs passed");
    }

    // A file written from the input's fields (the rest of the input is its payload, cut or padded).
    const uint8_t* p = data;
    size_t n = size;
    TierFileHeader w;
    w.layout = id.layout, w.salts = id.salts;
    w.meta.hash = take_u64(p, n);
    const uint64_t fields = take_u64(p, n);
    w.meta.tenant = (int32_t)(fields & 0xffffffffu);
    w.meta.depth = (int32_t)((fields >> 32) & 0x7fffffffu);
    w.meta.is_public = (fields >> 63) != 0;
    w.meta.n_hits = (int64_t)(take_u64(p, n) >> 1);
    w.payload_bytes = id.payload_bytes;
    std::vector<uint8_t> payload((size_t)id.payload_bytes, 0);
    std::memcpy(payload.data(), p, std::min(n, payload.size()));
    w.payload_crc32 = crc32_reference(payload.data(), payload.size());
    std::vector<uint8_t> file = encode_tier_header(w);
    file.insert(file.end(), payload.begin(), payload.end());
    auto ok = check_tier_file(file, id);
    if (!ok) fail("a file written from valid fields is refused");
    if (ok->meta.hash != w.meta.hash || ok->meta.tenant != w.meta.tenant || ok->meta.depth != w.meta.depth ||
        ok->meta.is_public != w.meta.is_public || ok->meta.n_hits != w.meta.n_hits)
        fail("a written file reads back other fields");
    // CRC-32 catches every burst of up to 32 bits: a changed byte anywhere is refused.
    if (size > 0) {
        const size_t at = (size_t)data[0] * 257 % file.size();
        file[at] ^= (uint8_t)(data[size - 1] | 1);
        if (check_tier_file(file, id).ok()) fail("a file with a changed byte passed");
    }
    return 0;
}
