// A request's prompt in each pool's ids, for the request core (RequestVocab) and the router's
// prefix-cache lookup: the request's text or ids as given, or (GenerationRequest::render) each
// pool's own rendering (a chat with that pool's template), asked for once per pool and tokenized
// once with that pool's tokenizer; the run, the cache lookup and the output constraint of a pool
// all read that one rendering. No actors: the request actor builds it over its generation's pools.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <steward/request.h>

#include "grammar/constraint.h"
#include "model/tokenizer.h"
#include "request/request_fsm.h"

namespace steward {

// One pool of the request's generation, as its prompt sees it.
struct PromptTarget {
    PromptPool pool;                      // what the render hook is told (steward/request.h)
    const Tokenizer* tokenizer = nullptr;  // the pool's; outlives the PoolPrompts
};

class PoolPrompts : public RequestVocab {
public:
    // `req` must outlive this object.
    // documents_chars: the leading bytes of a text prompt that hold its documents (the runtime placed
    // them; 0: none, or a render hook says where).
    PoolPrompts(const GenerationRequest& req, std::vector<PromptTarget> pools, size_t documents_chars = 0);

    std::vector<int32_t> prompt_ids(int32_t pool) override;
    std::string prompt_error(int32_t pool) override;
    std::unique_ptr<TextDecoder> text_decoder(int32_t pool) override;
    std::pair<int32_t, int32_t> documents_span(int32_t pool) override;

    // The prompt's length as routing sees it before the pool is known (the bucket rules'
    // prompt_tokens): the count in the first pool whose prompt encodes. Exact for a text prompt
    // with one vocabulary, and for a chat whose pools render alike; otherwise an estimate (the
    // routed pool's run counts its own). 0 when no pool's prompt encodes.
    int32_t n_prompt_estimate();
    // The pool that estimate came from (-1: none).
    int32_t estimate_pool();

    // The output constraint of a run on `pool`: its rendering's grammar when it gave one, else the
    // request's own fields (constraint_of).
    Expected<OutputConstraint> constraint(int32_t pool);

    // Rendered per pool (the request has a render hook).
    bool per_pool() const { return (bool)req_.render; }
    // For the decision trace: "pool 'b' chat_template_file /x/y.jinja" ("" for a prompt given as is).
    std::string template_used(int32_t pool) const;

private:
    struct Entry {
        bool done = false;
        std::vector<int32_t> ids;
        int32_t n_encoded = 0;  // ids the text encoded to (ids may add a BOS for an empty one)
        std::string grammar;  // the rendering's (GBNF), "" none
        std::string error;    // why ids is empty
        size_t doc_begin = 0, doc_end = 0;  // the documents' bytes in the text (equal: none)
        std::pair<int32_t, int32_t> doc_tokens{-1, -1};  // documents_span, once asked
    };
    Entry& entry(int32_t pool);
    const Tokenizer& tokenizer(int32_t pool) const { return *pools_.at((size_t)pool).tokenizer; }

    const GenerationRequest& req_;
    size_t documents_chars_ = 0;
    std::vector<PromptTarget> pools_;
    std::vector<Entry> entries_;
    std::vector<std::string> texts_;  // per pool: the rendered text (pools with one tokenizer share its ids)
};

}  // namespace steward
