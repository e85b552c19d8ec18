// MappedFileGuard: reading a loaded model's weights after its file was truncated reads zeros (on
// the caller and on pool workers) instead of killing the process, and the model reports why.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>

#include "cpu/thread_pool.h"
#include "model/gguf.h"
#include "model/mapping_guard.h"
#include "model/model.h"
#include "model/synth.h"

using namespace steward;

namespace {

SynthSpec small_spec() {
    SynthSpec spec;
    spec.n_embd = 64;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_head_kv = 2;
    spec.n_ff = 128;
    spec.n_vocab = 512;
    return spec;
}

// STEWARD_MMAP=1 for the scope: the weights stay in the file's mapping (GgufFile's default copies
// them to anonymous huge-page memory).
struct MmapScope {
    MmapScope() { ::setenv("STEWARD_MMAP", "1", 1); }
    ~MmapScope() { ::unsetenv("STEWARD_MMAP"); }
};

}  // namespace

TEST_CASE("with STEWARD_MMAP=1, weights read after the model file was truncated are zeros and the model names the truncation",
          "[model][truncation]") {
    if (!mapping_guard_active()) {
        WARN("skipped: the SIGBUS handler is not installed (a sanitizer keeps SIGBUS: ASAN_OPTIONS=allow_user_segv_handler=1)");
        return;
    }
    const auto path = std::filesystem::temp_directory_path() / ("steward_guard_" + std::to_string(::getpid()) + ".gguf");
    const SynthSpec spec = small_spec();
    REQUIRE(synth_write(spec, path.string()));
    const MmapScope mmap_mode;
    auto m = Model::load(path.string());
    REQUIRE(m);
    const Model& model = *m.value();
    REQUIRE(model.check_file());
    const WeightView& w = model.weights().layers[0].w_down;
    const auto* bytes = static_cast<const uint8_t*>(w.data);
    const int64_t n = p_bytes(w);
    double before = 0;
    for (int64_t i = 0; i < n; i++) before += bytes[i];
    REQUIRE(before > 0);  // random weights: not all zero

    REQUIRE(::truncate(path.c_str(), 64) == 0);
    // Four participants read disjoint slices; whoever faults first remaps, the others read zeros too.
    ThreadPool pool(4);
    std::atomic<int64_t> sum{0};
    pool.parallel_for(16, [&](int64_t c) {
        int64_t s = 0;
        for (int64_t i = c * n / 16; i < (c + 1) * n / 16; i++) s += bytes[i];
        sum += s;
    });
    CHECK(sum == 0);
    auto c = model.check_file();
    REQUIRE_FALSE(c);
    CHECK(c.error().message.find("changed while it was served (truncated") != std::string::npos);
    CHECK(c.error().message.find(path.string()) != std::string::npos);
    std::filesystem::remove(path);
}

TEST_CASE("by default the weights are a copy outside the file: a truncated file leaves them intact and the model "
          "names the truncation", "[model][truncation]") {
    const auto path = std::filesystem::temp_directory_path() / ("steward_guard_copy_" + std::to_string(::getpid()) + ".gguf");
    REQUIRE(synth_write(small_spec(), path.string()));
    auto m = Model::load(path.string());
    REQUIRE(m);
    const Model& model = *m.value();
    const WeightView& w = model.weights().layers[0].w_down;
    const auto* bytes = static_cast<const uint8_t*>(w.data);
    const auto* map = static_cast<const uint8_t*>(model.file().mapped_data());
    // Not inside the mapping, and byte for byte the file's tensor.
    CHECK((bytes < map || bytes >= map + model.file().mapped_size()));
    const int64_t n = p_bytes(w);
    const int64_t off = bytes - model.file().bytes();  // the tensor's offset in the file
    REQUIRE(model.file().bytes() != static_cast<const uint8_t*>(model.file().mapped_data()));
    CHECK(std::equal(bytes, bytes + n, map + off));
    int64_t before = 0;
    for (int64_t i = 0; i < n; i++) before += bytes[i];
    REQUIRE(before > 0);
    REQUIRE(::truncate(path.c_str(), 64) == 0);
    int64_t after = 0;
    for (int64_t i = 0; i < n; i++) after += bytes[i];
    CHECK(after == before);
    auto c = model.check_file();
    REQUIRE_FALSE(c);
    CHECK(c.error().message.find("truncated") != std::string::npos);
    std::filesystem::remove(path);
}

TEST_CASE("a GGUF file is guarded from the moment it is mapped, before and while it is parsed",
          "[model][truncation]") {
    const auto path = std::filesystem::temp_directory_path() / ("steward_guard_open_" + std::to_string(::getpid()) + ".gguf");
    const SynthSpec spec = small_spec();
    REQUIRE(synth_write(spec, path.string()));
    auto f = GgufFile::open(path.string());
    REQUIRE(f);
    const GgufFile& file = *f.value();
    REQUIRE(file.guard());
    if (!mapping_guard_active()) {
        WARN("skipped: the SIGBUS handler is not installed (a sanitizer keeps SIGBUS: ASAN_OPTIONS=allow_user_segv_handler=1)");
        std::filesystem::remove(path);
        return;
    }
    // A bare GgufFile (no Model yet), as during parsing: the last page of the mapping, past the cut.
    REQUIRE(::truncate(path.c_str(), 64) == 0);
    const auto* bytes = static_cast<const uint8_t*>(file.mapped_data());
    int64_t s = 0;
    for (size_t i = file.mapped_size() - 4096; i < file.mapped_size(); i++) s += bytes[i];
    CHECK(s == 0);
    CHECK(file.guard()->faulted());
    auto c = file.guard()->check();
    REQUIRE_FALSE(c);
    CHECK(c.error().message.find("truncated") != std::string::npos);
    std::filesystem::remove(path);
}
