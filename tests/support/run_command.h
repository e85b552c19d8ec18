// Runs a shell command and returns its exit status and standard output (the CLI tests).
#pragma once
#include <sys/wait.h>
#include "test_paths.h"

#include <array>
#include <cstdio>
#include <string>

namespace steward_test {

struct CommandResult {
    int rc = -1;      // the exit status; -1 when the command could not be started
    std::string out;  // what it wrote on stdout (redirect 2>&1 in `cmd` to have stderr too)
};

inline CommandResult run_command(const std::string& cmd) {
    CommandResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

// The steward binary (test_paths.h) with args, stderr folded into out.
inline CommandResult run_steward(const std::string& args) {
    return run_command(std::string(STEWARD_BINARY) + " " + args + " 2>&1");
}

}  // namespace steward_test
