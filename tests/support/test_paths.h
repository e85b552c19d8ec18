// Where the tests find the source tree, the shared test data, the steward binary and the plugins
// built beside them. CMake passes the paths to one small translation unit (test_paths.cpp) only, so
// every other test object compiles the same in any checkout and a fresh clone in another folder
// hits the compile cache. Each macro is a const char*.
#pragma once

namespace steward_test_paths {
const char* source_dir();
const char* testdata_dir();
const char* binary();
const char* plugin_build_dir();
const char* test_plugin_dir();
}  // namespace steward_test_paths

#ifndef STEWARD_SOURCE_DIR
#define STEWARD_SOURCE_DIR (::steward_test_paths::source_dir())
#define STEWARD_TESTDATA_DIR (::steward_test_paths::testdata_dir())
#define STEWARD_BINARY (::steward_test_paths::binary())
#define STEWARD_PLUGIN_BUILD_DIR (::steward_test_paths::plugin_build_dir())
#define STEWARD_TEST_PLUGIN_DIR (::steward_test_paths::test_plugin_dir())
#endif
