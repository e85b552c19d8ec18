// A config file checked without serving (the core of steward::check_config_file, <steward/runtime.h>).
#pragma once
#include <string>

#include <steward/expected.h>

namespace steward {

// Everything `run` and a reload would refuse, without serving: the TOML, every pool's model (present,
// or synthesizable), its KV and activations against the machine's memory, every bucket's plugins
// loaded with their parameters. Returns a one-line summary. Plain cores only (no actor system).
Expected<std::string> check_config(const std::string& path);

}  // namespace steward
