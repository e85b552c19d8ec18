// The paths of test_paths.h, from the STEWARD_TEST_* definitions CMake gives this file alone.
#include "test_paths.h"

namespace steward_test_paths {
const char* source_dir() { return STEWARD_TEST_SOURCE_DIR; }
const char* testdata_dir() { return STEWARD_TEST_TESTDATA_DIR; }
const char* binary() { return STEWARD_TEST_BINARY; }
const char* plugin_build_dir() { return STEWARD_TEST_PLUGIN_BUILD_DIR; }
const char* test_plugin_dir() { return STEWARD_TEST_PLUGIN_DIR_PATH; }
}  // namespace steward_test_paths
