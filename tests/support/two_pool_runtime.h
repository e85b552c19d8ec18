// The two-pool runtime (two_pool_config.h) with one bucket, "qa", on the small pool: the runtime
// tests that need a running Steward and nothing routed.
#pragma once
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include <steward/runtime.h>

#include "two_pool_config.h"

namespace steward_test {

// Starts it from a config file `name` in the test's temp dir; fails the test on an error.
inline std::unique_ptr<steward::Runtime> start_two_pools_qa_small(const std::string& name) {
    std::string t = two_pool_toml();
    t += "\n[[bucket]]\nname = \"qa\"\npool = \"small\"\n";
    auto rt = steward::Runtime::start(write_config(name, t));
    if (!rt) FAIL(rt.error().message);
    return std::move(*rt);
}

}  // namespace steward_test
