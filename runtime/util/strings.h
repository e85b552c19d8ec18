// Small string helpers shared by the CLI, the workload generator and the benches.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace steward {

// The items of a separated list ("a,b,,c" -> a, b, c): empty items are dropped.
inline std::vector<std::string> split_list(std::string_view s, char sep = ',') {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos <= s.size()) {
        size_t end = s.find(sep, pos);
        if (end == std::string_view::npos) end = s.size();
        if (end > pos) out.emplace_back(s.substr(pos, end - pos));
        pos = end + 1;
    }
    return out;
}

// "host:port" split at its last colon (so "[::1]:7600" works), with the port in [min_port, 65535];
// false when there is no host, no port or the port is not a number in range.
inline bool split_host_port(const std::string& s, std::string& host, int& port, int min_port = 1) {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == s.size() || s.size() - colon - 1 > 5) return false;
    int p = 0;
    for (size_t i = colon + 1; i < s.size(); i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        p = p * 10 + (s[i] - '0');
    }
    if (p < min_port || p > 65535) return false;
    host = s.substr(0, colon);
    port = p;
    return true;
}

// True for a host that names this machine's loopback only: "localhost", 127.0.0.0/8, "::1" (with or
// without brackets). A name that resolves elsewhere, or "0.0.0.0", is not.
inline bool is_loopback_host(std::string h) {
    if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    if (h == "localhost" || h == "::1" || h == "0:0:0:0:0:0:0:1") return true;
    if (h.rfind("127.", 0) != 0) return false;
    int dots = 0;
    for (char c : h) {
        if (c == '.') dots++;
        else if (c < '0' || c > '9') return false;
    }
    return dots == 3;
}

}  // namespace steward
