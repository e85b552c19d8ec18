// The loader's private copies are safe against another local user: a fresh 0700 directory of an
// unpredictable name, copies created with O_EXCL|O_NOFOLLOW (a planted symlink is never followed),
// and a plugin path that is a FIFO or a directory refused at once instead of blocking.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "plugin/plugin_loader.h"

using namespace steward;
namespace fs = std::filesystem;

namespace {

std::string test_plugin(const std::string& name) { return std::string(STEWARD_TEST_PLUGIN_DIR) + "/" + name + ".so"; }

struct TempDir {
    fs::path path;
    TempDir() {
        std::string tmpl = (fs::temp_directory_path() / "steward-plugin-copy-test-XXXXXX").string();
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

std::string read_all(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("plugin copies go into one private 0700 directory of an unpredictable name, emptied after each load",
          "[plugin_copy]") {
    auto lib = PluginLibrary::open(test_plugin("param_routing"), PolicyKind::ROUTING);
    REQUIRE(lib.ok());
    const std::string dir = plugin_copy_dir();
    REQUIRE_FALSE(dir.empty());
    struct stat st {};
    REQUIRE(::lstat(dir.c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK((st.st_mode & 0777) == 0700);
    CHECK(st.st_uid == ::geteuid());
    CHECK(fs::path(dir).filename().string() != "steward-plugins-" + std::to_string(::getpid()));
    CHECK(fs::is_empty(dir));  // the copy was unlinked once loaded
    auto again = PluginLibrary::open(test_plugin("param_routing"), PolicyKind::ROUTING);
    REQUIRE(again.ok());
    CHECK(plugin_copy_dir() == dir);  // once per process
    CHECK((*again)->load_serial() != (*lib)->load_serial());
}

TEST_CASE("a symlink planted where a copy would go is never followed: the victim file is untouched", "[plugin_copy]") {
    TempDir victim;
    const fs::path target = victim.path / "victim.txt";
    { std::ofstream(target) << "precious"; }
    // The old predictable directory name, planted as a symlink to the victim's directory.
    const fs::path old_name = fs::temp_directory_path() / ("steward-plugins-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::remove(old_name, ec);
    fs::create_directory_symlink(victim.path, old_name, ec);
    auto first = PluginLibrary::open(test_plugin("param_routing"), PolicyKind::ROUTING);
    REQUIRE(first.ok());
    // Inside the private directory too (only our own user can write there): the next copy's name.
    const std::string dir = plugin_copy_dir();
    const uint64_t next = (*first)->load_serial() + 1;
    const fs::path planted = fs::path(dir) / (std::to_string(next) + "-param_routing.so");
    fs::create_symlink(target, planted, ec);
    REQUIRE_FALSE(ec);
    auto second = PluginLibrary::open(test_plugin("param_routing"), PolicyKind::ROUTING);
    REQUIRE_FALSE(second.ok());
    INFO(second.error().message);
    CHECK_THAT(second.error().message, Catch::Contains("cannot create the private copy"));
    CHECK_THAT(second.error().message, Catch::Contains("param_routing"));
    CHECK(read_all(target) == "precious");
    CHECK(fs::is_symlink(fs::symlink_status(planted)));  // not ours: left alone
    fs::remove(planted, ec);
    fs::remove(old_name, ec);
    CHECK(fs::directory_iterator(victim.path) != fs::directory_iterator());
    CHECK(fs::exists(target));
    CHECK(fs::file_size(target) == 8);
    // And the next load works again.
    CHECK(PluginLibrary::open(test_plugin("param_routing"), PolicyKind::ROUTING).ok());
}

TEST_CASE("a plugin path that is a FIFO or a directory is refused at once as not a regular file", "[plugin_copy]") {
    TempDir tmp;
    const std::string fifo = (tmp.path / "fifo.so").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    auto a = PluginLibrary::open(fifo, PolicyKind::ROUTING);  // would block forever if opened blocking
    REQUIRE_FALSE(a.ok());
    CHECK_THAT(a.error().message, Catch::Contains("'" + fifo + "' is not a regular file (a FIFO)"));
    const std::string dir = (tmp.path / "dir.so").string();
    fs::create_directory(dir);
    auto b = PluginLibrary::open(dir, PolicyKind::ROUTING);
    REQUIRE_FALSE(b.ok());
    CHECK_THAT(b.error().message, Catch::Contains("'" + dir + "' is not a regular file (a directory)"));
    PluginLoader loader;
    auto c = loader.load(fifo, PolicyKind::ROUTING, {});
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(c.error().message, Catch::Contains("not a regular file"));
}

TEST_CASE("a configured plugin path that is a symlink to the library loads the file it names", "[plugin_copy]") {
    TempDir tmp;
    const fs::path link = tmp.path / "router.so";
    fs::create_symlink(test_plugin("param_routing"), link);
    auto lib = PluginLibrary::open(link.string(), PolicyKind::ROUTING);
    REQUIRE(lib.ok());
    CHECK((*lib)->name() != "");
}
