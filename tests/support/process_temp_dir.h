// A directory private to this test process (prefix + pid), created on construction and removed
// with everything in it at destruction; hold one in a function-local static.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

namespace steward_test {

class ProcessTempDir {
public:
    explicit ProcessTempDir(const std::string& prefix)
        : path_(std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))) {
        std::filesystem::create_directories(path_);
    }
    ~ProcessTempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    ProcessTempDir(const ProcessTempDir&) = delete;
    ProcessTempDir& operator=(const ProcessTempDir&) = delete;
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

}  // namespace steward_test
