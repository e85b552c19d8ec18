// Fuzzes the TOML config loader (parse_config on the input as TOML text). Invariants: nothing
// throws out of it; an error always names a location (fuzz.toml:LINE:COLUMN, or "fuzz.toml: " for
// what concerns the whole file, e.g. no [[pool]] at all); a config it accepts
// has a pool and a bucket, and classify() picks one of its buckets.
#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "config/config.h"

using namespace steward;

namespace {

void fail(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_config invariant broken: %s: %s\n", what, detail.c_str());
    std::abort();
}

// "fuzz.toml:<digits>:<digits>" somewhere in the message, or "fuzz.toml: " (the whole file).
bool names_location(const std::string& m) {
    const std::string src = "fuzz.toml:";
    if (m.find("fuzz.toml: ") != std::string::npos) return true;
    for (size_t at = m.find(src); at != std::string::npos; at = m.find(src, at + 1)) {
        size_t i = at + src.size(), d1 = i;
        while (i < m.size() && std::isdigit((unsigned char)m[i])) i++;
        if (i == d1 || i >= m.size() || m[i] != ':') continue;
        size_t d2 = ++i;
        while (i < m.size() && std::isdigit((unsigned char)m[i])) i++;
        if (i > d2) return true;
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    spdlog::set_level(spdlog::level::off);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size > 16384) return 0;
    const std::string text(reinterpret_cast<const char*>(data), size);
    Expected<Config> c = make_error("unset");
    try {
        c = parse_config(text, "fuzz.toml");
    } catch (const std::exception& e) {
        fail("parse_config threw", e.what());
    } catch (...) {
        fail("parse_config threw", "a non-standard exception");
    }
    if (!c) {
        if (!names_location(c.error().message)) fail("an error names no location", c.error().message);
        return 0;
    }
    if (c->pools.empty() || c->buckets.empty()) fail("an accepted config", "has no pool or no bucket");
    RequestFeatures f;
    f.hint = c->buckets.front().name;
    f.prompt_tokens = (int)size;
    if (classify(*c, f) >= c->buckets.size()) fail("classify", "picked a bucket that does not exist");
    return 0;
}
