// The one check of a GenerationRequest's fields before it is routed (the C++ API, the C API, HTTP
// all reach it): sampling values, stop strings, top_logprobs, response_format.
#pragma once
#include <steward/expected.h>
#include <steward/request.h>

#include "cpu/sampling.h"

namespace steward {

// The request's sampling values as the sampler and the engine take them (one conversion for the
// check below and for the runs).
SamplingParams sampling_of(const GenerationRequest& req);

// Stop strings: at most 16, each 1-256 bytes. The rest as check_sampling and check_response_format.
// The error names the field and the accepted range.
Expected<bool> check_request(const GenerationRequest& req);

}  // namespace steward
