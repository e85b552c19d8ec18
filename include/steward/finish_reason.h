// steward/finish_reason.h (public): how a request ended, one typed enum from the engine to the C API
// (never a string compared to a string). Standard library only; every function is pure and
// thread-safe.
#pragma once
#include <optional>
#include <string_view>

namespace steward {

// STOP: end-of-sequence; LENGTH: max_tokens or the context; CANCELLED: by the caller; TIMEOUT: the
// request passed its deadline; ERROR: invalid request or a failure while serving it (the error
// text says which); OVERLOADED: refused at admission (the pool's queue is full), retry later.
enum class FinishReason { STOP, LENGTH, CANCELLED, TIMEOUT, ERROR, OVERLOADED };
inline constexpr int n_finish_reasons = 6;

// "stop", "length", "cancelled", "timeout", "error", "overloaded": for output only (logs, JSON,
// metric labels); code compares the enum.
constexpr const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::STOP: return "stop";
        case FinishReason::LENGTH: return "length";
        case FinishReason::CANCELLED: return "cancelled";
        case FinishReason::TIMEOUT: return "timeout";
        case FinishReason::ERROR: return "error";
        case FinishReason::OVERLOADED: return "overloaded";
    }
    return "unknown";
}

// The inverse of finish_reason_name, for text coming in from outside (files, HTTP); nullopt for
// anything else.
inline std::optional<FinishReason> parse_finish_reason(std::string_view s) {
    for (int i = 0; i < n_finish_reasons; ++i)
        if (s == finish_reason_name(static_cast<FinishReason>(i))) return static_cast<FinishReason>(i);
    return std::nullopt;
}

// STOP and LENGTH: the request was served; the others were not (or not fully).
constexpr bool finish_reason_ok(FinishReason r) { return r == FinishReason::STOP || r == FinishReason::LENGTH; }

}  // namespace steward
