// GGUF v3 (and v2) reader over a memory-mapped file, and a writer.
// The reader bounds-checks every offset, size, count and string length: a truncated, corrupt or
// hostile file yields an Error that names the problem, never an out-of-bounds read.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <steward/expected.h>

#include "model/ggml_types.h"

namespace steward {

class MappedFileGuard;  // model/mapping_guard.h

enum class GgufType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Strings point into the mapped file (valid while the GgufFile lives).
struct GgufValue {
    GgufType type = GgufType::UINT8;
    int64_t i = 0;       // integer types and BOOL (signed view)
    uint64_t u = 0;      // integer types and BOOL (unsigned view)
    double f = 0.0;      // FLOAT32 / FLOAT64
    std::string_view str;  // STRING
    // ARRAY: element type and count; fixed-size elements are at arr_data, strings in arr_str.
    GgufType arr_type = GgufType::UINT8;
    uint64_t arr_n = 0;
    const uint8_t* arr_data = nullptr;
    std::vector<std::string_view> arr_str;

    bool is_integer() const;
    bool is_float() const { return type == GgufType::FLOAT32 || type == GgufType::FLOAT64; }
};

struct GgufTensorInfo {
    std::string name;
    uint32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (innermost) dimension, as in ggml
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;  // relative to the start of the data section
    uint64_t n_bytes = 0;
    const uint8_t* data = nullptr;  // into the mapping
    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class GgufFile {
public:
    // Maps and parses path. Errors name the file and the problem.
    static Expected<std::unique_ptr<GgufFile>> open(const std::string& path);
    // Parses a buffer the caller keeps alive (tests, fuzzing). Bytes are not copied.
    static Expected<std::unique_ptr<GgufFile>> parse(const uint8_t* data, size_t size,
                                                     const std::string& name = "<memory>");
    // Parses bytes it takes ownership of (synthetic models built in memory).
    static Expected<std::unique_ptr<GgufFile>> from_bytes(std::vector<uint8_t> bytes,
                                                          const std::string& name = "<memory>");
    // Parses the header part of a GGUF (metadata and tensor infos, the first header_size() bytes of
    // a file): a model's description without its weights, as a worker sends it to the front. Tensor
    // shapes and types are checked; their data pointers are null.
    static Expected<std::unique_ptr<GgufFile>> header_from_bytes(std::vector<uint8_t> bytes,
                                                                 const std::string& name = "<header>");
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    const std::string& path() const { return path_; }
    const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

    const GgufValue* find(std::string_view key) const;
    const GgufTensorInfo* find_tensor(std::string_view name) const;
    // The types of the matrices a forward multiplies by: every tensor of two or more rows but the
    // token embedding table (rows are looked up), unless the output is tied to it.
    std::vector<GgmlType> matrix_types() const;
    // Typed getters: nullopt when absent or of an incompatible type.
    std::optional<std::string_view> get_string(std::string_view key) const;
    std::optional<int64_t> get_int(std::string_view key) const;
    std::optional<double> get_float(std::string_view key) const;  // ints convert too
    std::optional<bool> get_bool(std::string_view key) const;
    // Array getters: empty optional when absent or the element type differs.
    std::optional<std::vector<std::string_view>> get_string_array(std::string_view key) const;
    std::optional<std::vector<float>> get_f32_array(std::string_view key) const;
    std::optional<std::vector<int32_t>> get_i32_array(std::string_view key) const;
    // The file's mapping (null / 0 for a parsed buffer), and its guard (null for a parsed buffer):
    // registered before the first byte is parsed, so a file truncated while it loads or while it is
    // served faults into zero pages and an error instead of SIGBUS (model/mapping_guard.h).
    const void* mapped_data() const { return map_; }
    // The bytes parsed and served: the anonymous copy of the file (GgufFile::open's default), the
    // mapping (STEWARD_MMAP=1), or the caller's / owned buffer.
    const uint8_t* bytes() const { return base_; }
    size_t mapped_size() const { return map_size_; }
    const MappedFileGuard* guard() const { return guard_.get(); }
    // Bytes before the tensor data section (metadata, tensor infos, padding).
    size_t header_size() const { return header_size_; }
    // Parsed by header_from_bytes: no tensor data.
    bool header_only() const { return header_only_; }

private:
    GgufFile() = default;
    static Expected<std::unique_ptr<GgufFile>> from_owned(std::vector<uint8_t> bytes, const std::string& name, bool header_only);
    Expected<bool> parse_impl();

    std::string path_;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    std::vector<uint8_t> owned_;
    void* map_ = nullptr;  // non-null when we own an mmap
    size_t map_size_ = 0;
    void* copy_ = nullptr;  // the weights' anonymous copy on huge pages (base_ points into it), or null
    size_t copy_size_ = 0;
    void copy_to_anonymous_memory();
    std::unique_ptr<MappedFileGuard> guard_;  // unregistered before the unmap (see the destructor)
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    size_t header_size_ = 0;
    bool header_only_ = false;
    std::map<std::string, GgufValue, std::less<>> kv_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Writes a GGUF v3 file: metadata in insertion order, then tensor infos, then aligned data.
class GgufWriter {
public:
    void set_u32(const std::string& key, uint32_t v);
    void set_i32(const std::string& key, int32_t v);
    void set_u64(const std::string& key, uint64_t v);
    void set_f32(const std::string& key, float v);
    void set_bool(const std::string& key, bool v);
    void set_string(const std::string& key, const std::string& v);
    void set_string_array(const std::string& key, const std::vector<std::string>& v);
    void set_f32_array(const std::string& key, const std::vector<float>& v);
    void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
    // Copies a value read by GgufFile (scalars, strings, arrays of scalars or strings).
    Expected<bool> set_value(const std::string& key, const GgufValue& v);
    // dims as ggml orders them: dims[0] is the contiguous dimension.
    void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> dims,
                    std::vector<uint8_t> data);
    // A tensor's info without its data (n_bytes is what its data would take): for header_bytes
    // only (a simulated model's shape). to_bytes and write refuse a writer holding one.
    void add_tensor_shape(const std::string& name, GgmlType type, std::vector<int64_t> dims);
    // The header alone (metadata and tensor infos, offsets as if every tensor's data followed):
    // what GgufFile::header_from_bytes reads.
    std::vector<uint8_t> header_bytes(uint32_t alignment = 32) const;
    // Serialise to bytes (for tests) or to a file. alignment must be a power of two.
    std::vector<uint8_t> to_bytes(uint32_t alignment = 32) const;
    Expected<bool> write(const std::string& path, uint32_t alignment = 32) const;

private:
    struct Kv {
        std::string key;
        std::vector<uint8_t> encoded;  // type id + payload, already serialised
    };
    struct Tensor {
        std::string name;
        GgmlType type;
        std::vector<int64_t> dims;
        std::vector<uint8_t> data;
        uint64_t n_bytes = 0;  // data.size(), or a shape-only tensor's nominal size
        bool shape_only = false;
    };
    void put(const std::string& key, std::vector<uint8_t> encoded);
    std::vector<Kv> kvs_;
    std::vector<Tensor> tensors_;
};

}  // namespace steward
