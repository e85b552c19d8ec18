// Tests for the GGUF reader and writer (runtime/model/gguf.*) and the scalar conversions and Q8_0
// codec (runtime/model/ggml_types.*): round trips, hand-encoded malformed files, truncation and
// byte-flip fuzzing, and f16/bf16 rounding against the F16C hardware conversion.
#include <catch2/catch.hpp>
#include "test_paths.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "model/ggml_types.h"
#include "model/gguf.h"
#include "model/model.h"

using namespace steward;

namespace {

// GGUF metadata type ids and ggml tensor type ids, written out from the spec rather than taken
// from the headers, so the hand-encoded files below do not depend on the code under test.
constexpr uint32_t kTypeU8 = 0, kTypeI8 = 1, kTypeU16 = 2, kTypeI16 = 3, kTypeU32 = 4, kTypeI32 = 5,
                   kTypeF32 = 6, kTypeBool = 7, kTypeString = 8, kTypeArray = 9, kTypeU64 = 10,
                   kTypeI64 = 11, kTypeF64 = 12;
constexpr uint32_t kTensorF32 = 0, kTensorF16 = 1, kTensorQ4_0 = 2, kTensorQ8_0 = 8, kTensorBF16 = 30;

// Builds GGUF bytes by hand, little-endian, one field at a time; independent of GgufWriter.
struct ByteBuilder {
    std::vector<uint8_t> bytes;

    ByteBuilder& u8(uint8_t v) {
        bytes.push_back(v);
        return *this;
    }
    ByteBuilder& u16(uint16_t v) {
        for (int k = 0; k < 2; k++) bytes.push_back(uint8_t(v >> (8 * k)));
        return *this;
    }
    ByteBuilder& u32(uint32_t v) {
        for (int k = 0; k < 4; k++) bytes.push_back(uint8_t(v >> (8 * k)));
        return *this;
    }
    ByteBuilder& u64(uint64_t v) {
        for (int k = 0; k < 8; k++) bytes.push_back(uint8_t(v >> (8 * k)));
        return *this;
    }
    ByteBuilder& f32(float v) {
        uint32_t x;
        std::memcpy(&x, &v, 4);
        return u32(x);
    }
    ByteBuilder& f64(double v) {
        uint64_t x;
        std::memcpy(&x, &v, 8);
        return u64(x);
    }
    ByteBuilder& raw(std::string_view s) {
        bytes.insert(bytes.end(), s.begin(), s.end());
        return *this;
    }
    ByteBuilder& str(std::string_view s) {  // GGUF string: u64 length, then the bytes, no NUL
        u64(s.size());
        return raw(s);
    }
    ByteBuilder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        raw("GGUF");
        u32(version);
        u64(n_tensors);
        return u64(n_kv);
    }
    // A key and its type id; the caller appends the value.
    ByteBuilder& key(std::string_view k, uint32_t type) {
        str(k);
        return u32(type);
    }
    ByteBuilder& tensor(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type,
                        uint64_t offset) {
        str(name);
        u32((uint32_t)dims.size());
        for (uint64_t d : dims) u64(d);
        u32(type);
        return u64(offset);
    }
    ByteBuilder& pad_to(size_t alignment) {
        while (bytes.size() % alignment != 0) bytes.push_back(0);
        return *this;
    }
    ByteBuilder& fill(size_t n, uint8_t v = 0) {
        bytes.insert(bytes.end(), n, v);
        return *this;
    }
};

// A heap copy of exactly n bytes at a 4096-aligned address: ASan reports any read past the end,
// and data pointers can be checked for absolute alignment.
class ExactBuffer {
public:
    explicit ExactBuffer(const std::vector<uint8_t>& src)
        : n_(src.size()), p_(static_cast<uint8_t*>(::operator new(n_ ? n_ : 1, std::align_val_t{4096}))) {
        if (n_) std::memcpy(p_, src.data(), n_);
    }
    ~ExactBuffer() { ::operator delete(p_, std::align_val_t{4096}); }
    ExactBuffer(const ExactBuffer&) = delete;
    ExactBuffer& operator=(const ExactBuffer&) = delete;
    const uint8_t* data() const { return p_; }
    size_t size() const { return n_; }

private:
    size_t n_;
    uint8_t* p_;
};

// Parses an exact-size copy of bytes. nullopt when the file parses, else the error message.
// Parsing must never throw, whatever the bytes.
std::optional<std::string> parse_error(const std::vector<uint8_t>& bytes) {
    ExactBuffer buf(bytes);
    std::optional<std::string> msg;
    REQUIRE_NOTHROW([&] {
        auto r = GgufFile::parse(buf.data(), buf.size(), "case.gguf");
        if (!r) msg = r.error().message;
    }());
    return msg;
}

// A temporary path removed when the test ends.
struct TempPath {
    std::filesystem::path path;
    explicit TempPath(const std::string& stem) {
        static int counter = 0;
        path = std::filesystem::temp_directory_path() /
               ("steward_test_gguf_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" + stem);
    }
    ~TempPath() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

std::vector<uint8_t> read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The smallest useful valid file: one string key, one F32 tensor of 4 elements whose data ends
// exactly at the end of the file (so every shorter prefix is truncated).
std::vector<uint8_t> minimal_file() {
    ByteBuilder b;
    b.header(1, 1).key("general.architecture", kTypeString).str("llama");
    b.tensor("w", {4}, kTensorF32, 0).pad_to(32);
    for (float x : {1.0f, -2.0f, 0.5f, 3.0f}) b.f32(x);
    return b.bytes;
}

// A richer hand-encoded valid file: every scalar type, arrays (nested too), two tensors.
std::vector<uint8_t> rich_file() {
    ByteBuilder b;
    b.header(2, 16);
    b.key("u8", kTypeU8).u8(200);
    b.key("i8", kTypeI8).u8(0x80);  // -128
    b.key("u16", kTypeU16).u16(65535);
    b.key("i16", kTypeI16).u16(0x8000);  // -32768
    b.key("u32", kTypeU32).u32(4000000000u);
    b.key("i32", kTypeI32).u32(0xfffffffe);  // -2
    b.key("f32", kTypeF32).f32(1.5f);
    b.key("bool", kTypeBool).u8(1);
    b.key("str", kTypeString).str("hello");
    b.key("u64", kTypeU64).u64(1ull << 63);
    b.key("i64", kTypeI64).u64((uint64_t)-5);
    b.key("f64", kTypeF64).f64(-0.25);
    b.key("strs", kTypeArray).u32(kTypeString).u64(3).str("a").str("").str("ccc");
    b.key("i32s", kTypeArray).u32(kTypeI32).u64(3).u32(7).u32(0xffffffff).u32(9);
    b.key("nested", kTypeArray).u32(kTypeArray).u64(2);
    b.u32(kTypeU8).u64(2).u8(1).u8(2);
    b.u32(kTypeString).u64(1).str("x");
    b.key("general.alignment", kTypeU32).u32(64);
    b.tensor("a", {3, 2}, kTensorF32, 0);
    b.tensor("b", {32}, kTensorQ8_0, 64);
    b.pad_to(64);
    b.fill(24, 0x11).fill(64 - 24);  // "a": 24 bytes, padded to 64
    b.fill(34, 0x22);                // "b": one Q8_0 block
    return b.bytes;
}

// Byte offset just past the last byte any tensor needs, computed from the parsed file.
size_t required_end(const std::vector<uint8_t>& bytes) {
    auto r = GgufFile::parse(bytes.data(), bytes.size());
    REQUIRE(r);
    size_t end = 0;
    for (auto& t : r.value()->tensors()) end = std::max(end, (size_t)(t.data - bytes.data()) + (size_t)t.n_bytes);
    return end;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trip

namespace {

struct ExpectedTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> data;
};

std::vector<ExpectedTensor> make_tensors() {
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    auto floats = [&](int64_t n) {
        std::vector<float> v((size_t)n);
        for (auto& x : v) x = nd(rng);
        return v;
    };
    std::vector<ExpectedTensor> ts;
    ts.push_back({"f32.1d", GgmlType::F32, {7}, f32_bytes(floats(7))});
    ts.push_back({"f32.ones", GgmlType::F32, {1, 1, 1, 1}, f32_bytes(floats(1))});
    {
        auto v = floats(3 * 5);
        std::vector<uint8_t> b(v.size() * 2);
        for (size_t k = 0; k < v.size(); k++) {
            uint16_t h = f32_to_f16(v[k]);
            std::memcpy(&b[2 * k], &h, 2);
        }
        ts.push_back({"f16.2d", GgmlType::F16, {3, 5}, b});
    }
    {
        auto v = floats(5 * 3 * 7);
        std::vector<uint8_t> b(v.size() * 2);
        for (size_t k = 0; k < v.size(); k++) {
            uint16_t h = f32_to_bf16(v[k]);
            std::memcpy(&b[2 * k], &h, 2);
        }
        ts.push_back({"blk.0.bf16.3d", GgmlType::BF16, {5, 3, 7}, b});
    }
    for (auto dims : {std::vector<int64_t>{64, 3, 1, 5}, std::vector<int64_t>{32}, std::vector<int64_t>{96, 1, 3}}) {
        int64_t n = 1;
        for (auto d : dims) n *= d;
        auto v = floats(n);
        std::vector<BlockQ8_0> q((size_t)(n / kQ8BlockSize));
        quantize_row_q8_0(v.data(), q.data(), n);
        std::vector<uint8_t> b(q.size() * sizeof(BlockQ8_0));
        std::memcpy(b.data(), q.data(), b.size());
        ts.push_back({"q8_0." + std::to_string(dims.size()) + "d." + std::to_string(n), GgmlType::Q8_0, dims, b});
    }
    ts.push_back({"", GgmlType::F32, {1}, f32_bytes({42.0f})});  // an empty name is legal
    return ts;
}

GgufWriter make_writer(const std::vector<ExpectedTensor>& ts) {
    GgufWriter w;
    w.set_u32("k.u32", 4000000000u);
    w.set_i32("k.i32", -2147483647 - 1);
    w.set_u64("k.u64", (1ull << 63) + 5);
    w.set_f32("k.f32", -1.25e-7f);
    w.set_f32("k.f32.nan", std::numeric_limits<float>::quiet_NaN());
    w.set_f32("k.f32.negzero", -0.0f);
    w.set_bool("k.true", true);
    w.set_bool("k.false", false);
    w.set_string("k.str", "h\xc3\xa9llo, world");
    w.set_string("k.str.empty", "");
    w.set_string("k.str.nul", std::string("a\0b", 3));
    w.set_string_array("k.strs", {"<s>", "", "\xe2\x96\x81the", std::string(300, 'z')});
    w.set_string_array("k.strs.empty", {});
    w.set_f32_array("k.f32s", {0.0f, -1.0f, 3.5f, 1e30f, -1e-30f});
    w.set_i32_array("k.i32s", {0, -1, 2147483647, -2147483647 - 1});
    w.set_i32_array("k.i32s.empty", {});
    w.set_u32("k.overwritten", 1);
    w.set_u32("k.overwritten", 2);  // a second set replaces the first, in place
    for (auto& t : ts) w.add_tensor(t.name, t.type, t.dims, t.data);
    return w;
}

void check_contents(const GgufFile& f, const std::vector<ExpectedTensor>& ts, uint32_t alignment,
                    bool check_absolute_alignment) {
    CHECK(f.version() == 3);
    CHECK(f.alignment() == alignment);
    if (alignment != 32) {
        REQUIRE(f.get_int("general.alignment"));
        CHECK(*f.get_int("general.alignment") == alignment);
    } else {
        CHECK(f.find("general.alignment") == nullptr);
    }
    CHECK(f.metadata().size() == 17 + (alignment != 32 ? 1 : 0));

    REQUIRE(f.find("k.u32"));
    CHECK(f.find("k.u32")->type == GgufType::UINT32);
    CHECK(f.find("k.u32")->u == 4000000000u);
    CHECK(*f.get_int("k.u32") == 4000000000);
    CHECK(f.find("k.i32")->type == GgufType::INT32);
    CHECK(*f.get_int("k.i32") == -2147483647 - 1);
    CHECK(f.find("k.u64")->type == GgufType::UINT64);
    CHECK(f.find("k.u64")->u == (1ull << 63) + 5);
    CHECK(f.find("k.f32")->type == GgufType::FLOAT32);
    CHECK(*f.get_float("k.f32") == (double)-1.25e-7f);
    CHECK(std::isnan(*f.get_float("k.f32.nan")));
    CHECK(*f.get_float("k.f32.negzero") == 0.0);
    CHECK(std::signbit(*f.get_float("k.f32.negzero")));
    CHECK(f.find("k.true")->type == GgufType::BOOL);
    CHECK(*f.get_bool("k.true") == true);
    CHECK(*f.get_bool("k.false") == false);
    CHECK(*f.get_string("k.str") == "h\xc3\xa9llo, world");
    CHECK(*f.get_string("k.str.empty") == "");
    CHECK(*f.get_string("k.str.nul") == std::string_view("a\0b", 3));
    CHECK(*f.get_int("k.overwritten") == 2);

    auto strs = f.get_string_array("k.strs");
    REQUIRE(strs);
    REQUIRE(strs->size() == 4);
    CHECK((*strs)[0] == "<s>");
    CHECK((*strs)[1] == "");
    CHECK((*strs)[2] == "\xe2\x96\x81the");
    CHECK((*strs)[3] == std::string(300, 'z'));
    REQUIRE(f.get_string_array("k.strs.empty"));
    CHECK(f.get_string_array("k.strs.empty")->empty());
    CHECK(*f.get_f32_array("k.f32s") == std::vector<float>{0.0f, -1.0f, 3.5f, 1e30f, -1e-30f});
    CHECK(*f.get_i32_array("k.i32s") == std::vector<int32_t>{0, -1, 2147483647, -2147483647 - 1});
    CHECK(f.get_i32_array("k.i32s.empty")->empty());

    // Typed getters refuse the wrong type and absent keys.
    CHECK_FALSE(f.get_string("k.u32"));
    CHECK_FALSE(f.get_int("k.str"));
    CHECK_FALSE(f.get_float("k.str"));
    CHECK_FALSE(f.get_f32_array("k.i32s"));
    CHECK_FALSE(f.get_i32_array("k.f32s"));
    CHECK_FALSE(f.get_string_array("k.f32s"));
    CHECK_FALSE(f.get_int("no.such.key"));
    CHECK(f.find("no.such.key") == nullptr);

    REQUIRE(f.tensors().size() == ts.size());
    const uint8_t* first = f.tensors()[0].data;
    for (size_t k = 0; k < ts.size(); k++) {
        const GgufTensorInfo& got = f.tensors()[k];
        const ExpectedTensor& want = ts[k];
        INFO("tensor '" << want.name << "'");
        CHECK(got.name == want.name);
        CHECK(f.find_tensor(want.name) == &got);
        CHECK(got.type == want.type);
        REQUIRE(got.n_dims == want.dims.size());
        int64_t n = 1;
        for (size_t d = 0; d < 4; d++) {
            const int64_t want_ne = d < want.dims.size() ? want.dims[d] : 1;
            CHECK(got.ne[d] == want_ne);
            n *= want_ne;
        }
        CHECK(got.n_elements() == n);
        CHECK(got.n_bytes == want.data.size());
        CHECK(got.offset % alignment == 0);
        CHECK((size_t)(got.data - first) % alignment == 0);
        if (check_absolute_alignment) CHECK(reinterpret_cast<uintptr_t>(got.data) % alignment == 0);
        REQUIRE(got.data != nullptr);
        CHECK(std::memcmp(got.data, want.data.data(), want.data.size()) == 0);
    }
    CHECK(f.find_tensor("no.such.tensor") == nullptr);
}

}  // namespace

TEST_CASE("a GgufWriter file reads back with every value, shape, type and tensor byte intact", "[gguf]") {
    const auto ts = make_tensors();
    const GgufWriter w = make_writer(ts);
    for (uint32_t alignment : {32u, 64u, 256u}) {
        INFO("alignment " << alignment);
        const std::vector<uint8_t> bytes = w.to_bytes(alignment);
        CHECK(bytes.size() % alignment == 0);

        SECTION("parse over a caller-owned buffer, alignment " + std::to_string(alignment)) {
            ExactBuffer buf(bytes);
            auto r = GgufFile::parse(buf.data(), buf.size(), "mem.gguf");
            REQUIRE(r);
            CHECK(r.value()->path() == "mem.gguf");
            check_contents(*r.value(), ts, alignment, true);
        }
        SECTION("from_bytes, alignment " + std::to_string(alignment)) {
            auto r = GgufFile::from_bytes(bytes);
            REQUIRE(r);
            check_contents(*r.value(), ts, alignment, false);
        }
        SECTION("write then open, alignment " + std::to_string(alignment)) {
            TempPath tmp("roundtrip.gguf");
            auto wr = w.write(tmp.path.string(), alignment);
            REQUIRE(wr);
            CHECK(read_all(tmp.path) == bytes);  // write() and to_bytes() agree byte for byte
            auto r = GgufFile::open(tmp.path.string());
            REQUIRE(r);
            CHECK(r.value()->path() == tmp.path.string());
            check_contents(*r.value(), ts, alignment, true);  // the mapping is page-aligned
        }
    }
}

TEST_CASE("a hand-encoded GGUF file with every metadata type parses to the encoded values", "[gguf]") {
    const std::vector<uint8_t> bytes = rich_file();
    ExactBuffer buf(bytes);
    auto r = GgufFile::parse(buf.data(), buf.size());
    REQUIRE(r);
    const GgufFile& f = *r.value();
    CHECK(f.alignment() == 64);
    CHECK(f.metadata().size() == 16);
    CHECK(f.find("u8")->type == GgufType::UINT8);
    CHECK(*f.get_int("u8") == 200);
    CHECK(*f.get_int("i8") == -128);
    CHECK(*f.get_int("u16") == 65535);
    CHECK(*f.get_int("i16") == -32768);
    CHECK(*f.get_int("u32") == 4000000000);
    CHECK(*f.get_int("i32") == -2);
    CHECK(*f.get_float("f32") == 1.5);
    CHECK(*f.get_bool("bool"));
    CHECK(*f.get_string("str") == "hello");
    CHECK(f.find("u64")->u == 1ull << 63);
    CHECK(*f.get_int("i64") == -5);
    CHECK(f.find("f64")->type == GgufType::FLOAT64);
    CHECK(*f.get_float("f64") == -0.25);
    CHECK(*f.get_float("u32") == 4000000000.0);  // ints convert to float
    CHECK(*f.get_string_array("strs") == std::vector<std::string_view>{"a", "", "ccc"});
    CHECK(*f.get_i32_array("i32s") == std::vector<int32_t>{7, -1, 9});
    const GgufValue* nested = f.find("nested");
    REQUIRE(nested);
    CHECK(nested->type == GgufType::ARRAY);
    CHECK(nested->arr_type == GgufType::ARRAY);
    CHECK(nested->arr_n == 2);

    REQUIRE(f.tensors().size() == 2);
    const GgufTensorInfo* a = f.find_tensor("a");
    const GgufTensorInfo* b = f.find_tensor("b");
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->n_dims == 2);
    CHECK(a->ne[0] == 3);
    CHECK(a->ne[1] == 2);
    CHECK(a->n_bytes == 24);
    CHECK(b->type == GgmlType::Q8_0);
    CHECK(b->n_bytes == 34);
    CHECK(b->offset == 64);
    CHECK(reinterpret_cast<uintptr_t>(a->data) % 64 == 0);
    CHECK(reinterpret_cast<uintptr_t>(b->data) % 64 == 0);
    CHECK(b->data - a->data == 64);
    CHECK(a->data[0] == 0x11);
    CHECK(a->data[23] == 0x11);
    CHECK(b->data[0] == 0x22);
    CHECK(b->data[33] == 0x22);
    CHECK(b->data + 34 == buf.data() + buf.size());
}

TEST_CASE("GGUF version 2 files are read, and files without tensors need no data section", "[gguf]") {
    ByteBuilder v2;
    v2.header(1, 0, 2).tensor("w", {2}, kTensorF16, 0).pad_to(32).u16(0x3c00).u16(0xc000);
    auto r = GgufFile::from_bytes(v2.bytes);
    REQUIRE(r);
    CHECK(r.value()->version() == 2);
    CHECK(r.value()->tensors()[0].type == GgmlType::F16);

    ByteBuilder no_tensors;
    no_tensors.header(0, 1).key("general.name", kTypeString).str("x");  // ends unaligned, no padding
    CHECK_FALSE(parse_error(no_tensors.bytes));
    CHECK_FALSE(parse_error(ByteBuilder().header(0, 0).bytes));

    // Arrays nested three deep are accepted (the limit is exercised among the malformed files).
    ByteBuilder nested;
    nested.header(0, 1).key("n", kTypeArray).u32(kTypeArray).u64(1).u32(kTypeArray).u64(1).u32(kTypeU8).u64(1).u8(7);
    CHECK_FALSE(parse_error(nested.bytes));
}

TEST_CASE("a caller-set general.alignment does not make the writer produce an unreadable file", "[gguf]") {
    // E.g. a tool that copies every key of a source GGUF into a new one, general.alignment included.
    for (uint32_t user : {32u, 64u}) {
        for (uint32_t alignment : {32u, 64u}) {
            INFO("caller sets " << user << ", writes with " << alignment);
            GgufWriter w;
            w.set_u32("general.alignment", user);
            w.add_tensor("t", GgmlType::F32, {3}, f32_bytes({1, 2, 3}));
            w.add_tensor("u", GgmlType::F32, {5}, f32_bytes({4, 5, 6, 7, 8}));
            auto r = GgufFile::from_bytes(w.to_bytes(alignment));
            REQUIRE(r);
            CHECK(r.value()->alignment() == alignment);
            if (alignment != 32)  // 32 is the default and goes unwritten
                CHECK(r.value()->get_int("general.alignment") == std::optional<int64_t>(alignment));
            else
                CHECK(r.value()->find("general.alignment") == nullptr);
            CHECK(r.value()->find_tensor("u")->offset % alignment == 0);
            float x;
            std::memcpy(&x, r.value()->find_tensor("u")->data + 16, 4);
            CHECK(x == 8.0f);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Malformed files

namespace {

struct BadCase {
    std::string what;
    std::vector<uint8_t> bytes;
    std::vector<std::string> needles;  // each must appear in the error message
};

// header(1 tensor, 0 kv) + one tensor info + padding + n_data bytes of data.
std::vector<uint8_t> one_tensor(const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset, size_t n_data) {
    ByteBuilder b;
    b.header(1, 0).tensor("w", dims, type, offset).pad_to(32).fill(n_data, 0x5a);
    return b.bytes;
}

std::vector<uint8_t> one_kv(std::string_view key, uint32_t type, const std::function<void(ByteBuilder&)>& value) {
    ByteBuilder b;
    b.header(0, 1).key(key, type);
    value(b);
    return b.bytes;
}

// An alignment key, then a tensor at offset 0 with its data, so only the alignment can be wrong.
std::vector<uint8_t> with_alignment(const std::function<void(ByteBuilder&)>& alignment_kv) {
    ByteBuilder b;
    b.header(1, 1);
    alignment_kv(b);
    b.tensor("w", {4}, kTensorF32, 0).pad_to(64).fill(16);
    return b.bytes;
}

void put_u32_at(std::vector<uint8_t>& b, size_t pos, uint32_t v) {
    for (int k = 0; k < 4; k++) b[pos + k] = uint8_t(v >> (8 * k));
}
void put_u64_at(std::vector<uint8_t>& b, size_t pos, uint64_t v) {
    for (int k = 0; k < 8; k++) b[pos + k] = uint8_t(v >> (8 * k));
}

std::vector<BadCase> bad_cases() {
    std::vector<BadCase> cs;
    auto add = [&](std::string what, std::vector<uint8_t> bytes, std::vector<std::string> needles) {
        cs.push_back({std::move(what), std::move(bytes), std::move(needles)});
    };
    const uint64_t k2p60 = 1ull << 60, k2p62 = 1ull << 62;

    // Header.
    add("empty file", {}, {"truncated", "magic"});
    add("three bytes", {'G', 'G', 'U'}, {"truncated", "magic"});
    add("wrong magic", ByteBuilder().raw("GGML").u32(3).u64(0).u64(0).bytes, {"wrong magic 'GGML'", "expected 'GGUF'"});
    add("zero-filled file", std::vector<uint8_t>(64, 0), {"wrong magic '?\?\?\?'"});
    add("version 1", ByteBuilder().header(0, 0, 1).bytes, {"version 1;", "versions 2 and 3"});
    add("version 99", ByteBuilder().header(0, 0, 99).bytes, {"version 99", "versions 2 and 3"});
    add("truncated in the counts", ByteBuilder().raw("GGUF").u32(3).u64(0).u32(0).bytes, {"truncated", "metadata count"});
    add("n_kv 2^60", ByteBuilder().header(0, k2p60).fill(64).bytes, {"metadata count 1152921504606846976", "larger than the file"});
    add("n_tensors 2^60", ByteBuilder().header(k2p60, 0).fill(64).bytes, {"tensor count 1152921504606846976", "larger than the file"});

    // Metadata.
    add("key length past the end", ByteBuilder().header(0, 1).u64(1000).raw("abc").fill(20).bytes,
        {"metadata key has length 1000", "remain"});
    add("key length 2^62", ByteBuilder().header(0, 1).u64(k2p62).fill(20).bytes, {"metadata key has length 4611686018427387904"});
    add("string value length 2^62", one_kv("s", kTypeString, [&](ByteBuilder& b) { b.u64(k2p62).raw("xy"); }),
        {"'s'", "string value has length 4611686018427387904"});
    add("string value length past the end", one_kv("s", kTypeString, [](ByteBuilder& b) { b.u64(9).raw("12345678"); }),
        {"string value has length 9 but only 8 bytes remain"});
    add("value type id 13", one_kv("k", 13, [](ByteBuilder& b) { b.u32(0); }), {"'k'", "type id 13", "not a GGUF type"});
    add("value type id 0xFFFFFFFF", one_kv("k", 0xFFFFFFFFu, [](ByteBuilder& b) { b.u32(0); }), {"type id 4294967295"});
    add("truncated u32 value", one_kv("k", kTypeU32, [](ByteBuilder& b) { b.u16(1); }),
        {"truncated while reading u32 value", "needs 4 bytes, 2 left"});
    add("array element type 13", one_kv("a", kTypeArray, [](ByteBuilder& b) { b.u32(13).u64(1).u32(0); }),
        {"array element type id 13"});
    add("array element type 0xFFFFFFFF", one_kv("a", kTypeArray, [](ByteBuilder& b) { b.u32(0xFFFFFFFFu).u64(0); }),
        {"array element type id 4294967295"});
    add("u32 array count 2^62", one_kv("a", kTypeArray, [&](ByteBuilder& b) { b.u32(kTypeU32).u64(k2p62).u32(1); }),
        {"array of 4611686018427387904 elements", "past the end"});
    add("f64 array one element short", one_kv("a", kTypeArray, [](ByteBuilder& b) { b.u32(kTypeF64).u64(3).f64(1).f64(2); }),
        {"array of 3 elements of 8 bytes", "past the end"});
    add("string array count 2^60", one_kv("a", kTypeArray, [&](ByteBuilder& b) { b.u32(kTypeString).u64(k2p60).str("x"); }),
        {"array claims 1152921504606846976 elements"});
    add("string array element past the end",
        one_kv("a", kTypeArray, [](ByteBuilder& b) { b.u32(kTypeString).u64(2).str("ok").u64(100).raw("short"); }),
        {"string array element has length 100"});
    add("array of arrays count 2^60", one_kv("a", kTypeArray, [&](ByteBuilder& b) { b.u32(kTypeArray).u64(k2p60).fill(24); }),
        {"array claims 1152921504606846976 elements"});
    add("arrays nested four deep", one_kv("a", kTypeArray, [](ByteBuilder& b) {
            for (int k = 0; k < 3; k++) b.u32(kTypeArray).u64(1);
            b.u32(kTypeU8).u64(1).u8(0);
        }),
        {"nested deeper than 2 levels"});
    add("arrays nested 10000 deep", one_kv("a", kTypeArray, [](ByteBuilder& b) {
            for (int k = 0; k < 10000; k++) b.u32(kTypeArray).u64(1);
            b.u32(kTypeU8).u64(0);
        }),
        {"nested deeper"});
    add("bool value 2", one_kv("b", kTypeBool, [](ByteBuilder& b) { b.u8(2); }), {"'b'", "bool value is 2"});
    add("bool array element 7", one_kv("b", kTypeArray, [](ByteBuilder& b) { b.u32(kTypeBool).u64(3).u8(0).u8(1).u8(7); }),
        {"bool array element is not 0 or 1"});
    {
        ByteBuilder b;
        b.header(0, 3).key("a", kTypeU32).u32(1).key("b", kTypeU32).u32(2).key("a", kTypeString).str("again");
        add("duplicate metadata key", b.bytes, {"metadata key 'a' appears twice"});
    }
    add("second key cut short", ByteBuilder().header(0, 2).key("a", kTypeU32).u32(1).u64(3).raw("ab").bytes,
        {"metadata key has length 3 but only 2 bytes remain"});

    // Alignment.
    add("general.alignment 0", with_alignment([](ByteBuilder& b) { b.key("general.alignment", kTypeU32).u32(0); }),
        {"general.alignment", "power of two", "got 0"});
    add("general.alignment 3", with_alignment([](ByteBuilder& b) { b.key("general.alignment", kTypeU32).u32(3); }),
        {"general.alignment", "power of two", "got 3"});
    add("general.alignment 2^21", with_alignment([](ByteBuilder& b) { b.key("general.alignment", kTypeU64).u64(1u << 21); }),
        {"general.alignment", "1 MiB", "got 2097152"});
    add("general.alignment -32", with_alignment([](ByteBuilder& b) { b.key("general.alignment", kTypeI32).u32((uint32_t)-32); }),
        {"general.alignment", "power of two"});
    add("general.alignment a string", with_alignment([](ByteBuilder& b) { b.key("general.alignment", kTypeString).str("32"); }),
        {"general.alignment", "string"});
    add("general.alignment a float", with_alignment([](ByteBuilder& b) { b.key("general.alignment", kTypeF32).f32(32.0f); }),
        {"general.alignment", "f32"});

    // Tensor infos.
    add("tensor n_dims 0", one_tensor({}, kTensorF32, 0, 4), {"tensor 'w' has 0 dimensions", "expected 1 to 4"});
    add("tensor n_dims 5", one_tensor({1, 1, 1, 1, 1}, kTensorF32, 0, 4), {"tensor 'w' has 5 dimensions"});
    add("tensor dim 0", one_tensor({4, 0}, kTensorF32, 0, 16), {"tensor 'w' dimension 1 is 0", "zero or too large"});
    add("tensor dim 2^41", one_tensor({1ull << 41}, kTensorF32, 0, 16), {"dimension 0 is 2199023255552", "too large"});
    add("dims whose product overflows 64 bits", one_tensor({65536, 65536, 65536, 65536}, kTensorF32, 0, 16),
        {"dimension 3 is 65536", "too large"});
    add("dims whose product passes 2^48", one_tensor({1ull << 32, 1ull << 32}, kTensorF32, 0, 16),
        {"dimension 1 is 4294967296"});
    // Q8_1 (id 9) is ggml's activation type: no GGUF weight uses it and Steward refuses it.
    add("tensor type Q8_1", one_tensor({32}, 9, 0, 36), {"tensor 'w'", "Q8_1", "id 9", "Supported: F32, F16, BF16, Q4_0"});
    add("tensor type 99", one_tensor({4}, 99, 0, 16), {"tensor 'w'", "unknown", "id 99"});
    add("Q8_0 row of 33", one_tensor({33, 2}, kTensorQ8_0, 0, 136), {"row of 33 elements", "block size 32"});
    add("tensor offset 16 with alignment 32", one_tensor({4}, kTensorF32, 16, 48),
        {"data offset 16", "not a multiple of the alignment 32"});
    {
        ByteBuilder b;
        b.header(1, 1).key("general.alignment", kTypeU32).u32(64).tensor("w", {4}, kTensorF32, 32).pad_to(64).fill(64);
        add("tensor offset 32 with alignment 64", b.bytes, {"data offset 32", "not a multiple of the alignment 64"});
    }
    add("tensor data past the end", one_tensor({100}, kTensorF32, 0, 16), {"tensor 'w' data (offset 0, 400 bytes)", "past the end", "truncated"});
    add("tensor data one byte short", one_tensor({4}, kTensorF32, 0, 15), {"(offset 0, 16 bytes)", "(15 bytes)"});
    add("tensor offset near 2^64", one_tensor({4}, kTensorF32, ~0ull - 31, 16), {"tensor 'w' data (offset 18446744073709551584", "past the end"});
    add("tensor offset + size wraps past 2^64", one_tensor({16}, kTensorF32, ~0ull - 31, 64),  // 64 bytes at 2^64 - 32
        {"tensor 'w' data (offset 18446744073709551584", "past the end"});
    add("tensor offset one past the data", one_tensor({4}, kTensorF32, 32, 16), {"data (offset 32, 16 bytes)", "past the end"});
    {
        ByteBuilder b;
        b.header(2, 0).tensor("w", {4}, kTensorF32, 0).tensor("w", {4}, kTensorF32, 32).pad_to(32).fill(64);
        add("duplicate tensor names", b.bytes, {"tensor name 'w' appears twice"});
    }
    add("tensor name length past the end", ByteBuilder().header(1, 0).u64(500).raw("w").fill(40).bytes,
        {"tensor name has length 500"});
    add("truncated inside the tensor info", ByteBuilder().header(1, 0).str("w").u32(1).u64(4).u32(0).u32(0).bytes,
        {"truncated while reading tensor data offset"});  // the u64 offset has only 4 bytes
    {
        ByteBuilder b;  // header 24 + info 33 = 57 bytes: no padding, no data
        b.header(1, 0).tensor("w", {4}, kTensorF32, 0);
        add("data section missing, header unaligned", b.bytes, {"truncated before the tensor data section"});
        ByteBuilder c;  // header 24 + info 40 = 64 bytes: already aligned, no data
        c.header(1, 0).tensor("12345678", {4}, kTensorF32, 0);
        REQUIRE(c.bytes.size() == 64);
        add("data section missing, header aligned", c.bytes, {"past the end of the data section (0 bytes)"});
    }

    // Mutations of a valid writer file.
    {
        GgufWriter w;
        w.set_string("general.architecture", "llama");
        w.add_tensor("t", GgmlType::F32, {8}, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
        const std::vector<uint8_t> good = w.to_bytes();
        REQUIRE_FALSE(parse_error(good));
        auto m = good;
        m[3] = 'X';
        add("writer file, magic byte changed", m, {"wrong magic 'GGUX'"});
        m = good;
        put_u32_at(m, 4, 1);
        add("writer file, version set to 1", m, {"version 1;"});
        m = good;
        put_u64_at(m, 8, k2p60);
        add("writer file, n_tensors set to 2^60", m, {"tensor count 1152921504606846976"});
        m = good;
        put_u64_at(m, 16, k2p60);
        add("writer file, n_kv set to 2^60", m, {"metadata count 1152921504606846976"});
        m = good;
        put_u64_at(m, 24, 1ull << 40);  // the key's length
        add("writer file, key length set to 2^40", m, {"metadata key has length 1099511627776"});
        m = good;
        m.resize(m.size() - 1);
        add("writer file, last data byte cut", m, {"tensor 't' data (offset 0, 32 bytes)", "(31 bytes)"});
    }
    return cs;
}

}  // namespace

TEST_CASE("malformed GGUF files give an Error that names the problem, never a crash", "[gguf]") {
    const auto cases = bad_cases();
    CHECK(cases.size() >= 30);
    for (const BadCase& c : cases) {
        INFO("case: " << c.what);
        const auto msg = parse_error(c.bytes);
        REQUIRE(msg);
        INFO("message: " << *msg);
        CHECK(msg->find("case.gguf") != std::string::npos);  // the file is named
        for (const std::string& needle : c.needles) CHECK_THAT(*msg, Catch::Contains(needle));
    }
}

TEST_CASE("every truncation of a valid GGUF file is an error until the tensor data is complete", "[gguf]") {
    GgufWriter w;
    w.set_u32("general.quantization_version", 2);
    w.set_string("general.architecture", "llama");
    w.set_string_array("tokenizer.ggml.tokens", {"<s>", "</s>", "a"});
    w.set_f32_array("tokenizer.ggml.scores", {0.0f, -1.0f, -2.5f});
    w.set_i32_array("tokenizer.ggml.token_type", {3, 3, 1});
    w.set_bool("b", true);
    w.add_tensor("a", GgmlType::F16, {5}, std::vector<uint8_t>(10, 1));
    w.add_tensor("q", GgmlType::Q8_0, {32, 2}, std::vector<uint8_t>(68, 2));
    w.add_tensor("z", GgmlType::F32, {3}, std::vector<uint8_t>(12, 3));

    for (auto [label, file] : {std::pair{"minimal hand-encoded", minimal_file()}, std::pair{"rich hand-encoded", rich_file()},
                               std::pair{"writer, alignment 32", w.to_bytes(32)}, std::pair{"writer, alignment 64", w.to_bytes(64)}}) {
        INFO(label);
        const size_t need = required_end(file);
        if (std::string(label).find("hand") != std::string::npos) CHECK(need == file.size());
        for (size_t len = 0; len < file.size(); len++) {
            const std::vector<uint8_t> prefix(file.begin(), file.begin() + (std::ptrdiff_t)len);
            const auto msg = parse_error(prefix);
            if (len >= need) {  // only trailing padding is missing: still a complete file
                if (msg) FAIL("prefix of " << len << " bytes failed: " << *msg);
            } else if (!msg) {
                FAIL("prefix of " << len << " of " << file.size() << " bytes parsed");
            } else if (msg->find("truncat") == std::string::npos && msg->find("past the end") == std::string::npos &&
                       msg->find("remain") == std::string::npos && msg->find("larger than the file") == std::string::npos &&
                       msg->find("more than the") == std::string::npos) {
                FAIL("prefix of " << len << " bytes: message does not say the file is cut short: " << *msg);
            }
        }
    }
}

TEST_CASE("random byte flips in a valid GGUF file never crash the reader", "[gguf]") {
    GgufWriter w;
    w.set_u32("general.file_type", 7);
    w.set_string("general.architecture", "llama");
    w.set_string_array("tokenizer.ggml.tokens", {"<s>", "</s>", "hello"});
    w.set_f32_array("s", {1.0f, 2.0f});
    w.set_i32_array("i", {1, -1});
    w.set_bool("b", false);
    w.add_tensor("a", GgmlType::F32, {3, 2}, std::vector<uint8_t>(24, 1));
    w.add_tensor("h", GgmlType::BF16, {4}, std::vector<uint8_t>(8, 2));
    w.add_tensor("q", GgmlType::Q8_0, {32}, std::vector<uint8_t>(34, 3));
    const std::vector<uint8_t> good = w.to_bytes();
    // Also flip the hand-encoded file, whose header has every value type.
    const std::vector<uint8_t> rich = rich_file();

    std::mt19937_64 rng(20240607);
    int n_ok = 0, n_err = 0;
    for (int it = 0; it < 6000; it++) {
        std::vector<uint8_t> f = (it % 2) ? good : rich;
        const int n_flips = 1 + (int)(rng() % 4);
        for (int k = 0; k < n_flips; k++) {
            // Mostly in the header, where flips change structure rather than tensor bytes.
            const size_t limit = (rng() % 4) ? std::min<size_t>(f.size(), 260) : f.size();
            const size_t pos = rng() % limit;
            switch (rng() % 3) {
                case 0: f[pos] ^= uint8_t(1u << (rng() % 8)); break;
                case 1: f[pos] = uint8_t(rng()); break;
                default: f[pos] = (rng() % 2) ? 0xff : 0x00; break;
            }
        }
        if (rng() % 8 == 0) f.resize(rng() % f.size());  // sometimes cut it short as well

        ExactBuffer buf(f);
        std::optional<Expected<std::unique_ptr<GgufFile>>> parsed;
        try {
            parsed.emplace(GgufFile::parse(buf.data(), buf.size(), "fuzz.gguf"));
        } catch (...) {
            FAIL("parse threw at iteration " << it);
        }
        auto& r = *parsed;
        if (!r) {
            n_err++;
            if (r.error().message.empty()) FAIL("empty error message at iteration " << it);
            continue;
        }
        n_ok++;
        // Everything the reader hands out must lie inside the buffer; touch it so ASan checks.
        const uint8_t* lo = buf.data();
        const uint8_t* hi = buf.data() + buf.size();
        unsigned sum = 0;
        for (auto& t : r.value()->tensors()) {
            if (t.data < lo || t.data > hi || t.n_bytes > (uint64_t)(hi - t.data))
                FAIL("tensor '" << t.name << "' lies outside the buffer at iteration " << it);
            for (uint64_t k = 0; k < t.n_bytes; k++) sum += t.data[k];
        }
        for (auto& [key, v] : r.value()->metadata()) {
            for (unsigned char ch : v.str) sum += ch;
            for (auto s : v.arr_str)
                for (unsigned char ch : s) sum += ch;
            (void)r.value()->get_f32_array(key);
            (void)r.value()->get_i32_array(key);
            (void)r.value()->get_string_array(key);
            (void)r.value()->get_float(key);
        }
        (void)sum;
    }
    CHECK(n_ok > 0);  // the loop exercised both outcomes
    CHECK(n_err > 0);
}

TEST_CASE("GgufFile::open names the path when it is missing, a directory or empty", "[gguf]") {
    TempPath dir("dir");
    std::filesystem::create_directory(dir.path);

    auto missing = GgufFile::open((dir.path / "nope.gguf").string());
    REQUIRE_FALSE(missing);
    CHECK_THAT(missing.error().message, Catch::Contains("cannot open model file") && Catch::Contains("nope.gguf") &&
                                            Catch::Contains("No such file"));

    auto is_dir = GgufFile::open(dir.path.string());
    REQUIRE_FALSE(is_dir);
    CHECK_THAT(is_dir.error().message, Catch::Contains(dir.path.string()) && Catch::Contains("not a regular file"));

    const auto empty = dir.path / "empty.gguf";
    std::ofstream(empty).close();
    auto is_empty = GgufFile::open(empty.string());
    REQUIRE_FALSE(is_empty);
    CHECK_THAT(is_empty.error().message, Catch::Contains("empty.gguf") && Catch::Contains("truncated"));

    const auto junk = dir.path / "junk.gguf";
    std::ofstream(junk) << "this is not a model";
    auto is_junk = GgufFile::open(junk.string());
    REQUIRE_FALSE(is_junk);
    CHECK_THAT(is_junk.error().message, Catch::Contains("junk.gguf") && Catch::Contains("wrong magic 'this'"));

    auto unwritable = GgufWriter().write((dir.path / "no" / "such" / "dir.gguf").string());
    REQUIRE_FALSE(unwritable);
    CHECK_THAT(unwritable.error().message, Catch::Contains("cannot write") && Catch::Contains("dir.gguf"));
}

// ---------------------------------------------------------------------------------------------
// Conversions

// The hardware conversion is the reference: compiled for F16C here (the build's baseline lacks it)
// and run only where the CPU has it.
namespace {
__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
uint32_t bits_of(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    return x;
}
float float_of(uint32_t x) {
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
}  // namespace

TEST_CASE("f16_to_f32 matches F16C for all 65536 patterns, and f32_to_f16 inverts it", "[gguf]") {
    if (!cpu_features().f16c) {
        WARN("this CPU has no F16C: hardware reference skipped");
        return;
    }
    int n_bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float got = f16_to_f32((uint16_t)h);
        const float want = hw_f16_to_f32((uint16_t)h);
        if (f16_is_nan((uint16_t)h)) {
            // NaN stays NaN with its sign; the payload may be quieted, so bits are not compared.
            if (!std::isnan(got) || std::signbit(got) != ((h & 0x8000) != 0)) n_bad++;
            const uint16_t back = f32_to_f16(got);
            if (!f16_is_nan(back) || (back & 0x8000) != (h & 0x8000)) n_bad++;
            continue;
        }
        if (bits_of(got) != bits_of(want)) {
            if (n_bad++ < 10) FAIL_CHECK("f16_to_f32(0x" << std::hex << h << ") = 0x" << bits_of(got) << ", F16C 0x" << bits_of(want));
        }
        if (f32_to_f16(got) != h) {
            if (n_bad++ < 10) FAIL_CHECK("f32_to_f16(f16_to_f32(0x" << std::hex << h << ")) = 0x" << f32_to_f16(got));
        }
    }
    CHECK(n_bad == 0);
}

TEST_CASE("f32_to_f16 rounds like F16C: ties to even, subnormals, overflow, inf and nan", "[gguf]") {
    if (!cpu_features().f16c) {
        WARN("this CPU has no F16C: hardware reference skipped");
        return;
    }
    std::vector<float> xs;
    // Every f16 value, the midpoints to its neighbour (exact ties) and the floats either side of them.
    for (uint32_t h = 0; h < 0x7c00; h++) {
        const float lo = hw_f16_to_f32((uint16_t)h);
        const float hi = hw_f16_to_f32((uint16_t)(h + 1));  // 0x7c00 is inf: the overflow tie
        const float mid = (float)(((double)lo + (double)hi) / 2);
        for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
            xs.push_back(x);
            xs.push_back(-x);
        }
    }
    // The overflow edge (65504 is the largest finite f16, 65520 the tie to inf) and the underflow
    // edge (2^-24 is the smallest subnormal, 2^-25 the tie to zero).
    for (float x : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e10f, FLT_MAX, 0x1p-24f, 0x1p-25f, std::nextafter(0x1p-25f, 1.0f),
                    std::nextafter(0x1p-25f, 0.0f), 0x1p-26f, 0x1.8p-24f, 0x1p-14f, std::nextafter(0x1p-14f, 0.0f),
                    FLT_MIN, FLT_TRUE_MIN, 0.0f, INFINITY, 1.0f / 3.0f, 0.1f}) {
        xs.push_back(x);
        xs.push_back(-x);
    }
    std::mt19937 rng(7);
    for (int k = 0; k < 300000; k++) xs.push_back(float_of(rng()));  // every exponent, nans included
    std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
    for (int k = 0; k < 100000; k++) xs.push_back(small(rng));
    for (uint32_t nan_bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7fa00000u})
        xs.push_back(float_of(nan_bits));

    int n_bad = 0;
    for (float x : xs) {
        const uint16_t got = f32_to_f16(x);
        const uint16_t want = hw_f32_to_f16(x);
        bool ok;
        if (std::isnan(x))
            ok = f16_is_nan(got) && (got & 0x8000) == (want & 0x8000);
        else
            ok = got == want;
        if (!ok) {
            if (n_bad < 10)
                FAIL_CHECK("f32_to_f16(" << x << " = 0x" << std::hex << bits_of(x) << ") = 0x" << got << ", F16C 0x" << want);
            n_bad++;
        }
    }
    CHECK(xs.size() > 400000);
    CHECK(n_bad == 0);
}

TEST_CASE("f32_to_bf16 rounds to nearest even and keeps nan a nan", "[gguf]") {
    struct Row {
        uint32_t f32_bits;
        uint16_t bf16;
        const char* why;
    };
    const Row rows[] = {
        {0x3f800000, 0x3f80, "1.0 is exact"},
        {0xbfc00000, 0xbfc0, "-1.5 is exact"},
        {0x40490fdb, 0x4049, "pi: low half 0x0fdb < 0x8000 rounds down"},
        {0x3f807fff, 0x3f80, "just below the tie rounds down"},
        {0x3f808000, 0x3f80, "tie, 0x3f80 even: stays"},
        {0x3f808001, 0x3f81, "just above the tie rounds up"},
        {0x3f818000, 0x3f82, "tie, 0x3f81 odd: rounds up to even"},
        {0x3f7fffff, 0x3f80, "rounding carries into the exponent"},
        {0x7f7fffff, 0x7f80, "FLT_MAX rounds up to inf"},
        {0x7f7f7fff, 0x7f7f, "just under the overflow tie stays finite"},
        {0x7f800000, 0x7f80, "inf"},
        {0xff800000, 0xff80, "-inf"},
        {0x00000000, 0x0000, "+0"},
        {0x80000000, 0x8000, "-0"},
        {0x00000001, 0x0000, "smallest subnormal rounds to 0"},
        {0x00018000, 0x0002, "subnormal tie, odd: rounds up"},
        {0x00008000, 0x0000, "subnormal tie, even: stays"},
        {0x7fc00000, 0x7fc0, "quiet nan"},
    };
    for (const Row& r : rows) {
        INFO(r.why);
        float f;
        std::memcpy(&f, &r.f32_bits, 4);
        CHECK(f32_to_bf16(f) == r.bf16);
    }
    // A signalling nan whose payload lies only in the low half would round to inf without care.
    for (uint32_t nan_bits : {0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fffffffu}) {
        float f;
        std::memcpy(&f, &nan_bits, 4);
        const uint16_t h = f32_to_bf16(f);
        CHECK((h & 0x7f80) == 0x7f80);
        CHECK((h & 0x7f) != 0);
        CHECK((h & 0x8000) == ((nan_bits >> 16) & 0x8000));
    }
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(bf16_to_f32(0x4049) == 3.140625f);
    CHECK(bf16_to_f32(0xc000) == -2.0f);
    for (uint32_t h = 0; h < 65536; h++) {  // bf16 -> f32 -> bf16 is exact for every non-nan
        const float f = bf16_to_f32((uint16_t)h);
        if (!std::isnan(f) && f32_to_bf16(f) != h) FAIL("bf16 0x" << std::hex << h << " does not round-trip");
    }
}

TEST_CASE("Q8_0 quantisation matches a naive codec and errs by at most half a step", "[gguf]") {
    std::mt19937 rng(99);
    std::vector<float> x;
    // Blocks of different scales, then hand-made ones: all zero, one outlier, negative extreme.
    for (float scale : {1e-4f, 0.02f, 1.0f, 37.0f, 3000.0f}) {
        std::normal_distribution<float> nd(0.0f, scale);
        for (int k = 0; k < 4 * kQ8BlockSize; k++) x.push_back(nd(rng));
    }
    for (int k = 0; k < kQ8BlockSize; k++) x.push_back(0.0f);
    for (int k = 0; k < kQ8BlockSize; k++) x.push_back(k == 5 ? 1000.0f : 0.01f * (float)k);
    for (int k = 0; k < kQ8BlockSize; k++) x.push_back(k == 31 ? -5.0f : 0.15f * (float)(k % 7) - 0.4f);
    const int64_t n = (int64_t)x.size();
    REQUIRE(n % kQ8BlockSize == 0);

    std::vector<BlockQ8_0> q((size_t)(n / kQ8BlockSize));
    quantize_row_q8_0(x.data(), q.data(), n);
    std::vector<float> y((size_t)n);
    dequantize_row(GgmlType::Q8_0, q.data(), y.data(), n);

    double worst = 0.0;  // largest error in units of d
    for (int64_t b = 0; b < n / kQ8BlockSize; b++) {
        INFO("block " << b);
        // Naive codec, in double: d = max|x| / 127, q = round(x / d), stored scale is f16(d).
        double amax = 0.0;
        for (int i = 0; i < kQ8BlockSize; i++) amax = std::max(amax, std::fabs((double)x[b * kQ8BlockSize + i]));
        const double d = amax / 127.0;
        const double d16 = f16_to_f32(q[b].d);
        CHECK(q[b].d == f32_to_f16((float)d));
        for (int i = 0; i < kQ8BlockSize; i++) {
            const double xi = x[b * kQ8BlockSize + i];
            const int qi = q[b].qs[i];
            CHECK(qi >= -127);
            CHECK(qi <= 127);
            if (d == 0.0) {
                CHECK(qi == 0);
                CHECK(y[b * kQ8BlockSize + i] == 0.0f);
                continue;
            }
            const double naive = std::round(xi / d);
            // Float arithmetic may break an exact .5 tie the other way; nothing else may differ.
            if (qi != naive) CHECK(std::fabs(std::fabs(xi / d - std::trunc(xi / d)) - 0.5) < 1e-4);
            CHECK(std::fabs(qi - naive) <= 1);
            // Dequantisation is exactly f16(d) * q.
            CHECK(y[b * kQ8BlockSize + i] == (float)(d16 * qi));
            // Rounding to the grid of d costs at most d/2; the f16 scale moves q*d by q*|d - d16|.
            const double err = std::fabs(xi - y[b * kQ8BlockSize + i]);
            CHECK(err <= d / 2 + std::fabs(qi) * std::fabs(d - d16) + 2e-4 * d);
            worst = std::max(worst, (err - std::fabs(qi) * std::fabs(d - d16)) / d);
        }
    }
    CHECK(worst <= 0.5 + 2e-4);
}

TEST_CASE("type tables give ggml's names and sizes", "[gguf]") {
    CHECK(std::string(ggml_type_name(kTensorF32)) == "F32");
    CHECK(std::string(ggml_type_name(kTensorF16)) == "F16");
    CHECK(std::string(ggml_type_name(kTensorQ4_0)) == "Q4_0");
    CHECK(std::string(ggml_type_name(kTensorQ8_0)) == "Q8_0");
    CHECK(std::string(ggml_type_name(kTensorBF16)) == "BF16");
    CHECK(std::string(ggml_type_name(99)) == "unknown");
    CHECK(std::string(ggml_type_name(12)) == "Q4_K");
    CHECK(std::string(ggml_type_name(23)) == "IQ4_XS");
    for (uint32_t t : {kTensorF32, kTensorF16, kTensorQ4_0, 3u, 6u, 7u, kTensorQ8_0, 10u, 11u, 12u, 13u, 14u, 20u, 23u,
                       kTensorBF16})
        CHECK(ggml_type_supported(t));
    for (uint32_t t : {9u, 15u, 16u, 99u}) CHECK_FALSE(ggml_type_supported(t));
    CHECK(ggml_row_bytes(GgmlType::F32, 7) == 28);
    CHECK(ggml_row_bytes(GgmlType::F16, 7) == 14);
    CHECK(ggml_row_bytes(GgmlType::BF16, 7) == 14);
    CHECK(ggml_row_bytes(GgmlType::Q8_0, 96) == 3 * 34);
    // ggml's block sizes (ggml-common.h): 32-wide legacy blocks, 256-wide super-blocks.
    CHECK(ggml_row_bytes(GgmlType::Q4_0, 64) == 2 * 18);
    CHECK(ggml_row_bytes(GgmlType::Q5_1, 64) == 2 * 24);
    CHECK(ggml_row_bytes(GgmlType::IQ4_NL, 32) == 18);
    CHECK(ggml_row_bytes(GgmlType::Q2_K, 512) == 2 * 84);
    CHECK(ggml_row_bytes(GgmlType::Q4_K, 256) == 144);
    CHECK(ggml_row_bytes(GgmlType::Q6_K, 256) == 210);
    CHECK(ggml_row_bytes(GgmlType::IQ4_XS, 256) == 136);
    // The enum carries the spec's ids.
    CHECK((uint32_t)GgufType::FLOAT64 == kTypeF64);
    CHECK((uint32_t)GgufType::ARRAY == kTypeArray);
    CHECK((uint32_t)GgmlType::BF16 == kTensorBF16);
    CHECK((uint32_t)GgmlType::Q8_0 == kTensorQ8_0);
    CHECK(std::string(gguf_type_name(GgufType::STRING)) == "string");
    CHECK(std::string(gguf_type_name((GgufType)13)) == "unknown");

    // F16 and BF16 rows dequantise element by element.
    const uint16_t h[3] = {0x3c00, 0xc000, 0x7bff};  // f16: 1, -2, 65504
    float out[3];
    dequantize_row(GgmlType::F16, h, out, 3);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == -2.0f);
    CHECK(out[2] == 65504.0f);
    const uint16_t bh[2] = {0x3f80, 0xc040};  // bf16: 1, -3
    dequantize_row(GgmlType::BF16, bh, out, 2);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == -3.0f);
}

// Found by fuzz_gguf (tests/fuzz/corpus/fuzz_gguf/regress-model-layers-oom.seed, a 95 KiB synthetic
// model with a mutated block_count of ~16M): the loader sized its layer table from block_count before
// looking for blk.0's tensors and allocated 3 GB. It now grows the table as layers load; under
// scripts/fuzz.sh's 2 GiB limit the seed itself fails the run if that comes back.
TEST_CASE("A model whose block_count exceeds its layer tensors is refused, naming the missing tensor", "[gguf]") {
    const std::string path = std::string(STEWARD_SOURCE_DIR) + "/tests/fuzz/corpus/fuzz_gguf/regress-model-layers-oom.seed";
    auto file = GgufFile::open(path);
    REQUIRE(file.ok());
    REQUIRE((*file)->get_int("llama.block_count").value_or(0) > 1000000);
    auto model = Model::from_gguf(std::move(*file));
    REQUIRE(!model.ok());
    INFO(model.error().message);
    CHECK(model.error().message.find("blk.") != std::string::npos);
}
