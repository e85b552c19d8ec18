// The steward binary: `model synth`, `generate`, `embed`, `run`, `serve`, `config check`, `template render`, `--version`.
// Errors print one line naming the problem and the fix, and exit non-zero; only the CLI exits.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <charconv>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <steward/runtime.h>

#include "cli/commands.h"
#include "replay/http_replay.h"
#include "config/config.h"
#include "config/limits.h"
#include "cpu/cpu_features.h"
#include "cpu/embed.h"
#include "cpu/generator.h"
#include "cpu/plan.h"
#include "model/model.h"
#include "model/synth.h"

using namespace steward;

int steward::cli_fail(const std::string& msg) {
    std::fprintf(stderr, "steward: error: %s\n", msg.c_str());
    return 1;
}

namespace {

int fail(const std::string& msg) { return cli_fail(msg); }

// --seed N: N >= 0, or -1 for a random seed (llama.cpp's convention), printed so the run can be
// repeated. Anything else is refused rather than wrapped around to a huge unsigned seed.
CLI::Option* add_seed_option(CLI::App* app, uint64_t& seed, const std::string& what) {
    return app
        ->add_option_function<std::string>(
            "--seed",
            [&seed, what](const std::string& text) {
                if (text == "-1") {
                    std::random_device rd;
                    seed = ((uint64_t)rd() << 32 | rd()) & (uint64_t)INT64_MAX;
                    std::fprintf(stderr, "%s: --seed -1 drew seed %llu\n", what.c_str(), (unsigned long long)seed);
                    return;
                }
                uint64_t v = 0;
                const char* end = text.data() + text.size();
                auto [p, ec] = std::from_chars(text.data(), end, v);
                if (text.empty() || ec != std::errc() || p != end)
                    throw CLI::ValidationError("--seed", "'" + text + "' is not a seed: give an integer from 0 to " +
                                                             std::to_string(UINT64_MAX) + ", or -1 for a random one");
                seed = v;
            },
            what + " (-1: a random one, printed)")
        ->type_name("INT")
        ->default_str(std::to_string(seed));
}

}  // namespace

int main(int argc, char** argv) {
    // `steward serve` takes llama-server's two-letter flags (-np, -md), which CLI11 cannot name, and
    // refuses the llama-server / vLLM flags it has no equivalent for with the reason (refused_server_flag).
    std::vector<std::string> args(argv, argv + argc);
    if (args.size() > 1 && args[1] == "serve") {
        for (size_t i = 2; i < args.size(); i++) {
            if (args[i] == "--") break;
            if (args[i] == "-np") args[i] = "--parallel";
            else if (args[i] == "-md") args[i] = "--model-draft";
            else if (args[i] == "-ctk") args[i] = "--cache-type-k";
            else if (args[i] == "-ctv") args[i] = "--cache-type-v";
            else if (auto why = refused_server_flag(args[i])) return fail(*why);
        }
    }
    std::vector<char*> argv2;
    for (auto& a : args) argv2.push_back(a.data());
    argv = argv2.data();
    CLI::App app{"Steward: an LLM serving runtime that decides, per workload bucket, where to spend compute, KV memory and strong-model calls."};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("steward ") + STEWARD_VERSION, "Print the version and exit");

    // ---- steward model synth
    auto* model_cmd = app.add_subcommand("model", "Model tools");
    model_cmd->require_subcommand(1);
    auto* synth = model_cmd->add_subcommand("synth", "Write a synthetic GGUF model (deterministic random weights)");
    SynthSpec spec;
    std::string synth_out, dtype_s = "f32", draft_from;
    int keep_layers = 0;
    synth->add_option("-o,--out", synth_out, "Output GGUF path")->required();
    synth->add_option("--arch", spec.arch, "llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3; the mixtures of experts qwen3moe, mixtral or gpt-oss; the encoders bert or nomic-bert")->capture_default_str();
    synth->add_option("--dim", spec.n_embd, "Embedding size")->capture_default_str();
    synth->add_option("--layers", spec.n_layer, "Layers")->capture_default_str();
    synth->add_option("--heads", spec.n_head, "Attention heads")->capture_default_str();
    synth->add_option("--kv-heads", spec.n_head_kv, "KV heads (GQA when fewer than heads)")->capture_default_str();
    synth->add_option("--head-dim", spec.head_dim, "Head size (0: dim / heads; qwen3 sets it apart)")->capture_default_str();
    synth->add_option("--ffn", spec.n_ff, "Feed-forward size")->capture_default_str();
    synth->add_option("--vocab", spec.n_vocab, "Vocabulary size")->capture_default_str();
    synth->add_option("--ctx", spec.n_ctx, "Context length")->capture_default_str();
    synth->add_option("--dtype", dtype_s,
                      "Weight type: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, or llama-quantize's mixes q4_k_m, q5_k_m, mxfp4_moe")
        ->capture_default_str();
    add_seed_option(synth, spec.seed, "Weight seed");
    synth->add_flag("--tied", spec.tied_output, "Tie the output head to the embeddings");
    synth->add_option("--rope-scale", spec.rope_scaling_factor,
                      "Linear RoPE scaling factor (rope.scaling.factor; angles divided by it; 0: none)")
        ->capture_default_str();
    synth->add_option("--experts", spec.n_expert, "qwen3moe / mixtral / gpt-oss: experts per layer")->capture_default_str();
    synth->add_option("--experts-used", spec.n_expert_used, "qwen3moe / mixtral / gpt-oss: experts per token")->capture_default_str();
    synth->add_option("--expert-ffn", spec.n_ff_exp, "qwen3moe / mixtral / gpt-oss: an expert's FFN width (0: --ffn)")
        ->capture_default_str();
    synth->add_option("--sliding-window", spec.sliding_window,
                      "gemma2 / gemma3 / gpt-oss: attention.sliding_window (0: 4096 for gemma2, 512 for gemma3, 128 for "
                      "gpt-oss; -1: none, gemma3)")
        ->capture_default_str();
    synth->add_option("--yarn", spec.yarn_factor,
                      "YaRN RoPE scaling factor (rope.scaling.type yarn; negative: 32 for gpt-oss, none for the others; 0: none)")
        ->capture_default_str();
    synth->add_option("--yarn-orig-ctx", spec.yarn_orig_ctx, "YaRN's rope.scaling.original_context_length")
        ->capture_default_str();
    synth->add_option("--longrope-orig-ctx", spec.longrope_orig_ctx,
                      "phi3: LongRoPE factors (long and short sets, as Phi-3's 128k files) over this original context (0: none)")
        ->capture_default_str();
    synth->add_option("--attn-softcap", spec.attn_softcap, "gemma2: attn_logit_softcapping (negative: 50; 0: none)")
        ->capture_default_str();
    synth->add_option("--final-softcap", spec.final_softcap,
                      "gemma2 / gemma3: final_logit_softcapping (negative: 30 for gemma2, none for gemma3; 0: none)")
        ->capture_default_str();
    synth->add_option("--rope-freqs-ramp", spec.rope_freqs_ramp,
                      "Per-pair RoPE factors from 1 to this value (a rope_freqs.weight tensor, as Llama 3.1 files carry; 0: none)")
        ->capture_default_str();
    synth->add_option("--draft-from", draft_from, "Derive a draft from this target GGUF instead");
    synth->add_option("--keep-layers", keep_layers, "Layers the draft keeps (with --draft-from)");
    synth->add_option("--late-scale", spec.late_scale,
                      "Test fixture for speculation: scale the residual branches of layers >= --late-from "
                      "(smaller: a draft of the first layers agrees more; docs/models.md)")
        ->capture_default_str();
    synth->add_option("--late-from", spec.late_from, "First layer --late-scale applies to (-1: off)")
        ->capture_default_str();

    auto* info = model_cmd->add_subcommand("info", "What a GGUF file holds: shape, tensor types, tokenizer, template, KV and weight bytes per token");
    std::string info_path;
    info->add_option("file", info_path, "GGUF model")->required();

    // ---- steward generate
    auto* gen = app.add_subcommand("generate", "Generate text from a GGUF model");
    std::string model_path, prompt;
    int n_predict = 64, n_threads = 0, top_k = 0;
    float temp = 0.8f, top_p = 1.0f;
    uint64_t seed = 0;
    bool print_ids = false, kv_f16 = false;
    std::string kv_type_k, kv_type_v;
    gen->add_option("-m,--model", model_path, "GGUF model path")->required();
    gen->add_option("-p,--prompt", prompt, "Prompt text (empty: start from BOS alone)");
    gen->add_option("-n,--n-predict", n_predict, "Tokens to generate")->capture_default_str();
    gen->add_option("--temp", temp, "Temperature (0: greedy)")->capture_default_str();
    gen->add_option("--top-p", top_p, "Nucleus sampling mass")->capture_default_str();
    gen->add_option("--top-k", top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
    add_seed_option(gen, seed, "Sampling seed");
    gen->add_option("-t,--threads", n_threads, "CPU threads (0: all cores)")->capture_default_str();
    gen->add_flag("--kv-f16", kv_f16, "Store the KV cache in F16");
    gen->add_option("--cache-type-k", kv_type_k, "The KV cache's K type: f32, f16, bf16, q8_0, q4_0 (overrides --kv-f16)");
    gen->add_option("--cache-type-v", kv_type_v, "The KV cache's V type: f32, f16, bf16, q8_0, q4_0 (overrides --kv-f16)");
    gen->add_flag("--ids", print_ids, "Also print the generated token ids on one line");

    // ---- steward embed
    auto* emb = app.add_subcommand("embed", "Embed texts with a GGUF model (an encoder such as BERT, or a decoder): one vector per line");
    std::string emb_model, emb_pooling;
    std::vector<std::string> emb_texts;
    int emb_threads = 0;
    emb->add_option("-m,--model", emb_model, "GGUF model path")->required();
    emb->add_option("texts", emb_texts, "Texts to embed, one vector each")->required();
    emb->add_option("--pooling", emb_pooling, "mean, cls or last (default: the model's pooling_type)");
    emb->add_option("-t,--threads", emb_threads, "CPU threads (0: all cores)")->capture_default_str();

    // ---- steward run
    auto* run = app.add_subcommand("run", "The main job: replay a mixed workload through the runtime, print per-bucket figures");
    RunOptions ro;
    run->add_option("-c,--config", ro.config_path, "TOML config")->capture_default_str();
    run->add_option("-w,--workload", ro.workload_path, "Workload JSONL (default: the standard mixed workload)");
    run->add_option("--requests", ro.n_requests, "Requests of the generated workload")->capture_default_str();
    run->add_option("--rate", ro.rate, "Arrival rate of the generated workload (req/s)")->capture_default_str();
    run->add_option("--scale", ro.scale, "Multiply prompt and output lengths")->capture_default_str();
    add_seed_option(run, ro.seed, "Workload seed");
    run->add_flag("--burst", ro.burst, "Bursty arrivals");
    run->add_option("--save-workload", ro.save_workload, "Write the workload used to this JSONL file");
    run->add_option("-o,--out", ro.out_path, "Report JSON path (the HTML report is written next to it, .json -> .html)")->capture_default_str();
    run->add_flag("-v,--verbose", ro.verbose, "Print every failed request");
    run->add_option("--compare", ro.compare,
                    "Ablations in one run, comma-separated: baseline, no_prefix_cache, no_speculation, global_speculation, "
                    "speculation=PLUGIN, spec_source=SRC, no_routing, eviction=PLUGIN, kv_tiers=off, kv_type=TYPE, no_reuse; per bucket side by side with ratios to the baseline");
    run->add_flag("--wide", ro.wide, "The report table with every column (the default keeps lines within 120 characters)");
    run->add_flag("--no-reuse", ro.no_reuse,
                  "Reuse off in the runner: documents inlined where each request lists them (documents_at), no agent tool "
                  "call resolved from cached results (docs/reuse.md)");
    run->add_flag("--agent-tools", ro.agent_tools,
                  "Agent turns of the generated workload carry repeated idempotent tool calls (get_weather, read_file, search)");
    run->add_option("--agent-repeat", ro.agent_repeat,
                    "Share of the generated workload's agent sessions that repeat an earlier session of their tenant "
                    "(the same task, half with one word edited, then the same tool results; 0: none)")
        ->capture_default_str();
    run->add_option("--tenants", ro.n_tenants, "Tenants of the generated workload (1-4)")->capture_default_str();
    run->add_option("--mix", ro.mix, "Bucket weights of the generated workload, e.g. short_qa=2,agent=0 (rag=1 adds the rag bucket)");
    run->add_flag("--greedy", ro.greedy, "Every request at temperature 0 (comparing outputs)");
    run->add_flag("--sequential", ro.sequential, "One request at a time in file order, arrival times ignored");
    run->add_option("--outputs", ro.outputs_path, "Write every request's output and token counts to this JSONL file");
    run->add_option("--agent-turns", ro.agent_turns, "Turns per agent session of the generated workload (0: 3 or 4)")->capture_default_str();
    run->add_option("--tool-pause-ms", ro.tool_pause_ms, "Agent tool pauses of the generated workload: each uniform in [0.5, 1.5] x this (0: 50-300 ms)")
        ->capture_default_str();
    run->add_option("--volatile-share", ro.volatile_share,
                    "Share of short_qa, long_output and high_temp prompts with a volatile line (request id, timestamp)")
        ->capture_default_str();
    run->add_option("--volatile-at", ro.volatile_at, "Where the volatile line goes: early (after the public system prompt) or late (at the end)")
        ->capture_default_str();

    // ---- steward bench gen
    auto* bench_cmd = app.add_subcommand("bench", "Workload tools");
    bench_cmd->require_subcommand(1);
    auto* bgen = bench_cmd->add_subcommand("gen", "Write a generated workload (the standard mixed one, with its knobs) as JSONL without running it");
    RunOptions bo;
    bgen->add_option("-o,--out", bo.save_workload, "Workload JSONL to write")->required();
    bgen->add_option("--requests", bo.n_requests, "Requests (agent turns count one each)")->capture_default_str();
    bgen->add_option("--rate", bo.rate, "Arrival rate (req/s)")->capture_default_str();
    bgen->add_option("--scale", bo.scale, "Multiply prompt and output lengths")->capture_default_str();
    add_seed_option(bgen, bo.seed, "Workload seed");
    bgen->add_flag("--burst", bo.burst, "Bursty arrivals");
    bgen->add_option("--tenants", bo.n_tenants, "Tenants (1-4)")->capture_default_str();
    bgen->add_option("--mix", bo.mix, "Bucket weights, e.g. short_qa=2,agent=0,rag=1 (others keep the standard mix's; rag's is 0)");
    auto* brep = bench_cmd->add_subcommand(
        "replay", "Play a workload file against the embedded runtime (default) or an OpenAI-compatible server (--url), "
                  "honouring arrival times and agent turns; per-bucket table, per-request records");
    auto* bcmp = bench_cmd->add_subcommand("compare", "Two replay records files (bench replay --url -o) side by side per bucket, with ratios");
    std::string cmp_a, cmp_b;
    bcmp->add_option("A", cmp_a, "Records JSON of run A")->required();
    bcmp->add_option("B", cmp_b, "Records JSON of run B")->required();
    RunOptions rpo;
    std::string rep_url, rep_out, rep_name = "server", rep_model = "steward";
    bool rep_steward_fields = false, rep_session_field = false;
    brep->add_option("-w,--workload", rpo.workload_path, "Workload JSONL (steward bench gen writes one)")->required();
    brep->add_option("--url", rep_url, "http://HOST:PORT of an OpenAI-compatible server (steward serve, llama-server); "
                                       "without it, the embedded runtime of -c");
    brep->add_option("-c,--config", rpo.config_path, "TOML config of the embedded runtime")->capture_default_str();
    brep->add_option("-o,--out", rep_out, "Embedded: the report JSON (the HTML next to it; default out/report.json); "
                                          "--url: every request's record and output as JSON");
    brep->add_option("--outputs", rpo.outputs_path, "Embedded: every request's output, figures and route as JSONL");
    brep->add_flag("--greedy", rpo.greedy, "Every request at temperature 0");
    brep->add_flag("--sequential", rpo.sequential, "One request at a time in file order, arrival times ignored");
    brep->add_flag("--ignore-eos", rpo.ignore_eos, "Every request generates its max_tokens (comparing servers)");
    brep->add_flag("--no-reuse", rpo.no_reuse, "Embedded: reuse off in the runner (documents as listed, no tool call resolved)");
    brep->add_flag("--steward-fields", rep_steward_fields,
                   "--url: the bucket hint as the model and JSON mode for \"json\" requests (a Steward server)");
    brep->add_flag("--session-field", rep_session_field, "--url: send agent turns' session (Steward's extension)");
    brep->add_option("--name", rep_name, "--url: the run's name in the table and JSON")->capture_default_str();
    brep->add_option("--model", rep_model, "--url: the model field sent (unless --steward-fields names a bucket)")->capture_default_str();
    bgen->add_option("--agent-turns", bo.agent_turns, "Turns per agent session (0: 3 or 4)")->capture_default_str();
    bgen->add_option("--tool-pause-ms", bo.tool_pause_ms, "Agent tool pauses: each uniform in [0.5, 1.5] x this (0: 50-300 ms)")
        ->capture_default_str();
    bgen->add_option("--volatile-share", bo.volatile_share, "Share of short_qa, long_output and high_temp prompts with a volatile line")
        ->capture_default_str();
    bgen->add_option("--volatile-at", bo.volatile_at, "early (after the public system prompt) or late (at the end)")->capture_default_str();
    bgen->add_flag("--agent-tools", bo.agent_tools, "Agent turns carry repeated idempotent tool calls (get_weather, read_file, search)");
    bgen->add_option("--agent-repeat", bo.agent_repeat,
                     "Share of agent sessions that repeat an earlier session of their tenant (the same task, half with one "
                     "word edited, then the same tool results; 0: none)")
        ->capture_default_str();

    // ---- steward serve
    auto* serve = app.add_subcommand("serve", "The OpenAI-compatible HTTP server (docs/http-api.md)");
    ServeOptions so;
    serve->add_option("--config", so.config_path, "TOML config (default: configs/default.toml when there is no -m)");
    serve->add_option("--host", so.host, "Listen address (default: [server] host; with -m 127.0.0.1)");
    serve->add_option("--port", so.port, "Listen port, 0: ephemeral (default: [server] port; with -m 8080)");
    // One model, with llama-server's flags (-np and -md are read as --parallel and --model-draft).
    serve->add_option("-m,--model", so.model_path, "GGUF model to serve as one pool (llama-server's -m)");
    serve->add_option("model", so.model_path, "The model as vLLM's `serve MODEL` (same as -m)");
    serve->add_option("-c,--ctx-size,--max-model-len", so.ctx, "With -m: context per request in tokens (0: the model's trained context)");
    serve->add_option("--parallel,--max-num-seqs", so.parallel, "With -m (-np): sequences decoded together (default 4)");
    serve->add_option("-t,--threads", so.threads, "With -m: CPU threads (default: all cores)");
    serve->add_option("--chat-template-file", so.chat_template_file, "With -m: a Jinja chat template replacing the GGUF's");
    serve->add_option("--model-draft", so.draft_path, "With -m (-md): a draft model for speculative decoding (same vocabulary)");
    serve->add_option("--draft-max", so.draft_max, "With -md: the longest draft per step (default 16)");
    serve->add_option("--api-key", so.api_keys, "With -m: a key clients must send (Authorization: Bearer KEY); repeatable");
    serve->add_option("--alias,--served-model-name", so.alias, "With -m: the model's name in the API (default: the file's stem)");
    serve->add_option("-n,--n-predict", so.n_predict, "With -m: max_tokens when a request gives none (default: the rest of the context)");
    serve->add_option("--cache-type-k", so.cache_type_k, "With -m (-ctk): the KV cache's K type, f32, f16, bf16, q8_0 or q4_0 (default f32)");
    serve->add_option("--cache-type-v", so.cache_type_v, "With -m (-ctv): the KV cache's V type, same names (default f32)");
    serve->add_option("--cache-ram", so.cache_ram_mib, "With -m: a host-memory KV tier of this many MiB (llama-server's flag; docs/kv-tiers.md)");
    serve->add_option("--kv-offloading-size", so.kv_offload_gib, "With -m: a host-memory KV tier of this many GiB (vLLM's flag)");
    serve->add_option("--kv-disk-dir", so.kv_disk_dir, "With -m: a disk KV tier in this private directory (created 0700), kept across restarts");
    serve->add_option("--kv-disk-gib", so.kv_disk_gib, "With --kv-disk-dir: the disk tier's budget in GiB (default 10)");
    serve->add_option("--pooling", so.pooling, "With -m: /v1/embeddings' pooling, mean, cls or last (default: the GGUF's, else last)");
    serve->add_flag("--print-config", so.print_config, "With -m: print the equivalent TOML config and exit");
    serve->add_flag("--jinja")->description("Accepted for llama-server's command lines: chat templates are always Jinja here");
    serve->add_flag("--metrics,--embeddings,--embedding,--cont-batching")->description("Accepted for llama-server's command lines: always on here");

    // ---- steward worker
    auto* worker = app.add_subcommand("worker", "Host a config's pools for fronts on other processes or machines (docs/cluster.md)");
    WorkerOptions wo;
    worker->add_option("-c,--config", wo.config_path, "TOML config of the worker's pools")->capture_default_str();
    worker->add_option("--listen", wo.listen, "HOST:PORT fronts connect to (port 0: ephemeral)")->capture_default_str();
    worker->add_option("--wire-version", wo.wire_version, "")->group("");  // tests: another protocol version

    // ---- steward config check
    auto* config_cmd = app.add_subcommand("config", "Config tools");
    config_cmd->require_subcommand(1);
    auto* check = config_cmd->add_subcommand("check", "Validate a TOML config without serving");
    std::string check_path;
    check->add_option("file", check_path, "TOML config")->required();

    // ---- steward template render
    auto* template_cmd = app.add_subcommand("template", "Chat template tools");
    template_cmd->require_subcommand(1);
    auto* render = template_cmd->add_subcommand("render", "Print a chat template's rendering of messages");
    TemplateRenderOptions tro;
    render->add_option("-m,--model", tro.model_path, "GGUF whose tokenizer.chat_template to use");
    render->add_option("--template", tro.template_path, "Jinja template file (instead of -m)");
    render->add_option("--messages", tro.messages_path, "JSON file: an array of messages")->required();
    render->add_option("--tools", tro.tools_path, "JSON file: an array of tools");
    render->add_flag("--add-generation-prompt", tro.add_generation_prompt, "End with the assistant's turn opener");
    render->add_option("--kwargs", tro.kwargs, "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
    render->add_option("--now", tro.now_unix, "Unix time strftime_now() renders (UTC), for reproducible output");

    CLI11_PARSE(app, argc, argv);

    if (render->parsed()) return cmd_template_render(tro);

    if (run->parsed()) return cmd_run(ro);
    if (bgen->parsed()) return cmd_bench_gen(bo);
    if (bcmp->parsed()) return http_replay_compare(cmp_a, cmp_b);
    if (brep->parsed()) {
        if (rep_url.empty()) {
            if (!rep_out.empty()) rpo.out_path = rep_out;
            return cmd_run(rpo);
        }
        ReplayOptions h;
        if (auto ok = parse_replay_url(rep_url, h); !ok) return cli_fail(ok.error().message);
        h.workload = rpo.workload_path;
        h.out = rep_out;
        h.name = rep_name;
        h.model = rep_model;
        h.greedy = rpo.greedy;
        h.sequential = rpo.sequential;
        h.ignore_eos = rpo.ignore_eos;
        h.steward_fields = rep_steward_fields;
        h.session_field = rep_session_field;
        if (rpo.no_reuse) return cli_fail("--no-reuse is for the embedded runtime; with --url the server decides what it reuses");
        h.progress = true;
        if (!rpo.outputs_path.empty()) return cli_fail("--outputs is for the embedded runtime; with --url, -o writes every request's record and output");
        return http_replay(h);
    }
    if (serve->parsed()) return cmd_serve(so);
    if (worker->parsed()) return cmd_worker(wo);
    if (check->parsed()) {
        auto r = check_config_file(check_path);
        if (!r) return fail(r.error().message);
        std::printf("%s\n", r->c_str());
        return 0;
    }

    if (info->parsed()) return cmd_model_info(info_path);
    if (synth->parsed()) {
        if (!draft_from.empty()) {
            if (keep_layers <= 0) return fail("--draft-from needs --keep-layers N (N >= 1)");
            auto r = synth_draft(draft_from, keep_layers, synth_out);
            if (!r) return fail(r.error().message);
            std::fprintf(stderr, "wrote draft %s (%d layers of %s)\n", synth_out.c_str(), keep_layers, draft_from.c_str());
            return 0;
        }
        auto fmt = parse_weight_format(dtype_s);
        if (!fmt) return fail(fmt.error().message);
        spec.dtype = fmt->type;
        spec.mix = fmt->mix;
        auto r = synth_write(spec, synth_out);
        if (!r) return fail(r.error().message);
        std::fprintf(stderr, "wrote %s (%s, dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, ctx %d, %s)\n",
                     synth_out.c_str(), spec.arch.c_str(), spec.n_embd, spec.n_layer, spec.n_head, spec.n_head_kv,
                     spec.n_ff, spec.n_vocab, spec.n_ctx, dtype_s.c_str());
        return 0;
    }

    if (emb->parsed()) {
        if (auto ok = check_threads(emb_threads, "-t/--threads"); !ok) return fail(ok.error().message);
        auto m = Model::load(emb_model);
        if (!m) return fail(m.error().message);
        const Model& model = **m;
        auto pooling = embedding_pooling(model.params(), emb_pooling);
        if (!pooling) return fail(pooling.error().message);
        const Tokenizer& tok = model.tokenizer();
        std::vector<std::vector<int32_t>> ids;
        for (const std::string& t : emb_texts) ids.push_back(tok.encode(t, tok.add_bos_default(), true));
        CpuEmbedder e(model, emb_threads, 2048);
        auto v = e.embed(ids, *pooling);
        if (!v) return fail(v.error().message);
        // Unit-length vectors (llama-embedding --embd-normalize 2), as JSON arrays of 9 significant digits.
        for (const auto& vec : *v) {
            std::string line = "[";
            char buf[32];
            for (size_t i = 0; i < vec.size(); i++) {
                std::snprintf(buf, sizeof buf, i ? ",%.9g" : "%.9g", vec[i]);
                line += buf;
            }
            std::puts((line + "]").c_str());
        }
        std::fprintf(stderr, "%zu inputs, %s pooling, %d dims; kernels %s on %s\n", ids.size(), pooling_name(*pooling),
                     model.params().n_embd, cpu_level_name(cpu_level()), cpu_features().model_name.c_str());
        return 0;
    }

    if (gen->parsed()) {
        // Checked before the model is read: a bad value is refused the same way the C API refuses it.
        if (auto ok = check_threads(n_threads, "-t/--threads"); !ok) return fail(ok.error().message);
        start_cpu_plan();  // the CPU plan cached for this CPU model (measured once, cpu/plan.h)
        SamplingParams sp;
        sp.temperature = temp;
        sp.top_p = top_p;
        sp.top_k = top_k;
        sp.seed = seed;
        if (auto ok = check_sampling(sp); !ok) return fail(ok.error().message);
        if (n_predict < 0) return fail("-n/--n-predict is " + std::to_string(n_predict) + "; it must be >= 0");
        auto m = Model::load(model_path);
        if (!m) return fail(m.error().message);
        const Model& model = **m;
        if (model.params().is_encoder())
            return fail("'" + model_path + "' is an encoder (" + model.params().arch +
                        "): it embeds text and does not generate; use `steward embed -m " + model_path +
                        " TEXT` or a pool's /v1/embeddings");
        const Tokenizer& tok = model.tokenizer();
        std::vector<int32_t> ids = tok.encode(prompt, tok.add_bos_default() || prompt.empty());
        KvDtype tk = kv_f16 ? KvDtype::F16 : KvDtype::F32, tv = tk;
        for (auto [flag, name, type] : {std::tuple{"--cache-type-k", &kv_type_k, &tk}, std::tuple{"--cache-type-v", &kv_type_v, &tv}}) {
            if (name->empty()) continue;
            const auto t = parse_kv_dtype(*name);
            if (!t || *t == KvDtype::FP8_E4M3)
                return fail(std::string(flag) + " " + *name + " is not a CPU KV cache type; use f32, f16, bf16, q8_0 or q4_0");
            *type = *t;
        }
        Generator g(model, n_threads, tk, 16, tv);
        StreamDecoder dec(tok);
        std::vector<int32_t> out_ids;
        std::fputs(prompt.c_str(), stdout);
        auto st = g.generate(ids, n_predict, sp, [&](int32_t id, float) {
            out_ids.push_back(id);
            const std::string piece = dec.push(id);
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            return true;
        });
        const std::string rest = dec.flush();
        std::fwrite(rest.data(), 1, rest.size(), stdout);
        std::fputc('\n', stdout);
        if (!st) return fail(st.error().message);
        if (print_ids) {
            for (size_t i = 0; i < out_ids.size(); i++) std::printf(i ? " %d" : "%d", out_ids[i]);
            std::printf("\n");
        }
        std::fprintf(stderr, "prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s (%.1f tok/s); "
                     "kernels %s on %s\n",
                     st->n_prompt, st->prefill_s, st->n_prompt / std::max(st->prefill_s, 1e-9), st->n_generated,
                     st->decode_s, st->n_generated > 1 ? (st->n_generated - 1) / std::max(st->decode_s, 1e-9) : 0.0,
                     cpu_level_name(cpu_level()), cpu_features().model_name.c_str());
        return 0;
    }
    return 0;
}
