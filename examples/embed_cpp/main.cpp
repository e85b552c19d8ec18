// embed_cpp: the C++ embedding API from an installed Steward (find_package(steward),
// steward::runtime). Starts a runtime from a TOML file, streams one request's tokens, prints its
// finish reason and figures, then the runtime's per-bucket metrics. Exits 1 on any failure.
//   build/embed_cpp configs/test_tiny.toml [PROMPT]
#include <steward/runtime.h>

#include <cstdio>
#include <future>
#include <string>

int main(int argc, char** argv) {
    if (argc < 2 || argc > 3) {
        std::fprintf(stderr, "usage: embed_cpp CONFIG.toml [PROMPT]\n");
        return 2;
    }
    auto started = steward::Runtime::start(argv[1]);
    if (!started) {
        std::fprintf(stderr, "embed_cpp: %s\n", started.error().message.c_str());
        return 1;
    }
    steward::Runtime& rt = **started;
    std::printf("started %s (config generation %llu, %zu pools)\n", argv[1],
                static_cast<unsigned long long>(rt.config_generation()), rt.config()->pools.size());

    steward::GenerationRequest req;
    req.prompt = argc == 3 ? argv[2] : "Once upon a time";
    req.max_tokens = 16;
    req.ignore_eos = true;  // exactly max_tokens tokens, so the output below is checkable

    // Streaming: the pieces arrive on a runtime thread, the result once at the end.
    std::string streamed;
    size_t n_streamed_ids = 0;
    std::promise<steward::GenerationResult> finished;
    steward::RequestCallbacks cb;
    cb.on_token = [&](const std::string& piece, const std::vector<int32_t>& ids) {
        streamed += piece;
        n_streamed_ids += ids.size();
        std::printf("token: %zu id(s), %zu byte(s)\n", ids.size(), piece.size());
    };
    cb.on_finish = [&](const steward::GenerationResult& r) { finished.set_value(r); };
    const steward::RequestHandle h = rt.submit(req, std::move(cb));
    const steward::GenerationResult r = finished.get_future().get();

    std::printf("request %llu: finish %s, bucket %s, pool %s, upgraded %d, fallback %d\n",
                static_cast<unsigned long long>(h), steward::finish_reason_name(r.finish), r.bucket.c_str(),
                r.pool.c_str(), r.upgraded ? 1 : 0, r.fallback ? 1 : 0);
    const steward::RequestMetrics& m = r.metrics;
    std::printf("metrics: prompt_tokens=%d completion_tokens=%d cached_tokens=%d ttft_ms=%.2f e2e_ms=%.2f\n",
                m.prompt_tokens, m.completion_tokens, m.cached_tokens, m.ttft_ms, m.e2e_ms);
    if (!r.ok()) {
        std::fprintf(stderr, "embed_cpp: the request failed: %s\n", r.error.c_str());
        return 1;
    }
    // The stream and the result agree: the same bytes, one id per token.
    if (streamed != r.text || n_streamed_ids != r.tokens.size() || r.tokens.size() != 16) {
        std::fprintf(stderr, "embed_cpp: streamed %zu bytes / %zu ids, result %zu bytes / %zu tokens\n",
                     streamed.size(), n_streamed_ids, r.text.size(), r.tokens.size());
        return 1;
    }
    std::printf("streamed %zu tokens, text matches the result\n", n_streamed_ids);

    std::printf("%s", rt.metrics_table().c_str());
    std::printf("embed_cpp: OK\n");
    return 0;
}
