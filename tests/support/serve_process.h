// `steward serve --config FILE` as a child process, as a user runs it: started, read until it prints
// its address and "ready" (no polling, no sleeps), stopped with SIGTERM and its whole log kept. A
// test that leaves without stop() kills it.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "test_paths.h"

namespace steward_test {

struct ServeProcess {
    pid_t pid = -1;
    FILE* out = nullptr;
    int port = 0;
    std::string log;

    explicit ServeProcess(const std::string& cfg) {
        int p[2];
        REQUIRE(::pipe(p) == 0);
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::dup2(p[1], 1);
            ::dup2(p[1], 2);
            ::close(p[0]);
            ::execl(STEWARD_BINARY, STEWARD_BINARY, "serve", "--config", cfg.c_str(), (char*)nullptr);
            ::_exit(127);
        }
        ::close(p[1]);
        out = ::fdopen(p[0], "r");
        REQUIRE(out);
        bool ready = false;
        char line[2048];
        while (!ready && std::fgets(line, sizeof line, out)) {
            log += line;
            const std::string l = line;
            const std::string tag = "listening on http://127.0.0.1:";
            if (const size_t at = l.find(tag); at != std::string::npos) port = std::stoi(l.substr(at + tag.size()));
            ready = l.find("steward serve: ready") != std::string::npos;
        }
        INFO(log);
        REQUIRE(port > 0);
        REQUIRE(ready);
    }
    ServeProcess(const ServeProcess&) = delete;
    ServeProcess& operator=(const ServeProcess&) = delete;
    // SIGTERM, then everything it logs until it exits; its exit must be clean (0).
    void stop() {
        REQUIRE(::kill(pid, SIGTERM) == 0);
        char line[2048];
        while (std::fgets(line, sizeof line, out)) log += line;
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        std::fclose(out);
        out = nullptr;
        INFO(log);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
    }
    ~ServeProcess() {
        if (out) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
            std::fclose(out);
        }
    }
};

}  // namespace steward_test
