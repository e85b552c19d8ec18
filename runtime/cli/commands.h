// The steward CLI's subcommands beyond model tools and generate.
#pragma once
#include <cstdint>
#include <string>

namespace steward {

int cli_fail(const std::string& msg);  // prints "steward: error: msg", returns 1

struct RunOptions {
    std::string config_path = "configs/default.toml";
    std::string workload_path;  // empty: generate the standard mixed workload
    std::string save_workload;
    std::string out_path = "out/report.json";
    int n_requests = 120;
    double rate = 2.0;
    double scale = 1.0;
    uint64_t seed = 1;
    bool burst = false;
    bool verbose = false;
};
int cmd_run(const RunOptions& o);

struct ServeOptions {
    std::string config_path = "configs/default.toml";
    std::string host;  // empty: [server] host
    int port = -1;     // < 0: [server] port
};
int cmd_serve(const ServeOptions& o);

}  // namespace steward
