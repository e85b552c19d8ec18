// The quantized dot products' level-independent part: the exact-path switch. The kernels are
// quant_dot_body.inc, compiled per kernel level and dispatched by cpu/dispatch.cpp.
#include "cpu/quant_dot.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace steward {

namespace {

std::atomic<bool>& exact_flag() {
    static std::atomic<bool> flag{[] {
        const char* v = std::getenv("STEWARD_EXACT_QUANT");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }()};
    return flag;
}

}  // namespace

bool exact_quant() { return exact_flag().load(std::memory_order_relaxed); }
void set_exact_quant(bool on) { exact_flag().store(on, std::memory_order_relaxed); }

}  // namespace steward
