// A request's prompt per pool (pool_prompts.h): rendered (or taken as given), tokenized once, kept.
#include "request/pool_prompts.h"

#include <exception>

namespace steward {

namespace {

struct PoolDecoder : TextDecoder {
    explicit PoolDecoder(const Tokenizer& t) : d(t) {}
    std::string push(int32_t id) override { return d.push(id); }
    std::string flush() override { return d.flush(); }
    StreamDecoder d;
};

}  // namespace

PoolPrompts::PoolPrompts(const GenerationRequest& req, std::vector<PromptTarget> pools, size_t documents_chars)
    : req_(req), documents_chars_(documents_chars), pools_(std::move(pools)), entries_(pools_.size()), texts_(pools_.size()) {}

PoolPrompts::Entry& PoolPrompts::entry(int32_t pool) {
    Entry& e = entries_.at((size_t)pool);
    if (e.done) return e;
    e.done = true;
    const std::string& name = pools_[(size_t)pool].pool.name;
    if (!req_.render && !req_.prompt_ids.empty()) {
        e.ids = req_.prompt_ids;
        e.n_encoded = (int32_t)e.ids.size();
        return e;
    }
    std::string text;
    if (req_.render) {
        PoolPrompt p;
        // The hook is the caller's code on a runtime thread: a throw must fail this pool's run, not
        // the request actor (whose on_finish would then never come).
        try {
            p = req_.render(pools_[(size_t)pool].pool);
        } catch (const std::exception& x) {
            p.error = "rendering the prompt for pool '" + name + "' threw: " + x.what();
        } catch (...) {
            p.error = "rendering the prompt for pool '" + name + "' threw a non-standard exception";
        }
        if (!p.error.empty()) {
            e.error = std::move(p.error);
            return e;
        }
        if (!p.grammar.empty()) {
            if (auto g = compile_constraint(ConstraintKind::GBNF, p.grammar); !g) {
                e.error = "the output grammar rendered for pool '" + name + "' does not compile: " + g.error().message;
                return e;
            }
            e.grammar = std::move(p.grammar);
        }
        text = std::move(p.text);
        if (p.documents_begin < p.documents_end && p.documents_end <= text.size()) {
            e.doc_begin = p.documents_begin;
            e.doc_end = p.documents_end;
        }
    } else {
        text = req_.prompt;
        if (documents_chars_ > 0 && documents_chars_ <= text.size()) e.doc_end = documents_chars_;
    }
    // Tokenized once: a pool with the same tokenizer and the same text takes the ids already made.
    const Tokenizer& tok = tokenizer(pool);
    bool shared = false;
    for (size_t j = 0; j < entries_.size() && !shared; j++)
        if (j != (size_t)pool && entries_[j].done && entries_[j].error.empty() && pools_[j].tokenizer == &tok &&
            texts_[j] == text) {
            e.ids = entries_[j].ids;
            e.n_encoded = entries_[j].n_encoded;
            shared = true;
        }
    if (!shared) {
        e.ids = tok.encode(text, req_.add_bos && tok.add_bos_default(), req_.parse_special);
        e.n_encoded = (int32_t)e.ids.size();
        if (e.ids.empty() && tok.bos() >= 0) e.ids.push_back(tok.bos());
    }
    if (e.ids.empty()) e.error = "empty prompt and the vocabulary of pool '" + name + "' has no BOS token";
    texts_[(size_t)pool] = std::move(text);
    return e;
}

std::vector<int32_t> PoolPrompts::prompt_ids(int32_t pool) { return entry(pool).ids; }

std::string PoolPrompts::prompt_error(int32_t pool) { return entry(pool).error; }

// The tokens of the text before the documents and through them. A token may straddle either edge
// (BPE merges across it), so both ends move one token earlier: the keyed part may start a token
// early (a block holding any of the documents' tokens carries their keys), and the priority part
// never reaches past them.
std::pair<int32_t, int32_t> PoolPrompts::documents_span(int32_t pool) {
    Entry& e = entry(pool);
    if (e.doc_tokens.first >= 0) return e.doc_tokens;
    e.doc_tokens = {0, 0};
    if (!e.error.empty() || e.doc_end <= e.doc_begin) return e.doc_tokens;
    const std::string& text = texts_.at((size_t)pool);
    const Tokenizer& tok = tokenizer(pool);
    const bool bos = req_.add_bos && tok.add_bos_default();
    auto count = [&](size_t chars) { return (int32_t)tok.encode(text.substr(0, chars), bos, req_.parse_special).size(); };
    const int32_t before = e.doc_begin > 0 ? count(e.doc_begin) : (bos ? 1 : 0);
    const int32_t through = std::min<int32_t>(count(e.doc_end) - 1, (int32_t)e.ids.size());
    const int32_t from = std::max<int32_t>(before - 1, 0);
    if (through > from) e.doc_tokens = {from, through};
    return e.doc_tokens;
}

std::unique_ptr<TextDecoder> PoolPrompts::text_decoder(int32_t pool) { return std::make_unique<PoolDecoder>(tokenizer(pool)); }

int32_t PoolPrompts::estimate_pool() {
    for (int32_t i = 0; i < (int32_t)pools_.size(); i++)
        if (!req_.render || entry(i).error.empty()) return i;  // a prompt given as is: the first pool's count, as ever
    return -1;
}

int32_t PoolPrompts::n_prompt_estimate() {
    if (!req_.render && !req_.prompt_ids.empty()) return (int32_t)req_.prompt_ids.size();
    const int32_t p = estimate_pool();
    return p < 0 ? 0 : entry(p).n_encoded;
}

Expected<OutputConstraint> PoolPrompts::constraint(int32_t pool) {
    if (req_.render && pool >= 0 && pool < (int32_t)entries_.size())
        if (const Entry& e = entry(pool); !e.grammar.empty()) return OutputConstraint{ConstraintKind::GBNF, e.grammar};
    return constraint_of(req_);
}

std::string PoolPrompts::template_used(int32_t pool) const {
    if (!req_.render || pool < 0 || pool >= (int32_t)pools_.size()) return "";
    const PromptPool& p = pools_[(size_t)pool].pool;
    return "pool '" + p.name + "' " + p.template_source;
}

}  // namespace steward
