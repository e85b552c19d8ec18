// Error handling for the cores: functions that read untrusted input return Expected<T>;
// the message names the thing, the value and the fix (STYLE.md habit 6).
#pragma once
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace steward {

// What kind of failure an Error is, for callers that act on it rather than show it: INVALID (the
// input can never succeed as given), OVERLOADED (no room now: retry later). The message is for people.
enum class ErrorCode { INVALID, OVERLOADED };

struct Error {
    std::string message;
    ErrorCode code = ErrorCode::INVALID;
};

// A value or an Error. Small on purpose: std::expected is C++23.
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

template <typename... Args>
Error make_error(Args&&... parts) {
    std::string s;
    ((s += parts), ...);
    return Error{std::move(s)};
}

template <typename... Args>
Error make_error_code(ErrorCode code, Args&&... parts) {
    Error e = make_error(std::forward<Args>(parts)...);
    e.code = code;
    return e;
}

}  // namespace steward
