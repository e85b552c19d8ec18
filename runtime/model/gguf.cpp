// GGUF reader and writer. Layout (v3, little-endian): magic "GGUF", u32 version, u64 n_tensors,
// u64 n_kv, n_kv x (string key, u32 type, value), n_tensors x (string name, u32 n_dims,
// u64 ne[n_dims], u32 type, u64 offset), padding to `general.alignment`, tensor data.
#include "model/gguf.h"
#include "model/mapping_guard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace steward {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringLen = 1ull << 30;
constexpr uint32_t kMaxDims = 4;

// Fixed size of a scalar GGUF type, 0 for STRING/ARRAY, -1 for an unknown id.
int64_t scalar_size(uint32_t t) {
    switch ((GgufType)t) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
        case GgufType::UINT16: case GgufType::INT16: return 2;
        case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
        case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
        case GgufType::STRING: case GgufType::ARRAY: return 0;
    }
    return -1;
}

// A bounds-checked cursor over the file bytes.
struct Cursor {
    const uint8_t* base;
    size_t size;
    size_t pos = 0;
    std::string err;

    size_t left() const { return size - pos; }
    bool fail(std::string msg) {
        if (err.empty()) err = std::move(msg) + " (at byte offset " + std::to_string(pos) + ")";
        return false;
    }
    template <typename T>
    bool read(T& out, const char* what) {
        if (left() < sizeof(T))
            return fail(std::string("file is truncated while reading ") + what + ": needs " +
                        std::to_string(sizeof(T)) + " bytes, " + std::to_string(left()) + " left");
        std::memcpy(&out, base + pos, sizeof(T));
        pos += sizeof(T);
        return true;
    }
    bool read_string(std::string_view& out, const char* what) {
        uint64_t n;
        if (!read(n, what)) return false;
        if (n > kMaxStringLen || n > left())
            return fail(std::string(what) + " has length " + std::to_string(n) + " but only " +
                        std::to_string(left()) + " bytes remain in the file");
        out = std::string_view(reinterpret_cast<const char*>(base + pos), n);
        pos += n;
        return true;
    }
};

bool read_scalar(Cursor& c, GgufType t, GgufValue& v) {
    switch (t) {
        case GgufType::UINT8: { uint8_t x; if (!c.read(x, "u8 value")) return false; v.u = x; v.i = x; return true; }
        case GgufType::INT8: { int8_t x; if (!c.read(x, "i8 value")) return false; v.i = x; v.u = (uint64_t)x; return true; }
        case GgufType::BOOL: {
            uint8_t x;
            if (!c.read(x, "bool value")) return false;
            if (x > 1) return c.fail("bool value is " + std::to_string(x) + ", expected 0 or 1");
            v.u = x; v.i = x; return true;
        }
        case GgufType::UINT16: { uint16_t x; if (!c.read(x, "u16 value")) return false; v.u = x; v.i = x; return true; }
        case GgufType::INT16: { int16_t x; if (!c.read(x, "i16 value")) return false; v.i = x; v.u = (uint64_t)x; return true; }
        case GgufType::UINT32: { uint32_t x; if (!c.read(x, "u32 value")) return false; v.u = x; v.i = x; return true; }
        case GgufType::INT32: { int32_t x; if (!c.read(x, "i32 value")) return false; v.i = x; v.u = (uint64_t)x; return true; }
        case GgufType::UINT64: { uint64_t x; if (!c.read(x, "u64 value")) return false; v.u = x; v.i = (int64_t)x; return true; }
        case GgufType::INT64: { int64_t x; if (!c.read(x, "i64 value")) return false; v.i = x; v.u = (uint64_t)x; return true; }
        case GgufType::FLOAT32: { float x; if (!c.read(x, "f32 value")) return false; v.f = x; return true; }
        case GgufType::FLOAT64: { double x; if (!c.read(x, "f64 value")) return false; v.f = x; return true; }
        case GgufType::STRING: return c.read_string(v.str, "string value");
        case GgufType::ARRAY: break;
    }
    return c.fail("internal: read_scalar on an array");
}

bool read_value(Cursor& c, GgufType t, GgufValue& v, int depth) {
    v.type = t;
    if (t != GgufType::ARRAY) return read_scalar(c, t, v);
    if (depth > 2) return c.fail("arrays nested deeper than 2 levels are not supported");
    uint32_t at;
    uint64_t n;
    if (!c.read(at, "array element type") || !c.read(n, "array length")) return false;
    const int64_t es = scalar_size(at);
    if (es < 0) return c.fail("array element type id " + std::to_string(at) + " is not a GGUF type (0..12)");
    v.arr_type = (GgufType)at;
    v.arr_n = n;
    if (es > 0) {
        if (n > c.left() / (uint64_t)es)
            return c.fail("array of " + std::to_string(n) + " elements of " + std::to_string(es) +
                          " bytes runs past the end of the file");
        v.arr_data = c.base + c.pos;
        if (v.arr_type == GgufType::BOOL)
            for (uint64_t k = 0; k < n; k++)
                if (v.arr_data[k] > 1) return c.fail("bool array element is not 0 or 1");
        c.pos += n * es;
        return true;
    }
    // Every string takes at least 8 bytes, every nested array at least 12: bound n before reserving.
    const uint64_t min_elem = v.arr_type == GgufType::STRING ? 8 : 12;
    if (n > c.left() / min_elem)
        return c.fail("array claims " + std::to_string(n) + " elements, more than the " +
                      std::to_string(c.left()) + " remaining bytes can hold");
    if (v.arr_type == GgufType::STRING) {
        v.arr_str.resize(n);
        for (uint64_t k = 0; k < n; k++)
            if (!c.read_string(v.arr_str[k], "string array element")) return false;
        return true;
    }
    for (uint64_t k = 0; k < n; k++) {  // nested arrays: validated and skipped
        GgufValue inner;
        if (!read_value(c, GgufType::ARRAY, inner, depth + 1)) return false;
    }
    return true;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
    static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    auto i = (uint32_t)t;
    return i < 13 ? names[i] : "unknown";
}

bool GgufValue::is_integer() const {
    switch (type) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
        case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
        case GgufType::BOOL: return true;
        default: return false;
    }
}

Expected<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; the fstat
    // below then refuses anything but a regular file before a byte is read.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return make_error("cannot open model file '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return make_error("model '", path, "' is not a regular file (a FIFO, device or directory); give the path of a .gguf file");
    }
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = path;
    f->size_ = (size_t)st.st_size;
    if (f->size_ > 0) {
        void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            ::close(fd);
            return make_error("cannot memory-map '", path, "': ", std::strerror(errno));
        }
        f->map_ = m;
        f->map_size_ = f->size_;
        f->base_ = static_cast<const uint8_t*>(m);
        f->guard_ = std::make_unique<MappedFileGuard>(path, fd, m, f->size_);  // keeps and closes fd
        f->copy_to_anonymous_memory();
    } else {
        ::close(fd);
    }
    auto r = f->parse_impl();
    // Truncated while it was parsed: what was read may be zeros, so whatever parse said is moot.
    if (f->guard_ && f->guard_->faulted())
        return make_error("the model file '", path, "' changed while it was being loaded (truncated); load it again once it is written");
    if (!r) return r.error();
    return f;
}

Expected<std::unique_ptr<GgufFile>> GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = name;
    f->base_ = data;
    f->size_ = size;
    auto r = f->parse_impl();
    if (!r) return r.error();
    return f;
}

Expected<std::unique_ptr<GgufFile>> GgufFile::from_owned(std::vector<uint8_t> bytes, const std::string& name, bool header_only) {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = name;
    f->header_only_ = header_only;
    f->owned_ = std::move(bytes);
    f->base_ = f->owned_.data();
    f->size_ = f->owned_.size();
    auto r = f->parse_impl();
    if (!r) return r.error();
    return f;
}

Expected<std::unique_ptr<GgufFile>> GgufFile::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
    return from_owned(std::move(bytes), name, false);
}

Expected<std::unique_ptr<GgufFile>> GgufFile::header_from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
    return from_owned(std::move(bytes), name, true);
}

GgufFile::~GgufFile() {
    guard_.reset();  // no fault may be turned into zero pages of a range about to be unmapped
    if (map_) munmap(map_, map_size_);
    if (copy_) munmap(copy_, copy_size_);
}

// Decode streams every weight once per token; from the file's page-cache mapping (4 KiB pages:
// a TLB miss every 4 KiB, and the hardware prefetchers stop at each page boundary) it ran at
// 56-78% of the read bandwidth, from anonymous memory on 2 MiB pages at 77-91% (bench_model,
// F32 and Q6_K at 1 thread, this VM). So the file is copied once into anonymous memory asking for
// transparent huge pages (MADV_HUGEPAGE), and the mapping's pages are released (MADV_DONTNEED: the
// process keeps one copy, RSS = the file's size; copied in slices so the peak is too). The mapping and its guard stay: a file truncated
// during the copy still faults into zeros and an error, and the guard's size / mtime check still
// reports a file changed underneath. STEWARD_MMAP=1 keeps the weights in the mapping (many
// processes sharing one page cache copy); so does a failed allocation.
void GgufFile::copy_to_anonymous_memory() {
    const char* env = std::getenv("STEWARD_MMAP");
    if ((env && std::string(env) == "1") || !map_ || size_ == 0) return;
    constexpr size_t kHuge = (size_t)2 << 20;
    const size_t size = (size_ + kHuge - 1) / kHuge * kHuge + kHuge;  // room to align to 2 MiB
    void* a = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return;
    uint8_t* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(a) + kHuge - 1) & ~(uintptr_t)(kHuge - 1));
    madvise(aligned, size - (size_t)(aligned - static_cast<uint8_t*>(a)), MADV_HUGEPAGE);  // advice: failure is fine
    // In slices, each slice's mapped pages released after it is copied: peak RSS stays at the
    // copy plus one slice, not twice the file.
    constexpr size_t kSlice = (size_t)64 << 20;
    for (size_t off = 0; off < size_; off += kSlice) {
        const size_t n = std::min(kSlice, size_ - off);
        std::memcpy(aligned + off, static_cast<const uint8_t*>(map_) + off, n);
        madvise(static_cast<uint8_t*>(map_) + off, n, MADV_DONTNEED);
    }
    copy_ = a;
    copy_size_ = size;
    base_ = aligned;
}

Expected<bool> GgufFile::parse_impl() {
    auto bad = [&](const std::string& msg) {
        return make_error("invalid GGUF file '", path_, "': ", msg,
                          ". The file is corrupt or not a GGUF model; re-download or re-convert it.");
    };
    Cursor c{base_, size_, 0, {}};
    uint32_t magic;
    if (!c.read(magic, "magic")) return bad(c.err);
    if (magic != kGgufMagic) {
        char m[5] = {0};
        std::memcpy(m, &magic, 4);
        for (int k = 0; k < 4; k++)  // a NUL would end the string early: "wrong magic ''"
            if (m[k] < 32 || m[k] > 126) m[k] = '?';
        return bad(std::string("wrong magic '") + m + "', expected 'GGUF'");
    }
    if (!c.read(version_, "version")) return bad(c.err);
    if (version_ != 2 && version_ != 3)
        return make_error("GGUF file '", path_, "' has version ", std::to_string(version_),
                          "; Steward reads versions 2 and 3. Re-convert the model with a current llama.cpp.");
    uint64_t n_tensors, n_kv;
    if (!c.read(n_tensors, "tensor count") || !c.read(n_kv, "metadata count")) return bad(c.err);
    // A key-value pair takes at least 12 bytes and a tensor info at least 24: bound the counts.
    if (n_kv > c.left() / 12)
        return bad("metadata count " + std::to_string(n_kv) + " is larger than the file can hold");
    if (n_tensors > c.left() / 24)
        return bad("tensor count " + std::to_string(n_tensors) + " is larger than the file can hold");

    for (uint64_t k = 0; k < n_kv; k++) {
        std::string_view key;
        uint32_t t;
        if (!c.read_string(key, "metadata key") || !c.read(t, "metadata value type")) return bad(c.err);
        if (scalar_size(t) < 0)
            return bad("metadata key '" + std::string(key) + "' has type id " + std::to_string(t) +
                       ", not a GGUF type (0..12)");
        GgufValue v;
        if (!read_value(c, (GgufType)t, v, 0)) return bad("metadata key '" + std::string(key) + "': " + c.err);
        if (kv_.count(key)) return bad("metadata key '" + std::string(key) + "' appears twice");
        kv_.emplace(std::string(key), std::move(v));
    }

    if (auto a = find("general.alignment")) {
        if (!a->is_integer())
            return bad(std::string("general.alignment has type ") + gguf_type_name(a->type) +
                       ", expected an integer power of two");
        if (a->u == 0 || a->u > (1u << 20) || (a->u & (a->u - 1)) != 0)
            return bad("general.alignment must be a power of two up to 1 MiB, got " + std::to_string(a->u));
        alignment_ = (uint32_t)a->u;
    }

    tensors_.resize(n_tensors);
    for (uint64_t k = 0; k < n_tensors; k++) {
        GgufTensorInfo& ti = tensors_[k];
        std::string_view name;
        if (!c.read_string(name, "tensor name") || !c.read(ti.n_dims, "tensor dimension count")) return bad(c.err);
        ti.name = std::string(name);
        if (ti.n_dims == 0 || ti.n_dims > kMaxDims)
            return bad("tensor '" + ti.name + "' has " + std::to_string(ti.n_dims) + " dimensions, expected 1 to 4");
        uint64_t n_el = 1;
        for (uint32_t d = 0; d < ti.n_dims; d++) {
            uint64_t ne;
            if (!c.read(ne, "tensor dimension")) return bad(c.err);
            if (ne == 0 || ne > (1ull << 40) || n_el > (1ull << 48) / ne)
                return bad("tensor '" + ti.name + "' dimension " + std::to_string(d) + " is " +
                           std::to_string(ne) + ", zero or too large");
            ti.ne[d] = (int64_t)ne;
            n_el *= ne;
        }
        uint32_t type;
        if (!c.read(type, "tensor type") || !c.read(ti.offset, "tensor data offset")) return bad(c.err);
        if (!ggml_type_supported(type))
            return make_error("tensor '", ti.name, "' in '", path_, "' has type ", ggml_type_name(type), " (id ",
                              std::to_string(type),
                              "), which Steward does not load. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                              "Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4; re-quantize the "
                              "model to one of them (e.g. llama-quantize ... Q4_K_M).");
        ti.type = (GgmlType)type;
        const int64_t be = ggml_type_block_elems(ti.type);
        if (ti.ne[0] % be != 0)
            return bad("tensor '" + ti.name + "' has a row of " + std::to_string(ti.ne[0]) +
                       " elements, not a multiple of its type's block size " + std::to_string(be));
        ti.n_bytes = n_el / be * ggml_type_block_bytes(ti.type);
        if (ti.offset % alignment_ != 0)
            return bad("tensor '" + ti.name + "' data offset " + std::to_string(ti.offset) +
                       " is not a multiple of the alignment " + std::to_string(alignment_));
        if (tensor_index_.count(ti.name)) return bad("tensor name '" + ti.name + "' appears twice");
        tensor_index_.emplace(ti.name, k);
    }

    const uint64_t data_start = (c.pos + alignment_ - 1) / alignment_ * alignment_;
    header_size_ = (size_t)std::min<uint64_t>(data_start, size_);
    if (header_only_) return true;  // tensor infos checked; no data to point at
    if (n_tensors > 0 && data_start > size_) return bad("file is truncated before the tensor data section");
    const uint64_t data_size = size_ > data_start ? size_ - data_start : 0;
    for (auto& ti : tensors_) {
        if (ti.offset > data_size || ti.n_bytes > data_size - ti.offset)
            return bad("tensor '" + ti.name + "' data (offset " + std::to_string(ti.offset) + ", " +
                       std::to_string(ti.n_bytes) + " bytes) runs past the end of the data section (" +
                       std::to_string(data_size) + " bytes); the file is truncated");
        ti.data = base_ + data_start + ti.offset;
    }
    return true;
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
    auto v = find(key);
    if (!v || v->type != GgufType::STRING) return std::nullopt;
    return v->str;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
    auto v = find(key);
    if (!v || !v->is_integer()) return std::nullopt;
    return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
    auto v = find(key);
    if (!v) return std::nullopt;
    if (v->is_float()) return v->f;
    if (v->is_integer()) return (double)v->i;
    return std::nullopt;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
    auto v = find(key);
    if (!v || !v->is_integer()) return std::nullopt;
    return v->u != 0;
}

std::optional<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
    auto v = find(key);
    if (!v || v->type != GgufType::ARRAY || v->arr_type != GgufType::STRING) return std::nullopt;
    return v->arr_str;
}

std::optional<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
    auto v = find(key);
    if (!v || v->type != GgufType::ARRAY || v->arr_type != GgufType::FLOAT32) return std::nullopt;
    std::vector<float> out(v->arr_n);
    if (v->arr_n) std::memcpy(out.data(), v->arr_data, v->arr_n * 4);
    return out;
}

std::optional<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
    auto v = find(key);
    if (!v || v->type != GgufType::ARRAY) return std::nullopt;
    std::vector<int32_t> out(v->arr_n);
    for (uint64_t k = 0; k < v->arr_n; k++) {
        switch (v->arr_type) {
            case GgufType::INT32: case GgufType::UINT32: std::memcpy(&out[k], v->arr_data + 4 * k, 4); break;
            case GgufType::INT8: case GgufType::UINT8: out[k] = (int8_t)v->arr_data[k]; break;
            default: return std::nullopt;
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {
template <typename T>
void put_raw(std::vector<uint8_t>& b, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put_raw<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
}
}  // namespace

void GgufWriter::put(const std::string& key, std::vector<uint8_t> encoded) {
    for (auto& kv : kvs_)
        if (kv.key == key) {
            kv.encoded = std::move(encoded);
            return;
        }
    kvs_.push_back({key, std::move(encoded)});
}

void GgufWriter::set_u32(const std::string& key, uint32_t v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::UINT32);
    put_raw(b, v);
    put(key, std::move(b));
}
void GgufWriter::set_i32(const std::string& key, int32_t v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::INT32);
    put_raw(b, v);
    put(key, std::move(b));
}
void GgufWriter::set_u64(const std::string& key, uint64_t v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::UINT64);
    put_raw(b, v);
    put(key, std::move(b));
}
void GgufWriter::set_f32(const std::string& key, float v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::FLOAT32);
    put_raw(b, v);
    put(key, std::move(b));
}
void GgufWriter::set_bool(const std::string& key, bool v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::BOOL);
    put_raw<uint8_t>(b, v ? 1 : 0);
    put(key, std::move(b));
}
void GgufWriter::set_string(const std::string& key, const std::string& v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::STRING);
    put_str(b, v);
    put(key, std::move(b));
}
void GgufWriter::set_string_array(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::ARRAY);
    put_raw<uint32_t>(b, (uint32_t)GgufType::STRING);
    put_raw<uint64_t>(b, v.size());
    for (auto& s : v) put_str(b, s);
    put(key, std::move(b));
}
void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::ARRAY);
    put_raw<uint32_t>(b, (uint32_t)GgufType::FLOAT32);
    put_raw<uint64_t>(b, v.size());
    for (float x : v) put_raw(b, x);
    put(key, std::move(b));
}
void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)GgufType::ARRAY);
    put_raw<uint32_t>(b, (uint32_t)GgufType::INT32);
    put_raw<uint64_t>(b, v.size());
    for (int32_t x : v) put_raw(b, x);
    put(key, std::move(b));
}

Expected<bool> GgufWriter::set_value(const std::string& key, const GgufValue& v) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, (uint32_t)v.type);
    auto put_scalar = [&](GgufType t, const uint8_t* raw, const GgufValue* sv) {
        const int64_t n = scalar_size((uint32_t)t);
        if (t == GgufType::STRING) {
            put_str(b, std::string(sv->str));
        } else if (raw) {
            b.insert(b.end(), raw, raw + n);
        } else if (t == GgufType::FLOAT32) {
            put_raw<float>(b, (float)sv->f);
        } else if (t == GgufType::FLOAT64) {
            put_raw<double>(b, sv->f);
        } else {
            const uint64_t u = sv->u;
            b.insert(b.end(), reinterpret_cast<const uint8_t*>(&u), reinterpret_cast<const uint8_t*>(&u) + n);
        }
    };
    if (v.type != GgufType::ARRAY) {
        put_scalar(v.type, nullptr, &v);
    } else {
        if (v.arr_type == GgufType::ARRAY) return make_error("cannot copy nested array '", key, "'");
        put_raw<uint32_t>(b, (uint32_t)v.arr_type);
        put_raw<uint64_t>(b, v.arr_n);
        if (v.arr_type == GgufType::STRING) {
            for (auto s : v.arr_str) put_str(b, std::string(s));
        } else {
            const int64_t n = scalar_size((uint32_t)v.arr_type);
            b.insert(b.end(), v.arr_data, v.arr_data + n * (int64_t)v.arr_n);
        }
    }
    put(key, std::move(b));
    return true;
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims,
                            std::vector<uint8_t> data) {
    const uint64_t n = data.size();
    tensors_.push_back({name, type, std::move(dims), std::move(data), n, false});
}

void GgufWriter::add_tensor_shape(const std::string& name, GgmlType type, std::vector<int64_t> dims) {
    int64_t n_elems = 1;
    for (int64_t d : dims) n_elems *= d;
    const uint64_t n = (uint64_t)(n_elems / ggml_type_block_elems(type) * ggml_type_block_bytes(type));
    tensors_.push_back({name, type, std::move(dims), {}, n, true});
}

namespace {
// Header + metadata + tensor infos, padded to alignment; offsets assigned in tensor order.
std::vector<uint8_t> encode_header(const auto& kvs, const auto& tensors, uint32_t alignment) {
    std::vector<uint8_t> b;
    put_raw<uint32_t>(b, kGgufMagic);
    put_raw<uint32_t>(b, 3);
    put_raw<uint64_t>(b, tensors.size());
    const bool has_align = alignment != 32;
    // The alignment argument decides the layout. A caller's own general.alignment (copied from
    // another file, say) would appear twice or contradict the layout, and the reader rejects both.
    auto is_align_key = [](const auto& kv) { return kv.key == "general.alignment"; };
    const size_t n_kv = kvs.size() - (size_t)std::count_if(kvs.begin(), kvs.end(), is_align_key);
    put_raw<uint64_t>(b, n_kv + (has_align ? 1 : 0));
    if (has_align) {
        put_str(b, "general.alignment");
        put_raw<uint32_t>(b, (uint32_t)GgufType::UINT32);
        put_raw<uint32_t>(b, alignment);
    }
    for (auto& kv : kvs) {
        if (is_align_key(kv)) continue;
        put_str(b, kv.key);
        b.insert(b.end(), kv.encoded.begin(), kv.encoded.end());
    }
    uint64_t offset = 0;
    for (auto& t : tensors) {
        put_str(b, t.name);
        put_raw<uint32_t>(b, (uint32_t)t.dims.size());
        for (int64_t d : t.dims) put_raw<uint64_t>(b, (uint64_t)d);
        put_raw<uint32_t>(b, (uint32_t)t.type);
        put_raw<uint64_t>(b, offset);
        offset += (t.n_bytes + alignment - 1) / alignment * alignment;
    }
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    return b;
}
}  // namespace

std::vector<uint8_t> GgufWriter::header_bytes(uint32_t alignment) const { return encode_header(kvs_, tensors_, alignment); }

std::vector<uint8_t> GgufWriter::to_bytes(uint32_t alignment) const {
    std::vector<uint8_t> b = encode_header(kvs_, tensors_, alignment);
    if (std::any_of(tensors_.begin(), tensors_.end(), [](const Tensor& t) { return t.shape_only; })) return b;  // no data to add
    for (auto& t : tensors_) {
        b.insert(b.end(), t.data.begin(), t.data.end());
        b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    }
    return b;
}

Expected<bool> GgufWriter::write(const std::string& path, uint32_t alignment) const {
    if (std::any_of(tensors_.begin(), tensors_.end(), [](const Tensor& t) { return t.shape_only; }))
        return make_error("cannot write '", path, "': the writer holds tensor shapes without data (a simulated model's header)");
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return make_error("cannot write '", path, "': ", std::strerror(errno));
    const std::vector<uint8_t> header = encode_header(kvs_, tensors_, alignment);
    bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
    static const uint8_t zeros[4096] = {};
    for (auto& t : tensors_) {
        if (!ok) break;
        ok = std::fwrite(t.data.data(), 1, t.data.size(), f) == t.data.size();
        size_t pad = (alignment - t.data.size() % alignment) % alignment;
        while (ok && pad > 0) {
            const size_t n = pad < sizeof(zeros) ? pad : sizeof(zeros);
            ok = std::fwrite(zeros, 1, n, f) == n;
            pad -= n;
        }
    }
    if (std::fclose(f) != 0) ok = false;
    if (!ok) return make_error("write to '", path, "' failed (disk full?): ", std::strerror(errno));
    return true;
}

}  // namespace steward

namespace steward {

std::vector<GgmlType> GgufFile::matrix_types() const {
    const bool tied = find_tensor("output.weight") == nullptr;
    std::vector<GgmlType> out;
    for (const GgufTensorInfo& t : tensors_) {
        if (t.ne[1] <= 1 || (t.name == "token_embd.weight" && !tied)) continue;
        const GgmlType type = (GgmlType)t.type;
        if (std::find(out.begin(), out.end(), type) == out.end()) out.push_back(type);
    }
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace steward
