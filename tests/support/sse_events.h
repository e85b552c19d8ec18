// Server-sent events with event lines (`event: T` / `data: {...}`), split into events: for the
// tests of the chat dialects (/v1/responses, /v1/messages) that read their streams.
#pragma once
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace steward::test {

struct SseEvent {
    std::string name;  // the `event:` line
    nlohmann::json data;
};

inline std::vector<SseEvent> sse_events(const std::string& sse) {
    std::vector<SseEvent> out;
    std::istringstream in(sse);
    std::string line, name;
    while (std::getline(in, line)) {
        if (line.rfind("event: ", 0) == 0)
            name = line.substr(7);
        else if (line.rfind("data: ", 0) == 0)
            out.push_back({name, nlohmann::json::parse(line.substr(6))});
    }
    return out;
}

}  // namespace steward::test
