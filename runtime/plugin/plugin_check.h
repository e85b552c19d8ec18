// The opt-in isolation check ([plugins] check_in_child): before a config adopts a plugin, a forked
// child creates an instance with the bucket's parameters and makes decisions of the plugin's kind on
// synthetic inputs, so a create() or a decision that crashes, hangs or leaks fails the load with a
// message naming the plugin, while the process (and a live generation) goes on.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "plugin/plugin_loader.h"

namespace steward {

// Decisions the child makes after create(), and the heap growth over them it accepts (bytes per
// decision, measured with mallinfo2): a plugin that keeps more than this per decision is refused as
// leaking.
constexpr int k_check_decisions = 256;
constexpr double k_check_leak_bytes_per_decision = 4096;

// Forks; the child only calls the plugin (through the host's own policy classes, no time budget), the
// allocator and write(2), then _exits. A crash (signal), a hang past timeout_ms (the child is
// SIGKILLed) or a leak is an error naming the plugin, the bucket, the stage and what happened.
// Caveats (fork in a multi-threaded process): only the calling thread exists in the child; a plugin
// that logs through the host (spdlog) while another thread of the parent held the logger's lock at
// fork would block and be reported as a hang.
Expected<bool> check_plugin_in_child(const std::shared_ptr<PluginLibrary>& lib, const PolicySpec& spec,
                                     const std::string& bucket, const std::vector<std::string>& pools, double timeout_ms);

}  // namespace steward
