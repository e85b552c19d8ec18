// check_request: the field rules shared by every way in.
#include "request/request_check.h"

#include "config/config.h"
#include "grammar/constraint.h"

namespace steward {

SamplingParams sampling_of(const GenerationRequest& req) {
    SamplingParams sp;
    sp.temperature = req.temperature;
    sp.top_p = req.top_p;
    sp.top_k = req.top_k;
    sp.seed = req.seed;
    sp.presence_penalty = req.presence_penalty;
    sp.frequency_penalty = req.frequency_penalty;
    sp.logit_bias = req.logit_bias;
    sp.n_top_logprobs = req.top_logprobs;
    return sp;
}

Expected<bool> check_request(const GenerationRequest& req) {
    if (auto fmt = check_response_format(req.response_format); !fmt) return fmt.error();
    if (auto ok = check_sampling(sampling_of(req)); !ok) return ok.error();
    if (req.stop.size() > 16) return make_error("stop has ", req.stop.size(), " strings; at most 16 are accepted");
    for (const std::string& s : req.stop)
        if (s.empty() || s.size() > 256)
            return make_error("a stop string is ", s.size(), " bytes long; each must be 1 to 256 bytes");
    auto c = constraint_of(req);
    if (!c) return c.error();
    if (auto g = compile_constraint(*c); !g) return g.error();  // cached: the run's compile is a hit
    if (req.max_tokens < -1)
        return make_error("max_tokens is ", req.max_tokens, "; it must be >= 0 (0: the config's default) or -1 (the rest of the context)");
    return true;
}

}  // namespace steward
