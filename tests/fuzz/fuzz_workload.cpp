// Fuzzes the workload JSONL parser (parse_workload). Invariants: nothing throws out of it; an error
// names the line ("workload line N: ..."); an accepted workload's prompts all resolve
// (prompt_text never throws), and write_workload's text parses back equal.
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "workload/workload.h"

using namespace steward;

namespace {

void fail(const char* what, const std::string& detail) {
    std::fprintf(stderr, "fuzz_workload invariant broken: %s: %s\n", what, detail.c_str());
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    spdlog::set_level(spdlog::level::off);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size > 16384) return 0;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    Expected<Workload> w = make_error("unset");
    try {
        w = parse_workload(text);
    } catch (const std::exception& e) {
        fail("parse_workload threw", e.what());
    }
    if (!w) {
        if (w.error().message.rfind("workload line ", 0) != 0) fail("an error names no line", w.error().message);
        return 0;
    }
    std::string written;
    try {
        for (const WorkloadRequest& r : w->requests) (void)w->prompt_text(r);
        written = write_workload(*w);
    } catch (const std::exception& e) {
        fail("an accepted workload throws when used", e.what());
    }
    auto again = parse_workload(written);
    if (!again) fail("write_workload's text does not parse back", again.error().message);
    if (!(*again == *w)) fail("write_workload's text parses back different", written);
    return 0;
}
