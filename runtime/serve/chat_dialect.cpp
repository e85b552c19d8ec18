// What the chat dialects (chat_dialect.h) share: SSE framing with event lines, and which stop
// string ended an output.
#include "serve/chat_dialect.h"

#include <random>

namespace steward::serve {

std::string sse_typed_event(const std::string& type, const nlohmann::json& data) {
    return "event: " + type + "\ndata: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

std::string matched_stop(const std::string& text, const std::string& full, const std::vector<std::string>& stops) {
    // The runtime cuts the text where the first stop string begins, so when the detokenized output
    // reads the same up to there, the stop begins right at the cut. Otherwise (a tokenizer whose
    // whole-sequence decoding differs from the streamed one) the text holds no stop string, and the
    // first one found in `full` is the one.
    const bool same = full.size() >= text.size() && full.compare(0, text.size(), text) == 0;
    size_t best = std::string::npos;
    std::string which;
    for (const std::string& s : stops) {
        if (s.empty()) continue;
        const size_t p =
            same ? (full.compare(text.size(), s.size(), s) == 0 ? text.size() : std::string::npos) : full.find(s);
        if (p < best) best = p, which = s;
    }
    return which;
}

nlohmann::ordered_json template_arguments(const std::string& arguments) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(arguments, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return arguments;
    return j;
}

const char* json_kind(const nlohmann::ordered_json& v) {
    switch (v.type()) {
        case nlohmann::ordered_json::value_t::null: return "null";
        case nlohmann::ordered_json::value_t::boolean: return "a boolean";
        case nlohmann::ordered_json::value_t::number_integer:
        case nlohmann::ordered_json::value_t::number_unsigned: return "an integer";
        case nlohmann::ordered_json::value_t::number_float: return "a number";
        case nlohmann::ordered_json::value_t::string: return "a string";
        case nlohmann::ordered_json::value_t::array: return "an array";
        case nlohmann::ordered_json::value_t::object: return "an object";
        default: return "a value";
    }
}

std::string random_id(size_t n) {
    // Seeded once per thread: a std::random_device per id would read the kernel's entropy each time.
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char k_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    std::string s;
    s.reserve(n);
    while (s.size() < n) s += k_chars[rng() % 62];
    return s;
}

}  // namespace steward::serve
