// The model file's open path (issue 9): a FIFO or a device is refused at once, never waited on.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>

#include "model/model.h"
#include "process_temp_dir.h"

using namespace steward;

TEST_CASE("a model path that is a FIFO or /dev/zero is refused without blocking", "[gguf][hostile]") {
    static steward_test::ProcessTempDir d("steward-gguf-open-");
    const auto fifo = d.path() / "m.gguf";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // a blocking open would wait for a writer forever
    auto a = Model::load(fifo.string());
    REQUIRE_FALSE(a.ok());
    CHECK_THAT(a.error().message, Catch::Contains("m.gguf") && Catch::Contains("not a regular file"));
    const auto zero = d.path() / "zero.gguf";
    std::filesystem::create_symlink("/dev/zero", zero);
    auto b = Model::load(zero.string());
    REQUIRE_FALSE(b.ok());
    CHECK_THAT(b.error().message, Catch::Contains("not a regular file"));
}
