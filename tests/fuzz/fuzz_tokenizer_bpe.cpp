// Fuzzes the byte-level BPE tokenizer on a real vocabulary (llama-bpe, from shared/testdata): see
// fuzz_tokenizer.h for the invariants.
#include "fuzz_tokenizer.h"

namespace {
const steward::Tokenizer* g_tok = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    g_tok = steward_fuzz::load_vocab("llama-bpe").release();  // lives for the process
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    steward_fuzz::check_tokenizer(*g_tok, data, size);
    return 0;
}
