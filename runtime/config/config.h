// The config's internal part (classification, plugin names, response formats) over the public
// value types of <steward/config.h> (include/steward/config.h).
#pragma once
#include <steward/config.h>

namespace steward {

// A plugin named by path (it contains '/' or ends in ".so") rather than by a name to search for.
bool plugin_is_path(const std::string& plugin);

// Request features the bucket rules look at.
struct RequestFeatures {
    std::string hint;
    int prompt_tokens = 0;
    int max_tokens = 0;
    double temperature = 0.0;
    bool tools = false;
    std::string response_format;
    std::string tenant;
};
// The response formats this build accepts, in a request or a [bucket.match]: "" (none) and "json".
// "json" is a classification feature only (what bucket rules match): a request's output is
// constrained by its grammar, json_schema or json_object, not by this. The error names the value and
// the accepted ones.
Expected<bool> check_response_format(const std::string& value);

// Index of the first matching bucket; the last bucket when none matches (validation requires
// at least one bucket).
size_t classify(const Config& c, const RequestFeatures& f);
// Why classify() chose its bucket, for the decision trace: the rules the bucket matched, and for
// each bucket before it the first rule the request failed.
std::string explain_classification(const Config& c, const RequestFeatures& f);

}  // namespace steward
