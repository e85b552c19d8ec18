// steward/expected.h (public): how every fallible Steward function answers: Expected<T>, a value
// or an Error whose message names the thing, the value and the fix.
// Header-only, standard library only. Thread-safety: a plain value type (like std::variant).
#pragma once
#include <stdexcept>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace steward {

// What kind of failure an Error is, for callers that act on it rather than show it: INVALID (the
// input can never succeed as given), OVERLOADED (no room now: retry later). The message is for people.
enum class ErrorCode { INVALID, OVERLOADED };

// A failure: `message` is for people (it names the file:line:column, key or value and the fix);
// `code` is for programs.
struct Error {
    std::string message;
    ErrorCode code = ErrorCode::INVALID;
};

// A value or an Error (std::expected is C++23). Test it with ok() / operator bool before reading:
// value(), operator* and operator-> throw std::runtime_error(error().message) when it holds an
// Error; error() must only be called when !ok() (it throws std::bad_variant_access otherwise).
template <typename T>
class Expected {
public:
    Expected(T value) : v_(std::move(value)) {}
    Expected(Error err) : v_(std::move(err)) {}
    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }
    T& value() {
        if (!ok()) throw std::runtime_error(error().message);
        return std::get<0>(v_);
    }
    const T& value() const {
        if (!ok()) throw std::runtime_error(error().message);
        return std::get<0>(v_);
    }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() { return value(); }
    const Error& error() const { return std::get<1>(v_); }

private:
    std::variant<T, Error> v_;
};

namespace detail {
// One part of a message: text as it is, numbers in decimal (never appended as a character code).
template <typename T>
void append_part(std::string& s, T&& part) {
    using U = std::remove_cv_t<std::remove_reference_t<T>>;
    if constexpr (std::is_same_v<U, bool>) {
        s += part ? "true" : "false";
    } else if constexpr (std::is_same_v<U, char>) {
        s += part;
    } else if constexpr (std::is_integral_v<U>) {
        s += std::to_string(part);
    } else if constexpr (std::is_floating_point_v<U>) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", (double)part);
        s += buf;
    } else {
        s += std::forward<T>(part);
    }
}
}  // namespace detail

// An INVALID Error whose message is the parts concatenated (strings as they are, numbers in decimal).
template <typename... Args>
Error make_error(Args&&... parts) {
    std::string s;
    (detail::append_part(s, std::forward<Args>(parts)), ...);
    return Error{std::move(s)};
}

// The same with a given code (e.g. ErrorCode::OVERLOADED).
template <typename... Args>
Error make_error_code(ErrorCode code, Args&&... parts) {
    Error e = make_error(std::forward<Args>(parts)...);
    e.code = code;
    return e;
}

}  // namespace steward
