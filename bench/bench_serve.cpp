// Serving bench: replays a workload file (runtime/workload: the JSONL `steward run --save-workload`
// writes) with its arrival times over HTTP against any OpenAI-compatible server (steward serve,
// llama-server), streaming, one connection per in-flight request, and prints per bucket TTFT
// p50/p95/p99, TPOT mean, e2e p99, output tok/s and cached prompt tokens. scripts/bench_serve.sh
// runs it against both servers; --compare prints two saved runs side by side with ratios.
//   bench_serve --port 8080 --workload wl.jsonl [--greedy] [--stop-at-eos] [--session-field] [--out run.json] [--name N]
//               [--steward-fields] [--sequential]
// --steward-fields sends each request's bucket hint as the model (Steward: a bucket name picks that
// bucket) and response_format json_object for the workload's "json" requests; --sequential sends
// one request at a time in file order, ignoring arrival times (the same batches as `steward run
// --sequential`, for comparing outputs); --out's JSON carries each request's output text.
// Every request asks ignore_eos (both servers then produce max_tokens tokens) unless --stop-at-eos;
// --greedy sends temperature 0; --session-field sends agent turns' session (Steward's extension).
//   bench_serve --compare steward.json llama.json
//   bench_serve --requests 40 [--rate 2 --seed 0 --scale 1] --save-workload wl.jsonl   (writes the
//     standard workload exactly as `steward run --requests 40 --save-workload wl.jsonl` does, without the run)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "replay/http_replay.h"
#include "workload/workload.h"

using namespace steward;


int main(int argc, char** argv) {
    ReplayOptions o;
    WorkloadGenParams gen;  // steward run's defaults (its --requests default: 120)
    gen.n_requests = 120;
    gen.seed = 1;
    std::string save_workload;
    for (int i = 1; i < argc; i++) {
        const std::string k = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "bench_serve: %s needs a value (see the file's header)\n", k.c_str());
                std::exit(1);
            }
            return argv[++i];
        };
        if (k == "--compare") {
            const std::string a = val(), b = val();
            return http_replay_compare(a, b);
        }
        if (k == "--port") o.port = (uint16_t)std::stoi(val());
        else if (k == "--workload") o.workload = val();
        else if (k == "--out") o.out = val();
        else if (k == "--name") o.name = val();
        else if (k == "--model") o.model = val();
        else if (k == "--greedy") o.greedy = true;
        else if (k == "--stop-at-eos") o.ignore_eos = false;
        else if (k == "--session-field") o.session_field = true;
        else if (k == "--steward-fields") o.steward_fields = true;
        else if (k == "--sequential") o.sequential = true;
        else if (k == "--requests") gen.n_requests = std::stoi(val());
        else if (k == "--rate") gen.rate = std::stod(val());
        else if (k == "--seed") gen.seed = std::stoull(val());
        else if (k == "--scale") gen.scale = std::stod(val());
        else if (k == "--save-workload") save_workload = val();
        else {
            std::fprintf(stderr, "bench_serve: unknown option %s (see the file's header)\n", k.c_str());
            return 1;
        }
    }
    if (!save_workload.empty()) {
        if (auto ok = check_workload_gen(gen); !ok) {
            std::fprintf(stderr, "bench_serve: %s\n", ok.error().message.c_str());
            return 1;
        }
        if (auto e = write_workload_file(generate_workload(gen), save_workload)) {
            std::fprintf(stderr, "bench_serve: %s\n", e->message.c_str());
            return 1;
        }
        return 0;
    }
    if (o.workload.empty()) {
        std::fprintf(stderr, "bench_serve: --workload FILE is required (steward run --save-workload FILE writes one)\n");
        return 1;
    }
    return http_replay(o);
}
