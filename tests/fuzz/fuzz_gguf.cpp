// Fuzzes the GGUF reader (GgufFile::parse, the path GgufFile::open takes after mapping the file),
// then what reads a parsed file: every typed getter, the tokenizer loader and the model loader.
// Invariants: no crash or sanitizer report; every tensor's bytes lie inside the input; what parses
// re-serialises (GgufWriter::set_value) and parses again to the same metadata.
#include <cstdint>
#include <cstdlib>
#include <cstdio>

#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

using namespace steward;

namespace {

void fail(const char* what) {
    std::fprintf(stderr, "fuzz_gguf invariant broken: %s\n", what);
    std::abort();
}

// Touches every value the getters hand out (ASan sees an out-of-bounds view).
size_t touch(const GgufFile& f) {
    size_t sum = 0;
    for (const auto& [key, v] : f.metadata()) {
        sum += key.size();
        if (auto s = f.get_string(key)) sum += s->empty() ? 0 : (unsigned char)s->back();
        if (auto i = f.get_int(key)) sum += (size_t)*i;
        if (auto d = f.get_float(key)) sum += *d > 0;
        if (auto b = f.get_bool(key)) sum += *b;
        if (auto a = f.get_string_array(key))
            for (auto s : *a) sum += s.empty() ? 0 : (unsigned char)s.front() + (unsigned char)s.back();
        if (auto a = f.get_f32_array(key)) sum += a->size();
        if (auto a = f.get_i32_array(key)) sum += a->size();
        if (f.find(key) != &v) fail("find() does not return the metadata entry");
    }
    return sum;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    setenv("SPDLOG_LEVEL", "off", 0);  // unknown pre-tokenizers log warnings: keep the output readable
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parsed = GgufFile::parse(data, size, "fuzz.gguf");
    if (!parsed) {
        if (parsed.error().message.empty()) fail("an error with no message");
        return 0;
    }
    const GgufFile& f = **parsed;
    volatile size_t sum = touch(f);
    for (const GgufTensorInfo& t : f.tensors()) {
        if (t.n_bytes > size || !t.data || t.data < data || (size_t)(t.data - data) > size - t.n_bytes)
            fail("a tensor's bytes lie outside the input");
        if (t.n_bytes) sum = sum + t.data[0] + t.data[t.n_bytes - 1];
        if (f.find_tensor(t.name) == nullptr) fail("find_tensor() misses a listed tensor");
    }

    // What was read writes back and reads again the same.
    // general.alignment is the writer's own (to_bytes' argument decides the layout), not copied.
    GgufWriter w;
    size_t n_written = 0;
    for (const auto& [key, v] : f.metadata())
        if (key != "general.alignment" && w.set_value(key, v)) n_written++;
    auto again = GgufFile::from_bytes(w.to_bytes(f.alignment()), "rewritten.gguf");
    if (!again) fail("metadata set_value() accepted does not parse back");
    if ((*again)->alignment() != f.alignment()) fail("the rewritten file has another alignment");
    if ((*again)->metadata().size() != n_written + (f.alignment() != 32)) fail("rewritten metadata lost or gained keys");
    for (const auto& [key, v] : (*again)->metadata()) {
        if (key == "general.alignment") continue;
        const GgufValue* orig = f.find(key);
        if (!orig || orig->type != v.type || orig->u != v.u || orig->str != v.str || orig->arr_n != v.arr_n)
            fail("a rewritten value differs from the original");
    }

    // Its header alone (what a worker sends a front) parses to the same metadata and tensor infos.
    if (f.header_size() > size) fail("header_size() runs past the input");
    auto head = GgufFile::header_from_bytes(std::vector<uint8_t>(data, data + f.header_size()), "header.gguf");
    if (!head) fail("the header of a file that parses does not parse alone");
    if ((*head)->metadata().size() != f.metadata().size() || (*head)->tensors().size() != f.tensors().size())
        fail("the header alone has other metadata or tensors");
    for (size_t i = 0; i < f.tensors().size(); i++) {
        const GgufTensorInfo& a = f.tensors()[i];
        const GgufTensorInfo& b = (*head)->tensors()[i];
        if (a.name != b.name || a.type != b.type || a.n_bytes != b.n_bytes || b.data != nullptr)
            fail("a tensor info differs in the header alone (or points at data)");
    }
    // Whatever the raw input is, the header parser does not crash on it either.
    (void)GgufFile::header_from_bytes(std::vector<uint8_t>(data, data + size), "raw-header.gguf");

    // The tokenizer and the model loader read the same file.
    if (auto tok = Tokenizer::from_gguf(f)) {
        const auto ids = (*tok)->encode("Hello, world! \xF0\x9F\xA6\x99 12345", true, true);
        for (int32_t id : ids)
            if (id < 0 || id >= (*tok)->n_vocab()) fail("the tokenizer of a fuzzed file gave an id out of range");
        sum = sum + (*tok)->decode(ids).size();
    }
    auto model = Model::from_gguf(std::move(*parsed));
    if (model) sum = sum + (*model)->n_params();
    // The front's model from the header alone has the same shape as the full model.
    if (auto hm = Model::from_gguf(std::move(*head)); model && hm) {
        if ((*hm)->has_weights() || (*hm)->params().n_layer != (*model)->params().n_layer ||
            (*hm)->params().n_vocab != (*model)->params().n_vocab || (*hm)->n_params() != (*model)->n_params() ||
            (*hm)->weight_bytes_per_token() != (*model)->weight_bytes_per_token())
            fail("the model from the header alone differs from the full model");
    } else if (model) {
        fail("a file whose model loads has a header whose model does not");
    }
    (void)sum;
    return 0;
}
