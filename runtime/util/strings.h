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

}  // namespace steward
