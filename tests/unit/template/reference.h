// Runs tests/unit/template/render_reference.py (Python's jinja2 set up as transformers does) on a
// batch of cases and returns its results: the independent reference the interpreter is held to.
#pragma once
#include <sys/wait.h>
#include "test_paths.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "process_temp_dir.h"

namespace steward_test {

struct ReferenceCase {
    std::string label;
    std::string source;
    nlohmann::ordered_json context;
    int64_t now_unix = 1735732800;  // 2025-01-01 12:00 UTC, in both renderers
};

struct ReferenceResult {
    bool ok = false;
    std::string text;  // the rendering, or the error
};

// Empty `error` on success; otherwise it says what is missing and how to get it.
inline std::vector<ReferenceResult> run_reference(const std::vector<ReferenceCase>& cases, std::string& error) {
    static ProcessTempDir dir("steward-jinja-ref-");
    static int n_batch = 0;
    const auto in_path = dir.path() / ("cases" + std::to_string(n_batch) + ".json");
    const auto out_path = dir.path() / ("results" + std::to_string(n_batch++) + ".json");
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (auto& c : cases) j.push_back({{"template", c.source}, {"context", c.context}, {"now", c.now_unix}});
    std::ofstream(in_path) << j.dump();
    const std::string script = std::string(STEWARD_SOURCE_DIR) + "/tests/unit/template/render_reference.py";
    const std::string cmd = "python3 '" + script + "' '" + in_path.string() + "' '" + out_path.string() + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string log;
    if (p) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, p)) > 0) log.append(buf, n);
    }
    int status = p ? pclose(p) : -1;
    if (!p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        error = "the reference renderer (python3 + jinja2) did not run: run scripts/setup.sh (it installs "
                "python3-jinja2). Output: " + log;
        return {};
    }
    std::ifstream f(out_path);
    std::stringstream ss;
    ss << f.rdbuf();
    auto res = nlohmann::json::parse(ss.str(), nullptr, false);
    if (!res.is_array() || res.size() != cases.size()) {
        error = "the reference renderer wrote no usable results: " + log;
        return {};
    }
    std::vector<ReferenceResult> out;
    for (auto& r : res) {
        bool ok = r.value("ok", false);
        out.push_back({ok, ok ? r.value("text", "") : r.value("error", "")});
    }
    return out;
}

}  // namespace steward_test
