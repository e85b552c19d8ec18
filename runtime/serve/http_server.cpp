// The HTTP server (http_server.h) on Boost.Beast: one strand per connection; every runtime callback
// posts to that strand, so a connection's state is touched by one thread at a time and the
// runtime's threads never wait on a socket. Bounded everywhere: connections, header and body
// sizes, read / idle / write timeouts, and the streamed output a slow reader leaves unread.
#include "serve/http_server.h"

#include <random>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "serve/anthropic_api.h"
#include "serve/embeddings_api.h"
#include "serve/openai_api.h"
#include "serve/responses_api.h"
#include "serve/reuse_api.h"
#include "api/reuse_stores.h"
#include "util/strings.h"

namespace steward::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;

namespace {

std::chrono::milliseconds ms(double v) { return std::chrono::milliseconds((int64_t)v); }

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }


// Rounds of cached tool results one request may resolve before the answer goes to the client.
constexpr int k_max_tool_rounds = 4;

}  // namespace

class Session;

struct HttpServer::Impl {
    std::atomic<Runtime*> runtime{nullptr};  // null while the runtime loads: everything answers 503
    ServerConfig cfg;
    std::atomic<bool> draining{false}, stopped{false};
    std::atomic<int> n_connections{0};
    uint16_t bound_port = 0;
    net::io_context ioc;  // before the sockets: destroyed after them
    tcp::acceptor acceptor;
    net::thread_pool blocking{1};  // Runtime::reload waits on the runtime: never on an I/O thread
    // /v1/responses' stored responses (previous_response_id, GET /v1/responses/{id}), per tenant.
    std::shared_ptr<ResponseStore> responses =
        std::make_shared<ResponseStore>(k_max_stored_responses, k_max_stored_response_bytes, k_stored_response_ttl);
    std::vector<std::thread> threads;

    // Runtime requests whose last callback has not returned yet: stop() cancels them and waits, so
    // that no callback posts into a destroyed io_context.
    std::mutex inflight_mu;
    std::condition_variable inflight_cv;
    std::unordered_set<RequestHandle> inflight;
    std::unordered_set<RequestHandle> finished_before_listed;  // on_finish ran before submit returned
    size_t n_inflight_callbacks = 0;

    // The live connections, owned here (runtime callbacks hold only weak pointers, so a callback
    // object the runtime keeps after its last call never owns a socket): a connection leaves when it
    // is closed and none of its runtime requests is still to finish.
    std::mutex sessions_mu;
    std::list<std::shared_ptr<Session>> sessions;

    Impl(Runtime* r, const ServerConfig& c) : runtime(r), cfg(c), acceptor(ioc) {}
    void accept();
};

// One OpenAI generation request of a connection: its n runtime requests and what came back.
struct Exchange {
    OpenAiRequest req;
    // A chat is routed first and rendered after, with the template of the pool that runs it: the
    // renderer keeps each pool's rendering (and refusal) for the answer. A completion's prompt is
    // the same text everywhere: `pool` is the one whose tokenizer checked its length.
    std::shared_ptr<ChatRenderer> renderer;
    // /v1/responses and /v1/messages: the same chat, answered in their own shapes (n is 1).
    std::shared_ptr<ChatDialect> dialect;
    std::optional<PoolInfo> pool;
    std::vector<RequestHandle> handles;
    std::vector<GenerationResult> results;
    std::vector<bool> done;
    // Streaming: per choice, the pool its answer comes from (RequestCallbacks::on_pool) and the
    // output parser, made at its first piece in that pool's tool-call format.
    std::vector<std::string> answer_pools;
    std::vector<std::optional<StreamOutput>> outputs;
    // Streaming with logprobs: per choice, the tokens heard of (on_logprobs) and not yet in a chunk,
    // and the bytes of text streamed so far (a completion's text_offset).
    struct PendingLogprobs {
        std::vector<int32_t> ids;
        std::vector<float> logprobs;
        std::vector<std::vector<TokenLogprob>> top;
    };
    std::vector<PendingLogprobs> pending_lp;
    std::vector<size_t> streamed_bytes;
    int n_total = 1;       // choices: the batch's prompts x n
    uint64_t id_seed = 0;  // tool-call ids
    int n_done = 0;
    // n > 1: choice 0 runs first; the others are submitted at its first token, when its prompt's full
    // blocks are in the prefix cache, so they attach to those blocks instead of computing them again.
    ModelTarget target;
    int64_t created = 0;
    bool headers_sent = false;  // streaming: the 200 and SSE headers are out
    bool closed = false;        // answered, or the connection went away
    // Reuse (docs/reuse.md): who asks (tenant, salt, session, labels), the tool calls answered from
    // the cache in earlier rounds of this request, and the output tokens of those rounds.
    reuse::ToolCaller caller;
    std::vector<CachedCall> resolved;
    int tool_rounds = 0;
    int prior_completion_tokens = 0;
    ReuseCounts reuse;
};

class Session : public std::enable_shared_from_this<Session> {
public:
    Session(HttpServer::Impl& srv, tcp::socket socket) : srv_(srv), stream_(std::move(socket)) {}
    ~Session() { srv_.n_connections--; }
    std::list<std::shared_ptr<Session>>::iterator self_in_server;
    bool registered = false;

    void start() { net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->wait_request(); }); }
    void close_from_server() {
        net::post(stream_.get_executor(), [self = shared_from_this()] { self->abort(); });
    }

private:
    HttpServer::Impl& srv_;
    beast::tcp_stream stream_;
    Runtime& rt() { return *srv_.runtime.load(); }  // set: handle() answers 503 before any handler while it is not
    beast::flat_buffer buf_;
    std::optional<http::request_parser<http::string_body>> parser_;
    http::request<http::string_body> req_;
    std::shared_ptr<Exchange> ex_;
    bool streaming_ = false;
    bool watching_ = false;     // a read is pending while a request runs (disconnects)
    bool peer_eof_ = false;     // the client half-closed (or closed): no further request
    bool closing_ = false;
    // Streaming output: bytes waiting (pending_) and being written (out_).
    std::string pending_, out_;
    bool writing_ = false;
    bool finish_after_write_ = false;  // the stream's last bytes are queued: next request after them

    // ---- reading
    void wait_request() {
        if (closing_) return;
        if (buf_.size() > 0) return read_request();
        // An idle keep-alive connection waits idle_timeout for the first byte of its next request.
        stream_.expires_after(ms(srv_.cfg.idle_timeout_ms));
        stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
            if (ec) return self->abort();
            self->buf_.commit(n);
            self->read_request();
        });
    }

    void read_request() {
        parser_.emplace();
        parser_->header_limit((uint32_t)srv_.cfg.max_header_bytes);
        parser_->body_limit((uint64_t)srv_.cfg.max_body_bytes);
        // The whole request (headers and body) within read_timeout: a client dripping bytes
        // (slowloris) is dropped when it passes.
        stream_.expires_after(ms(srv_.cfg.read_timeout_ms));
        http::async_read_header(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->on_read(ec);
            // A transfer coding other than chunked alone leaves the body's length unknown: reading on
            // would take the body for a next request (request smuggling). RFC 9112 6.1: answer 501
            // and close.
            if (auto te = self->unsupported_transfer_coding()) return self->send_error_and_close(*te);
            if (self->parser_->is_done()) return self->on_read(ec);
            // curl (and others) send "Expect: 100-continue" before a large body and wait for it.
            if (beast::iequals(self->parser_->get()[http::field::expect], "100-continue")) {
                static const std::string k_continue = "HTTP/1.1 100 Continue\r\n\r\n";
                return net::async_write(self->stream_, net::buffer(k_continue), [self](beast::error_code ec, size_t) {
                    if (ec) return self->abort();
                    self->read_body();
                });
            }
            self->read_body();
        });
    }
    std::optional<ApiError> unsupported_transfer_coding() const {
        std::vector<std::string> values;
        for (const auto& f : parser_->get())
            if (f.name() == http::field::transfer_encoding) values.emplace_back(f.value());
        auto refusal = transfer_coding_refusal(values);
        if (!refusal) return std::nullopt;
        return ApiError{501, *refusal, "invalid_request_error", "", "unsupported_transfer_encoding"};
    }
    void read_body() {
        http::async_read(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::header_limit)
            return send_error_and_close({431, "the request's headers are over " + std::to_string(srv_.cfg.max_header_bytes) +
                                                  " bytes ([server] max_header_bytes)", "invalid_request_error", "", "headers_too_large"});
        if (ec == http::error::body_limit)
            return send_error_and_close({413, "the body is over " + std::to_string(srv_.cfg.max_body_bytes) +
                                                  " bytes ([server] max_body_bytes)", "invalid_request_error", "", "body_too_large"});
        if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == net::error::eof ||
            ec == net::error::operation_aborted || ec == net::error::connection_reset)
            return abort();
        if (ec) return send_error_and_close({400, "malformed HTTP request: " + ec.message(), "invalid_request_error", "", "bad_request"});
        req_ = parser_->release();
        stream_.expires_never();
        handle();
    }

    // ---- answering
    void send(http::status status, std::string body, const char* content_type, std::vector<std::pair<std::string, std::string>> headers = {},
              bool close = false) {
        auto res = std::make_shared<http::response<http::string_body>>(status, req_.version());
        res->set(http::field::server, "steward");
        res->set(http::field::content_type, content_type);
        for (auto& [k, v] : headers) res->set(k, v);
        // After the client's half-close, requests it pipelined before it are still answered.
        res->keep_alive(!close && req_.keep_alive() && (!peer_eof_ || buf_.size() > 0));
        res->body() = std::move(body);
        res->prepare_payload();
        stop_watching_then([self = shared_from_this(), res] {
            self->stream_.expires_after(ms(self->srv_.cfg.write_timeout_ms));
            http::async_write(self->stream_, *res, [self, res](beast::error_code ec, size_t) {
                if (ec || !res->keep_alive()) return self->shutdown();
                self->stream_.expires_never();
                self->wait_request();
            });
        });
    }
    void send_json(http::status status, const json& j, std::vector<std::pair<std::string, std::string>> headers = {}) {
        send(status, dump(j), "application/json", std::move(headers));
    }
    void send_error(const ApiError& e, std::vector<std::pair<std::string, std::string>> headers = {}) {
        if (e.status == 429) headers.emplace_back("Retry-After", "1");
        const std::string body = anthropic_ ? anthropic_error_body(e) : error_body(e);
        send((http::status)e.status, body, "application/json", std::move(headers));
    }
    bool anthropic_ = false;  // this request is Anthropic's (/v1/messages): its errors take that shape
    void send_error_and_close(const ApiError& e) {
        req_ = {};
        req_.version(11);
        anthropic_ = false;  // the request was never read: OpenAI's shape
        send((http::status)e.status, error_body(e), "application/json", {}, true);
    }

    // The answer is out: half-close, then read and drop what the client still sends (up to 1 MiB,
    // for 2 s) before closing. Closing with unread bytes would reset the connection, and the client
    // could lose the answer (a 413 or 431 sent before the rest of its request was read).
    void shutdown() {
        if (closing_) return;
        closing_ = true;
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
        linger(0);
    }
    void linger(size_t n_read) {
        if (n_read > (1u << 20)) return close_now();
        stream_.expires_after(std::chrono::seconds(2));
        stream_.async_read_some(net::buffer(linger_buf_), [self = shared_from_this(), n_read](beast::error_code ec, size_t n) {
            if (ec) return self->close_now();
            self->linger(n_read + n);
        });
    }
    void close_now() {
        stream_.close();
        maybe_release();
    }
    char linger_buf_[4096];
    void maybe_release() {
        if (!closing_ || (ex_ && ex_->n_done < (int)ex_->handles.size())) return;
        std::lock_guard<std::mutex> lk(srv_.sessions_mu);
        if (registered) srv_.sessions.erase(self_in_server);
        registered = false;
    }
    // The connection ends now (error, timeout, the client went away, the server stops): its
    // requests are cancelled, so that their KV blocks are freed at once.
    void abort() {
        cancel_exchange();
        if (closing_) return;
        closing_ = true;
        stream_.close();
        maybe_release();
    }
    void cancel_exchange() {
        if (!ex_ || ex_->closed) return;
        ex_->closed = true;
        for (size_t i = 0; i < ex_->handles.size(); i++)
            if (!ex_->done[i]) rt().cancel(ex_->handles[i]);
    }

    // A read stays pending while a request runs: a reset (or, when streaming, an EOF) of the client
    // cancels it. A non-streaming client may half-close after its request and still get the answer.
    void watch() {
        if (watching_ || peer_eof_ || closing_) return;
        if (buf_.size() > (size_t)srv_.cfg.max_header_bytes) return;  // a pipelined request waits for its turn
        watching_ = true;
        stream_.async_read_some(buf_.prepare(1024), WatchHandler{shared_from_this()});
    }
    void on_watch(beast::error_code ec, size_t n) {
        watching_ = false;
        if (auto next = std::exchange(after_watch_, nullptr)) return next(ec, n);
        if (!ec) {
            buf_.commit(n);
            return watch();
        }
        if (ec == net::error::operation_aborted) return;
        if (ec == net::error::eof && !streaming_) {
            peer_eof_ = true;
            return;
        }
        abort();
    }
    // The pending watch read's handler owns the session, and so does the continuation a send leaves
    // in after_watch_. A handler destroyed without running (stop() halts the io_context first)
    // drops that continuation, or the session and its socket would own each other and leak.
    struct WatchHandler {
        std::shared_ptr<Session> self;
        WatchHandler(std::shared_ptr<Session> s) : self(std::move(s)) {}
        WatchHandler(WatchHandler&&) = default;
        WatchHandler& operator=(WatchHandler&&) = default;
        ~WatchHandler() {
            if (self) self->after_watch_ = nullptr;
        }
        void operator()(beast::error_code ec, size_t n) {
            const auto s = std::move(self);  // ran: the destructor leaves after_watch_ alone
            s->on_watch(ec, n);
        }
    };
    std::function<void(beast::error_code, size_t)> after_watch_;
    // Runs `next` once no watch read is pending (cancelling it: no write is in flight then).
    void stop_watching_then(std::function<void()> next) {
        if (!watching_) return next();
        after_watch_ = [self = shared_from_this(), next = std::move(next)](beast::error_code ec, size_t n) {
            if (!ec) self->buf_.commit(n);
            else if (ec == net::error::eof) self->peer_eof_ = true;
            next();
        };
        beast::error_code ignored;
        stream_.socket().cancel(ignored);
    }

    // ---- routing
    std::string tenant_;
    // The key's tenant has `admin = true`, or no key is configured (an open, single-user server).
    bool admin_ = false;
    bool authorize() {
        auto cfg = rt().config();
        bool any_keys = false;
        for (const auto& t : cfg->tenants) any_keys |= !t.api_keys.empty();
        tenant_ = "default";
        admin_ = !any_keys;
        if (!any_keys) return true;
        const auto auth_field = req_[http::field::authorization];
        const std::string_view auth(auth_field.data(), auth_field.size());
        const std::string_view bearer = "Bearer ";
        // Anthropic's clients send the key as x-api-key: the same keys, the same tenants.
        const auto x_api_key = req_["x-api-key"];
        std::string_view key(x_api_key.data(), x_api_key.size());
        if (auth.substr(0, bearer.size()) == bearer) key = auth.substr(bearer.size());
        if (!key.empty())
            for (const auto& t : cfg->tenants)
                for (const auto& k : t.api_keys)
                    if (k == key) return tenant_ = t.name, admin_ = t.admin, true;
        send_error({401,
                    auth.empty() && key.empty()
                        ? "no API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')"
                        : "the API key is not valid",
                    "authentication_error", "", "invalid_api_key"},
                   {{"WWW-Authenticate", "Bearer"}});
        return false;
    }

    void handle() {
        const std::string target(req_.target());
        const std::string path = target.substr(0, target.find('?'));
        const http::verb m = req_.method();
        anthropic_ = path == "/v1/messages";
        struct Route {
            const char* path;
            http::verb method;
            void (Session::*fn)();
            bool prefix;
        };
        static const Route routes[] = {
            {"/v1/chat/completions", http::verb::post, &Session::on_chat, false},
            {"/v1/completions", http::verb::post, &Session::on_completion, false},
            {"/v1/embeddings", http::verb::post, &Session::on_embeddings, false},
            {"/v1/models", http::verb::get, &Session::on_models, false},
            {"/v1/models/", http::verb::get, &Session::on_model, true},
            {"/v1/responses", http::verb::post, &Session::on_responses, false},
            {"/v1/responses/", http::verb::get, &Session::on_response_get, true},
            {"/v1/messages", http::verb::post, &Session::on_messages, false},
            {"/health", http::verb::get, &Session::on_health, false},
            {"/tokenize", http::verb::post, &Session::on_tokenize, false},
            {"/detokenize", http::verb::post, &Session::on_detokenize, false},
            {"/metrics", http::verb::get, &Session::on_metrics, false},
            {"/v1/documents", http::verb::get, &Session::on_documents_list, false},
            {"/v1/documents/", http::verb::unknown, &Session::on_document, true},
            {"/v1/tool_results", http::verb::put, &Session::on_tool_result_put, false},
            {"/admin/reload", http::verb::post, &Session::on_reload, false},
            {"/admin/requests/", http::verb::get, &Session::on_trace, true},
        };
        for (const Route& r : routes) {
            const bool match = r.prefix ? path.rfind(r.path, 0) == 0 && path.size() > strlen(r.path) : path == r.path;
            if (!match) continue;
            if (r.method != http::verb::unknown && m != r.method)
                return send_error({405, std::string(req_.method_string()) + " is not allowed on " + path + "; use " +
                                            std::string(http::to_string(r.method)),
                                   "invalid_request_error", "", "method_not_allowed"},
                                  {{"Allow", std::string(http::to_string(r.method))}});
            if (!srv_.runtime.load()) {
                if (r.fn == &Session::on_health) return send_json(http::status::service_unavailable, {{"status", "loading"}});
                return send_error({503, "the runtime is still loading its models; retry shortly", "server_error", "", "loading"},
                                  {{"Retry-After", "1"}});
            }
            // /health answers load balancers without a key.
            if (r.fn != &Session::on_health && !authorize()) return;
            return (this->*r.fn)();
        }
        send_error({404, "no route " + path + " (see docs/http-api.md)", "invalid_request_error", "", "not_found"});
    }

    void on_health() {
        if (srv_.draining) return send_json(http::status::service_unavailable, {{"status", "draining"}});
        send_json(http::status::ok, {{"status", "ok"}});
    }
    void on_models() { send_json(http::status::ok, models_list(rt().pools(), *rt().config(), unix_now())); }
    // GET /v1/models/{id}: that entry of the list (an id may hold '/'), else 404 model_not_found.
    void on_model() {
        const std::string target(req_.target());
        const std::string id = target.substr(strlen("/v1/models/"), target.find('?') - strlen("/v1/models/"));
        const json list = models_list(rt().pools(), *rt().config(), unix_now());
        for (const json& e : list["data"])
            if (e["id"] == id) return send_json(http::status::ok, e);
        ApiError err;
        resolve_model(id, rt().pools(), *rt().config(), err);  // its 404 names the models there are
        send_error(err);
    }
    // A tenant's key reads the aggregate series and its own tenant's; an admin key reads all.
    void on_metrics() {
        send(http::status::ok, admin_ ? rt().metrics_prometheus() : rt().metrics_prometheus_for_tenant(tenant_),
             "text/plain; version=0.0.4");
    }
    bool require_admin() {
        if (admin_) return true;
        send_error({403, std::string(req_.method_string()) + " " + std::string(req_.target()) + " needs an admin key; tenant '" +
                             tenant_ + "' is not an admin (give an operator's [[tenant]] admin = true and use its key)",
                    "permission_error", "", "permission_denied"});
        return false;
    }

    // The pool whose tokenizer a tokenize / prompt check uses: the named one, else the first.
    std::optional<PoolInfo> pool_for(const std::string& model, ApiError& err) {
        const auto pools = rt().pools();
        auto target = resolve_model(model, pools, *rt().config(), err);
        if (!target) return std::nullopt;
        return pool_of(*target, pools, err);
    }
    // The pool whose tokenizer and context check a completion's prompt: the pinned one, else a
    // named bucket's pool, else the first. (A chat is rendered after routing, per pool: see generate.)
    std::optional<PoolInfo> pool_of(const ModelTarget& target, const std::vector<PoolInfo>& pools, ApiError& err) {
        if (pools.empty()) {
            err = {503, "no pool is serving", "server_error", "", "no_pool"};
            return std::nullopt;
        }
        std::string name = target.pool;
        if (name.empty() && !target.bucket_hint.empty())
            for (const auto& b : rt().config()->buckets)
                if (b.name == target.bucket_hint) name = b.pool;
        for (const auto& p : pools)
            if (p.name == name) return p;
        return pools.front();
    }

    void on_tokenize() {
        ApiError err;
        auto r = parse_tokenize_request(req_.body(), err);
        if (!r) return send_error(err);
        auto pool = pool_for(r->model, err);
        if (!pool) return send_error(err);
        auto ids = rt().tokenize(pool->name, r->text, r->add_special);
        if (!ids) return send_error({400, ids.error().message, "invalid_request_error", "content", "tokenize_failed"});
        send_json(http::status::ok, {{"tokens", *ids}});
    }
    void on_detokenize() {
        ApiError err;
        auto r = parse_detokenize_request(req_.body(), err);
        if (!r) return send_error(err);
        auto pool = pool_for(r->model, err);
        if (!pool) return send_error(err);
        auto text = rt().detokenize(pool->name, r->tokens);
        if (!text) return send_error({400, text.error().message, "invalid_request_error", "tokens", "invalid_token"});
        send_json(http::status::ok, {{"content", *text}});
    }

    // ---- documents and tool results (docs/reuse.md): each tenant sees its own only.
    void on_documents_list() {
        json data = json::array();
        const double now = reuse_clock_s();
        for (const auto& d : runtime_documents(rt()).list(tenant_, now)) data.push_back(document_json(d, now, false));
        send_json(http::status::ok, {{"object", "list"}, {"data", data}});
    }
    // PUT /v1/documents/{id} registers (or replaces), GET reads it, DELETE removes it.
    void on_document() {
        const std::string target(req_.target());
        const std::string id = target.substr(strlen("/v1/documents/"), target.find('?') - strlen("/v1/documents/"));
        const double now = reuse_clock_s();
        const http::verb m = req_.method();
        if (m == http::verb::put || m == http::verb::post) {
            ApiError err;
            auto put = parse_document_put(req_.body(), err);
            if (!put) return send_error(err);
            reuse::DocumentRefusal refusal;
            auto r = runtime_documents(rt()).put(tenant_, id, std::move(*put), now, refusal);
            if (!r) {
                ApiError e = document_error(refusal);
                // The field at fault in the PUT (the store's messages name it).
                e.param = refusal.message.find("document id") != std::string::npos ? "id"
                          : refusal.message.find("text") != std::string::npos    ? "text"
                          : refusal.message.find("acl") != std::string::npos || refusal.message.find("label") != std::string::npos ? "acl"
                          : refusal.status == 409 ? "version" : "";
                return send_error(e);
            }
            sweep_documents(rt());  // a replaced version's KV goes now
            auto doc = runtime_documents(rt()).get(tenant_, id, now);
            json j = doc ? document_json(*doc, now, false) : json{{"id", id}, {"version", r->version}};
            j["replaced_version"] = r->replaced ? json(r->replaced) : json(nullptr);
            return send_json(r->replaced ? http::status::ok : http::status::created, j);
        }
        if (m == http::verb::get) {
            auto doc = runtime_documents(rt()).get(tenant_, id, now);
            if (!doc)
                return send_error({404, "no document '" + id + "' (unknown, expired or deleted): register it with PUT /v1/documents/" + id,
                                   "not_found_error", "id", "document_not_found"});
            // Its text only to a caller whose labels cover the acl.
            ApiError err;
            const auto l = req_["x-steward-labels"];
            const std::vector<std::string> requested = split_list(std::string_view(l.data(), l.size()));
            auto labels = caller_labels(*rt().config(), tenant_, requested, err);
            if (!labels) return send_error(err);
            return send_json(http::status::ok, document_json(*doc, now, reuse::labels_cover(doc->acl, *labels)));
        }
        if (m == http::verb::delete_) {
            if (!runtime_documents(rt()).remove(tenant_, id))
                return send_error({404, "no document '" + id + "' to delete", "not_found_error", "id", "document_not_found"});
            sweep_documents(rt());  // its KV goes now
            return send_json(http::status::ok, {{"id", id}, {"object", "document"}, {"deleted", true}});
        }
        send_error({405, std::string(req_.method_string()) + " is not allowed on /v1/documents/{id}; use PUT, GET or DELETE",
                    "invalid_request_error", "", "method_not_allowed"},
                   {{"Allow", "PUT, GET, DELETE"}});
    }
    // PUT /v1/tool_results: a result for a cacheable tool's call, as a conversation would teach it.
    void on_tool_result_put() {
        ApiError err;
        auto cfg = rt().config();
        auto put = parse_tool_result_put(req_.body(), *cfg, tenant_, err);
        if (!put) return send_error(err);
        auto labels = caller_labels(*cfg, tenant_, put->labels, err);
        if (!labels) return send_error(err);
        const reuse::ToolCaller caller{tenant_, cfg->tenant_salt(tenant_), put->session, *labels};
        if (!runtime_tool_results(rt()).store(put->policy, caller, put->arguments, put->result, reuse_clock_s()))
            return send_error({400, "the result was not stored: the arguments lack a key field of the tool's policy, or the result is over 256 KiB",
                               "invalid_request_error", "arguments", "not_stored"});
        send_json(http::status::ok, {{"object", "tool_result"}, {"tool", put->policy.tool},
                                     {"scope", reuse::tool_scope_name(put->policy.scope)}, {"stored", true}});
    }

    void on_reload() {
        if (!require_admin()) return;
        net::post(srv_.blocking, [self = shared_from_this()] {
            auto g = self->rt().reload();
            net::post(self->stream_.get_executor(), [self, g = std::move(g)]() mutable {
                if (!g) return self->send_error({400, g.error().message, "invalid_request_error", "", "reload_failed"});
                self->send_json(http::status::ok, {{"status", "reloaded"}, {"generation", *g}});
            });
        });
    }

    void on_trace() {
        const std::string target(req_.target());
        const std::string id = target.substr(strlen("/admin/requests/"), target.find('?') - strlen("/admin/requests/"));
        const uint64_t h = parse_request_id(id);
        // Another tenant's trace is as unknown as a missing one (404, not 403: its existence is not told).
        const std::string trace = h ? rt().request_trace_json(h, tenant_) : "";
        if (trace.empty())
            return send_error({404, "no decision trace for request '" + id + "' (unknown, dropped, or another tenant's)",
                               "invalid_request_error", "id", "not_found"});
        send(http::status::ok, trace, "application/json");
    }

    // Embeddings run on the pool's embedding thread (Runtime::embed_async), never on this I/O
    // thread; the answer is posted back to the connection's strand. Counted like a runtime request's
    // last callback, so that stop() waits for it before the io_context goes.
    void on_embeddings() {
        ApiError err;
        auto parsed = parse_embeddings_request(req_.body(), err);
        if (!parsed) return send_error(err);
        const auto pools = rt().pools();
        auto target = resolve_model(parsed->model, pools, *rt().config(), err);
        if (!target) return send_error(err);
        EmbeddingRequest er;
        er.pool = target->pool;  // "": the runtime takes the first pool that can embed
        if (er.pool.empty() && !target->bucket_hint.empty())
            for (const auto& b : rt().config()->buckets)
                if (b.name == target->bucket_hint) er.pool = b.pool;
        auto req = std::make_shared<EmbeddingsRequest>(std::move(*parsed));
        er.texts = std::move(req->texts);
        er.token_ids = std::move(req->token_ids);
        std::weak_ptr<Session> weak = shared_from_this();
        HttpServer::Impl* srv = &srv_;
        {
            std::lock_guard<std::mutex> lk(srv->inflight_mu);
            srv->n_inflight_callbacks++;
        }
        rt().embed_async(std::move(er), [weak, srv, req](EmbeddingResult r) {
            if (auto self = weak.lock())
                net::post(self->stream_.get_executor(), [self, req, r = std::move(r)] { self->on_embedded(*req, r); });
            std::lock_guard<std::mutex> lk(srv->inflight_mu);
            srv->n_inflight_callbacks--;
            srv->inflight_cv.notify_all();
        });
    }
    void on_embedded(const EmbeddingsRequest& req, const EmbeddingResult& r) {
        if (closing_) return;
        if (!r.ok()) return send_error(embeddings_error(r));
        if (auto e = dimensions_error(req, r)) return send_error(*e);
        send(http::status::ok, embeddings_body(req, r), "application/json", {{"x-steward-pool", r.pool}});
    }

    void on_chat() { generate(true); }
    void on_completion() { generate(false); }

    void generate(bool chat) {
        ApiError err;
        auto parsed = parse_openai_request(req_.body(), chat, err);
        if (!parsed) return send_error(err);
        generate(std::move(*parsed), nullptr);
    }

    // POST /v1/responses: a chat continuing the tenant's stored conversation (previous_response_id),
    // answered as a Response (serve/responses_api.h).
    void on_responses() {
        ApiError err;
        auto parsed = parse_responses_request(req_.body(), err);
        if (!parsed) return send_error(err);
        std::shared_ptr<const ConversationTurn> previous;
        if (!parsed->previous_response_id.empty()) {
            auto stored = srv_.responses->get(tenant_, parsed->previous_response_id);
            if (!stored) return send_error(response_not_found(parsed->previous_response_id, "previous_response_id"));
            previous = stored->turn;
        }
        const std::string id = new_response_id();
        continue_conversation(*parsed, previous.get(), id);
        OpenAiRequest chat = parsed->chat;
        auto answer =
            std::make_shared<ResponsesAnswer>(std::move(*parsed), id, unix_now(), srv_.responses, tenant_, previous);
        generate(std::move(chat), std::move(answer));
    }
    // GET /v1/responses/{id}: a stored response of this tenant, as it was answered.
    void on_response_get() {
        const std::string target(req_.target());
        const std::string id = target.substr(strlen("/v1/responses/"), target.find('?') - strlen("/v1/responses/"));
        auto stored = srv_.responses->get(tenant_, id);
        if (!stored) return send_error(response_not_found(id, "response_id"));
        send_json(http::status::ok, stored->response);
    }
    // POST /v1/messages: Anthropic's Messages API (serve/anthropic_api.h); errors in its shape.
    void on_messages() {
        ApiError err;
        auto parsed = parse_anthropic_request(req_.body(), err);
        if (!parsed) return send_error(err);
        OpenAiRequest chat = parsed->chat;
        generate(std::move(chat), std::make_shared<AnthropicAnswer>(std::move(*parsed), new_message_id()));
    }

    // Runs a parsed request; `dialect` (a chat) answers it in another API's shape.
    void generate(OpenAiRequest parsed, std::shared_ptr<ChatDialect> dialect) {
        ApiError err;
        const bool chat = parsed.chat;
        auto ex = std::make_shared<Exchange>();
        ex->req = std::move(parsed);
        ex->dialect = std::move(dialect);
        ex->created = unix_now();
        const auto pools = rt().pools();
        auto target = resolve_model(ex->req.model, pools, *rt().config(), err);
        if (!target) return send_error(err);
        if (!prepare_reuse(*ex, *target)) return;
        if (chat) {
            // Route, then render: the runtime classifies and routes the chat (the bucket's rules and
            // routing policy), then asks the renderer for the prompt of the pool it chose, rendered
            // with that pool's template (and its tool-call grammar for tool_choice) and tokenized
            // once with its tokenizer. A pool that cannot take the chat, or whose context the prompt
            // fills, fails the request there: on_finish answers its 400 (error_of).
            if (pools.empty()) return send_error({503, "no pool is serving", "server_error", "", "no_pool"});
            ex->renderer = std::make_shared<ChatRenderer>(ex->req);
        } else {
            // The runtime tokenizes the prompt once, with the tokenizer of the pool it routes to, and
            // refuses one that fills that pool's context: on_finish answers its 400 (error_of).
            ex->pool = pool_of(*target, pools, err);
            if (!ex->pool) return send_error(err);
        }

        ex_ = ex;
        streaming_ = ex->req.stream;
        pending_.clear();
        finish_after_write_ = false;
        const int n = ex->req.n * ex->req.n_prompts();
        ex->n_total = n;
        ex->results.resize(n);
        ex->done.assign(n, false);
        // Tool-call ids: a per-thread generator seeded once (a std::random_device per request opens
        // and reads the kernel's entropy source each time).
        thread_local std::mt19937_64 ids_rng{std::random_device{}()};
        ex->id_seed = ids_rng() ^ ((uint64_t)ex->created << 20);
        ex->answer_pools.resize(n);
        ex->outputs.resize(n);
        ex->pending_lp.resize(n);
        ex->streamed_bytes.assign(n, 0);
        watch();
        ex->target = *target;
        submit_choices(ex);
        // A stop() that raced with this submit has already cancelled what it saw: catch the rest.
        if (srv_.stopped) cancel_exchange();
    }

    // Reuse for a chat (docs/reuse.md): the caller's labels, what the conversation teaches the tool
    // cache, and the referenced documents resolved (a refusal is the answer: 403, 404 or 409,
    // counted in the bucket the model names, else "unclassified").
    bool prepare_reuse(Exchange& ex, const ModelTarget& target) {
        auto cfg = rt().config();
        ApiError err;
        auto labels = caller_labels(*cfg, tenant_, ex.req.labels, err);
        if (!labels) {
            send_error(err);
            return false;
        }
        const double now = reuse_clock_s();
        ex.caller = {tenant_, cfg->tenant_salt(tenant_), ex.req.session, *labels};
        learn_tool_results(ex.req, *cfg, ex.caller, runtime_tool_results(rt()), now);
        if (ex.req.document_refs.empty()) return true;
        reuse::DocumentRefusal refusal;
        auto docs = runtime_documents(rt()).resolve(tenant_, *labels, ex.req.document_refs, now, refusal);
        if (!docs) {
            ReuseCounts c;
            c.document_refused_permission = refusal.status == 403;
            c.document_expired = refusal.code == "document_expired";
            if (c.document_refused_permission || c.document_expired) rt().record_reuse(target.bucket_hint, c);
            send_error(document_error(refusal));
            return false;
        }
        if (!chat_or_text(ex.req)) {
            send_error({400, "documents need a text prompt: 'prompt' is token ids; send it as text", "invalid_request_error",
                        "documents", "invalid_value"});
            return false;
        }
        ex.req.resolved_documents = std::move(*docs);
        ex.reuse.document_hits = (int64_t)ex.req.resolved_documents.size();
        return true;
    }

    static bool chat_or_text(const OpenAiRequest& r) { return r.chat || (!r.prompt_is_ids && r.n_prompts() == 1); }

    // The prompt tokens of the documents a finished chat found cached: the rendered prompt's
    // tokens up to the documents and through them, against the request's cached tokens.
    int64_t document_tokens_cached(const Exchange& ex, const GenerationResult& r) {
        if (ex.req.resolved_documents.empty() || r.pool.empty()) return 0;
        // A completion's prompt is the runtime's: the documents' block, a blank line, the prompt.
        const auto text = ex.renderer ? ex.renderer->text(r.pool)
                                      : std::optional<std::string>(reuse::documents_block(ex.req.resolved_documents) + "\n\n" + ex.req.prompt);
        if (!text) return 0;
        const auto span = documents_span(*text, ex.req.resolved_documents);
        if (!span) return 0;
        auto before = rt().tokenize(r.pool, text->substr(0, span->first), true);
        auto through = rt().tokenize(r.pool, text->substr(0, span->second), true);
        if (!before || !through) return 0;
        const int64_t cached = r.metrics.cached_tokens, b = (int64_t)before->size(), e = (int64_t)through->size();
        return std::clamp<int64_t>(cached - b, 0, std::max<int64_t>(0, e - b));
    }

    // A finished chat choice whose output calls cacheable tools (tool_cache "hint" or "resolve").
    // resolve, with every call's result cached and fresh: the calls and results are streamed (or
    // kept for the answer), and the chat continues in this request with them appended; true then
    // (the choice is not finished). Otherwise false, with hint's annotations kept in ex.resolved.
    std::vector<CachedCall> hinted_;
    bool resolve_tools(const std::shared_ptr<Exchange>& ex, int i, const GenerationResult& r) {
        hinted_.clear();
        if (!ex->req.chat || ex->req.tool_cache == "off" || !r.ok() || ex->n_total != 1 || ex->dialect) return false;
        const auto pool = answer_pool(*ex, r.pool);
        const ChoiceOutput out = parse_choice_output(ex->req, pool ? &*pool : nullptr, r.text, ex->id_seed * 16 + (uint64_t)i);
        if (out.tool_calls.empty()) return false;
        auto calls = lookup_calls(out.tool_calls, *rt().config(), tenant_, ex->req, ex->caller, runtime_tool_results(rt()), reuse_clock_s());
        bool all = !calls.empty();
        for (const auto& c : calls) {
            all = all && c.hit.has_value();
            ex->reuse.tool_stale_refused += c.stale;
        }
        if (ex->req.tool_cache == "hint" || !all || ex->tool_rounds >= k_max_tool_rounds) {
            for (const auto& c : calls)
                if (c.hit) {
                    ex->reuse.tool_hits++;
                    ex->reuse.tool_age_at_use_s.push_back(c.hit->age_s);
                }
            hinted_ = std::move(calls);
            return false;
        }
        // Resolve: the client sees the calls and their cached results; the chat goes on.
        for (const auto& c : calls) {
            ex->reuse.tool_hits++;
            ex->reuse.tool_round_trips_saved++;
            ex->reuse.tool_age_at_use_s.push_back(c.hit->age_s);
        }
        if (streaming_) {
            if (!ex->headers_sent) open_stream(*ex);
            for (const json& d : output(*ex, i).finish())
                queue_stream(sse_event(stream_chunk(ex->req, ex->handles[0], ex->created, i, d, nullptr, take_logprobs(*ex, i))));
            for (const auto& c : calls) {
                json d = tool_result_delta(c);
                queue_stream(sse_event(stream_chunk(ex->req, ex->handles[0], ex->created, i, d, nullptr)));
            }
        }
        ex->prior_completion_tokens += r.metrics.completion_tokens;
        ex->tool_rounds++;
        ex->req = continue_with_results(ex->req, out.content, calls);
        ex->renderer = std::make_shared<ChatRenderer>(ex->req);
        ex->outputs[i].reset();
        ex->resolved.insert(ex->resolved.end(), calls.begin(), calls.end());
        // The answer keeps the request's first id; the continuation's handle is cancelled with it.
        submit_prompt(ex, 0);
        return true;
    }

    // The reuse figures of a finished exchange, once, in the bucket that answered.
    void record_reuse(Exchange& ex, const GenerationResult& r) {
        if (ex.tool_rounds > 0) ex.reuse.tool_resolved_tokens_saved += r.metrics.cached_tokens;
        ex.reuse.document_saved_prefill_tokens = document_tokens_cached(ex, r);
        const ReuseCounts& c = ex.reuse;
        if (c.document_hits || c.tool_hits || c.tool_stale_refused) rt().record_reuse(r.bucket, c);
    }

    // Submits the exchange's n choices: the runtime runs choice 0 first and the rest once its prompt
    // is cached (Runtime::submit_choices). Runs on this connection's strand: callbacks post to it.
    // A batch of prompts: each prompt's n choices in turn, choice k of prompt p at p x n + k.
    void submit_choices(const std::shared_ptr<Exchange>& ex) {
        for (int p = 0; p < ex->req.n_prompts(); p++) submit_prompt(ex, p);
    }
    void submit_prompt(const std::shared_ptr<Exchange>& ex, int prompt) {
        const OpenAiRequest one = ex->req.n_prompts() > 1 ? ex->req.for_prompt(prompt) : OpenAiRequest{};
        const OpenAiRequest& req = ex->req.n_prompts() > 1 ? one : ex->req;
        GenerationRequest g = ex->renderer ? to_generation_request(req, ex->target, tenant_, ex->renderer)
                                           : to_generation_request(req, ex->target, tenant_, std::string());
        g.labels = ex->caller.labels;  // the runtime resolves a completion's documents with them
        // What reuse did for it, for its decision trace: the documents it renders, the cached tool
        // results an earlier round of this request resolved.
        if (!ex->req.resolved_documents.empty() || !ex->resolved.empty()) {
            json t = json::object();
            if (!ex->req.resolved_documents.empty()) {
                t["documents"] = json::array();
                for (const auto& d : ex->req.resolved_documents) t["documents"].push_back({{"id", d->id}, {"version", d->version}});
            }
            if (!ex->resolved.empty()) {
                t["tool_results"] = json::array();
                for (const auto& c : ex->resolved)
                    t["tool_results"].push_back({{"tool_call_id", string_field(c.call, "id")},
                                                 {"name", c.call.contains("function") ? string_field(c.call["function"], "name") : ""},
                                                 {"age_s", c.hit ? c.hit->age_s : 0.0},
                                                 {"scope", c.hit ? reuse::tool_scope_name(c.hit->scope) : ""}});
                t["round"] = ex->tool_rounds;
            }
            g.reuse_trace = t.dump();
        }
        // No max_tokens: the rest of the context (vLLM's, llama-server's), or the file's default.
        if (g.max_tokens == 0 && !rt().config()->limits.max_tokens_default_set) g.max_tokens = -1;
        const int base = prompt * ex->req.n;
        std::weak_ptr<Session> weak = shared_from_this();
        const bool stream = streaming_;
        HttpServer::Impl* srv = &srv_;
        auto callbacks = [weak, ex, stream, srv, base](int choice) {
            const int i = base + choice;
            RequestCallbacks cb;
            // Posted before the answer's first piece (the runtime calls on_pool first; the strand keeps the order).
            if (stream) {
                cb.on_pool = [weak, ex, i](const std::string& pool) {
                    if (auto self = weak.lock()) net::post(self->stream_.get_executor(), [ex, i, pool] { ex->answer_pools[i] = pool; });
                };
                cb.on_token = [weak, ex, i](const std::string& piece, const std::vector<int32_t>&) {
                    if (auto self = weak.lock())
                        net::post(self->stream_.get_executor(), [self, ex, i, piece] { self->on_piece(ex, i, piece); });
                };
                if (ex->req.logprobs)
                    cb.on_logprobs = [weak, ex, i](const std::vector<int32_t>& ids, const std::vector<float>& lps,
                                                   const std::vector<std::vector<TokenLogprob>>& top) {
                        if (auto self = weak.lock())
                            net::post(self->stream_.get_executor(), [ex, i, ids, lps, top] {
                                auto& p = ex->pending_lp[i];
                                p.ids.insert(p.ids.end(), ids.begin(), ids.end());
                                p.logprobs.insert(p.logprobs.end(), lps.begin(), lps.end());
                                p.top.insert(p.top.end(), top.begin(), top.end());
                            });
                    };
            }
            {
                std::lock_guard<std::mutex> lk(srv->inflight_mu);
                srv->n_inflight_callbacks++;
            }
            cb.on_finish = [weak, srv, ex, i](const GenerationResult& r) {
                if (auto self = weak.lock())
                    net::post(self->stream_.get_executor(), [self, ex, i, r] { self->on_finish(ex, i, r); });
                std::lock_guard<std::mutex> lk(srv->inflight_mu);
                if (!srv->inflight.erase(r.id)) srv->finished_before_listed.insert(r.id);
                srv->n_inflight_callbacks--;
                srv->inflight_cv.notify_all();
            };
            return cb;
        };
        const auto handles = rt().submit_choices(std::move(g), ex->req.n, callbacks);
        ex->handles.insert(ex->handles.end(), handles.begin(), handles.end());
        std::lock_guard<std::mutex> lk(srv_.inflight_mu);
        for (RequestHandle h : handles)
            if (!srv_.finished_before_listed.erase(h)) srv_.inflight.insert(h);
    }

    std::vector<std::pair<std::string, std::string>> id_header(const Exchange& ex) {
        return {{"x-steward-request-id", std::to_string(ex.handles.empty() ? 0 : ex.handles[0])}};
    }

    void queue_stream(const std::string& bytes) {
        if (req_.version() >= 11) {
            // HTTP/1.1 chunked framing around each event.
            char size[20];
            snprintf(size, sizeof size, "%zx\r\n", bytes.size());
            pending_ += size;
            pending_ += bytes;
            pending_ += "\r\n";
        } else {
            pending_ += bytes;  // HTTP/1.0: the stream ends with the connection
        }
        if ((int64_t)pending_.size() > srv_.cfg.max_stream_buffer_bytes) {
            spdlog::warn("http: a streaming client left {} bytes unread (over [server] max_stream_buffer_bytes): request cancelled",
                         pending_.size());
            return abort();
        }
        flush();
    }
    void send_stream_headers(const Exchange& ex) {
        const bool v11 = req_.version() >= 11;
        std::string h = std::string(v11 ? "HTTP/1.1" : "HTTP/1.0") +
                        " 200 OK\r\nServer: steward\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
                        (v11 ? "Transfer-Encoding: chunked\r\n" : "") +
                        "x-steward-request-id: " + std::to_string(ex.handles.empty() ? 0 : ex.handles[0]) + "\r\n";
        h += v11 && req_.keep_alive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
        pending_ = h + pending_;
    }
    void flush() {
        if (writing_ || closing_ || pending_.empty()) return;
        writing_ = true;
        out_.swap(pending_);
        pending_.clear();
        stream_.expires_after(ms(srv_.cfg.write_timeout_ms));
        net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
            self->writing_ = false;
            self->out_.clear();
            if (ec) return self->abort();  // the client went away, or stopped reading past write_timeout
            if (!self->pending_.empty()) return self->flush();
            if (self->finish_after_write_) {
                self->finish_after_write_ = false;
                self->stream_.expires_never();
                self->ex_.reset();
                self->streaming_ = false;
                const bool again = self->req_.version() >= 11 && self->req_.keep_alive() && !self->peer_eof_;
                self->stop_watching_then([self, again] { again ? self->wait_request() : self->shutdown(); });
            }
        });
    }

    // The 200 and SSE headers, then (chat) each choice's opening delta with the assistant role.
    void open_stream(Exchange& ex) {
        ex.headers_sent = true;
        send_stream_headers(ex);
        if (ex.dialect) return queue_stream(ex.dialect->stream_open());
        if (ex.req.chat)
            for (int k = 0; k < ex.n_total; k++)
                queue_stream(sse_event(stream_chunk(ex.req, ex.handles[0], ex.created, k, {{"role", "assistant"}, {"content", ""}}, nullptr)));
    }

    // The pool choice i's answer came from, as it rendered the prompt (its template's tool-call
    // format); a completion's own pool.
    std::optional<PoolInfo> answer_pool(const Exchange& ex, const std::string& name) {
        if (!ex.renderer) return ex.pool;
        return name.empty() ? std::nullopt : ex.renderer->pool(name);
    }
    StreamOutput& output(Exchange& ex, int i) {
        if (!ex.outputs[i]) {
            const auto pool = answer_pool(ex, ex.answer_pools[i]);
            ex.outputs[i].emplace(ex.req, pool ? &*pool : nullptr, ex.id_seed * 16 + (uint64_t)i);
        }
        return *ex.outputs[i];
    }
    // A failed choice's answer. A chat failed by its pool's rendering answers what that refused (a
    // 400 naming messages or tool_choice); a prompt that fills the answering pool's context (the
    // runtime counts it there) the 400 context_length_exceeded; the rest as the runtime finished.
    ApiError error_of(const Exchange& ex, const GenerationResult& r) {
        if (r.finish == FinishReason::ERROR && !r.pool.empty()) {
            if (ex.renderer)
                if (auto e = ex.renderer->error(r.pool)) return *e;
            for (const PoolInfo& p : rt().pools())
                if (p.name == r.pool && p.n_ctx > 0 &&
                    (r.metrics.prompt_tokens >= p.n_ctx ||
                     (ex.req.max_tokens > 0 && (int64_t)r.metrics.prompt_tokens + ex.req.max_tokens > p.n_ctx)))
                    return {400, r.error, "invalid_request_error", ex.req.chat ? "messages" : "prompt",
                            "context_length_exceeded"};
        }
        return error_for_result(r);
    }

    // The logprobs of the tokens not yet in a chunk (null without logprobs, or none pending); taken.
    // Logprobs' token texts: each id's own bytes (the texts concatenate to the output), and each
    // alternative's; one tokenizer lookup per list. An unknown pool gives empty texts.
    void token_texts(const std::string& pool, const std::vector<int32_t>& ids, const std::vector<std::vector<TokenLogprob>>& top,
                     std::vector<TokenText>& texts, std::vector<std::vector<TokenText>>& tops) {
        auto spell = [&](const std::vector<int32_t>& list, std::vector<TokenText>& out) {
            auto pieces = rt().token_pieces(pool, list);
            for (size_t j = 0; j < list.size(); j++) out.push_back({list[j], pieces ? (*pieces)[j] : std::string()});
        };
        spell(ids, texts);
        for (const auto& alts : top) {
            std::vector<int32_t> alt_ids;
            for (const auto& a : alts) alt_ids.push_back(a.id);
            spell(alt_ids, tops.emplace_back());
        }
    }

    json take_logprobs(Exchange& ex, int i) {
        if (!ex.req.logprobs || ex.pending_lp[i].ids.empty()) return nullptr;
        Exchange::PendingLogprobs p = std::move(ex.pending_lp[i]);
        ex.pending_lp[i] = {};
        const auto pool = answer_pool(ex, ex.answer_pools[i]);
        const std::string name = !ex.answer_pools[i].empty() ? ex.answer_pools[i] : pool ? pool->name : std::string();
        std::vector<TokenText> texts;
        std::vector<std::vector<TokenText>> tops;
        token_texts(name, p.ids, p.top, texts, tops);
        json lp = stream_logprobs(ex.req, p.logprobs, p.top, texts, tops, ex.streamed_bytes[i]);
        for (const auto& t : texts) ex.streamed_bytes[i] += t.text.size();
        return lp;
    }

    void on_piece(const std::shared_ptr<Exchange>& ex, int i, const std::string& piece) {
        if (ex->closed || closing_) return;
        if (!ex->headers_sent) open_stream(*ex);
        for (const json& d : output(*ex, i).feed(piece)) {
            if (ex->dialect) {
                // An empty chunk would end the chunked body: only what the dialect has to say.
                if (std::string s = ex->dialect->stream_delta(d); !s.empty()) queue_stream(s);
                continue;
            }
            queue_stream(sse_event(stream_chunk(ex->req, ex->handles[0], ex->created, i, d, nullptr, take_logprobs(*ex, i))));
        }
    }

    // The stop string that ended a choice ("" none): read from its tokens' text past the answer's.
    std::string stop_of(const Exchange& ex, const GenerationResult& r) {
        if (ex.req.stop.empty() || r.finish != FinishReason::STOP) return "";
        auto full = rt().detokenize(r.pool, r.tokens);
        return full ? matched_stop(r.text, *full, ex.req.stop) : "";
    }
    // /v1/responses, /v1/messages: the one choice, parsed as a chat's, in the dialect's shape.
    void answer_dialect(Exchange& ex) {
        const GenerationResult& r = ex.results[0];
        const auto pool = answer_pool(ex, r.pool);
        const ChoiceOutput out = parse_choice_output(ex.req, pool ? &*pool : nullptr, r.text, ex.handles[0] * 16);
        auto headers = id_header(ex);
        headers.emplace_back("x-steward-pool", r.pool);
        send_json(http::status::ok, ex.dialect->answer(r, out, stop_of(ex, r)), std::move(headers));
    }

    void on_finish(const std::shared_ptr<Exchange>& ex, int i, const GenerationResult& r0) {
        if (!ex->closed && !closing_ && resolve_tools(ex, i, r0)) return;
        GenerationResult r = r0;
        if (ex->prior_completion_tokens) r.metrics.completion_tokens += ex->prior_completion_tokens;
        if (i == 0) record_reuse(*ex, r);
        ex->results[i] = r;
        ex->done[i] = true;
        ex->n_done++;
        if (ex->closed || closing_) return maybe_release();
        if (streaming_) return on_stream_finish(ex, i);
        if (ex->n_done < ex->n_total) return;
        ex->closed = true;
        ex_.reset();
        for (const auto& res : ex->results)
            if (!res.ok()) return send_error(error_of(*ex, res), id_header(*ex));
        if (ex->dialect) return answer_dialect(*ex);
        // Token texts for logprobs (each token's own spelling).
        std::vector<std::vector<TokenText>> texts(ex->n_total);
        std::vector<std::vector<std::vector<TokenText>>> tops(ex->n_total);
        if (ex->req.logprobs)
            for (int k = 0; k < ex->n_total; k++) {
                const auto& res = ex->results[k];
                const std::string pool = !res.pool.empty() ? res.pool : ex->pool ? ex->pool->name : std::string();
                token_texts(pool, res.tokens, res.top_logprobs, texts[k], tops[k]);
            }
        // Each choice's output is parsed in the tool-call format of the pool that answered it.
        std::vector<std::optional<PoolInfo>> answered(ex->n_total);
        std::vector<const PoolInfo*> choice_pools(ex->n_total, nullptr);
        for (int k = 0; k < ex->n_total; k++)
            if ((answered[k] = answer_pool(*ex, ex->results[k].pool))) choice_pools[k] = &*answered[k];
        auto headers = id_header(*ex);
        headers.emplace_back("x-steward-pool", ex->results[0].pool);  // the pool that answered (choice 0)
        json body = completion_response(ex->req, ex->handles[0], ex->created, ex->results, texts, tops, choice_pools);
        annotate_reuse(*ex, body);
        send_json(http::status::ok, body, std::move(headers));
    }

    // A chat's answer with reuse (docs/reuse.md): the tool calls resolved from the cache in earlier
    // rounds (message.steward_resolved_tool_calls) and, with tool_cache "hint", each call with a
    // cached result carries it (tool_calls[k].cached_result).
    void annotate_reuse(const Exchange& ex, json& body) {
        if (!body.contains("choices") || body["choices"].empty()) return;
        json& msg = body["choices"][0]["message"];
        if (!ex.resolved.empty()) {
            json list = json::array();
            for (const auto& c : ex.resolved) list.push_back(resolved_call_json(c));
            msg["steward_resolved_tool_calls"] = std::move(list);
        }
        if (msg.contains("tool_calls") && msg["tool_calls"].is_array())
            for (size_t k = 0; k < hinted_.size() && k < msg["tool_calls"].size(); k++)
                if (hinted_[k].hit)
                    msg["tool_calls"][k]["cached_result"] = {{"content", hinted_[k].hit->result}, {"cached", true},
                                                             {"age_s", hinted_[k].hit->age_s}};
    }

    void on_stream_finish(const std::shared_ptr<Exchange>& ex, int i) {
        const GenerationResult& r = ex->results[i];
        if (!ex->headers_sent && !r.ok()) {
            // Nothing streamed yet: the failure is the answer (429 with Retry-After when overloaded).
            ex->closed = true;
            cancel_exchange();
            ex_.reset();
            streaming_ = false;
            return send_error(error_of(*ex, r), id_header(*ex));
        }
        if (!ex->headers_sent) open_stream(*ex);
        if (closing_) return;
        if (r.ok() && ex->dialect) {
            std::string s;
            for (const json& d : output(*ex, i).finish()) s += ex->dialect->stream_delta(d);
            queue_stream(s + ex->dialect->stream_finish(r, stop_of(*ex, r)));
        } else if (!r.ok() && ex->dialect) {
            queue_stream(ex->dialect->stream_error(error_of(*ex, r)));
        } else if (r.ok()) {
            StreamOutput& o = output(*ex, i);
            for (const json& d : o.finish())
                queue_stream(sse_event(stream_chunk(ex->req, ex->handles[0], ex->created, i, d, nullptr, take_logprobs(*ex, i))));
            // tool_cache "hint": each call with a cached result gets it in a delta of its own.
            for (size_t k = 0; k < hinted_.size(); k++)
                if (hinted_[k].hit)
                    queue_stream(sse_event(stream_chunk(
                        ex->req, ex->handles[0], ex->created, i,
                        {{"tool_calls", json::array({{{"index", (int)k},
                                                      {"cached_result", {{"content", hinted_[k].hit->result},
                                                                         {"cached", true},
                                                                         {"age_s", hinted_[k].hit->age_s}}}}})}},
                        nullptr)));
            queue_stream(sse_event(stream_chunk(ex->req, ex->handles[0], ex->created, i, nullptr,
                                                openai_finish_reason(r.finish, o.saw_tool_calls()), take_logprobs(*ex, i))));
        } else {
            queue_stream(sse_event(json::parse(error_body(error_of(*ex, r)))));
        }
        if (closing_ || ex->n_done < ex->n_total) return;
        ex->closed = true;
        if (ex->req.include_usage) queue_stream(sse_event(stream_usage_chunk(ex->req, ex->handles[0], ex->created, ex->results)));
        if (!ex->dialect) queue_stream(std::string(k_sse_done));  // OpenAI's chat and completions only
        if (closing_) return;
        if (req_.version() >= 11) pending_ += "0\r\n\r\n";
        finish_after_write_ = true;
        flush();
    }
};

void HttpServer::Impl::accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
        if (ec) {
            if (ec == net::error::operation_aborted || stopped) return;
            spdlog::warn("http: accept failed: {}", ec.message());
            return accept();
        }
        if (n_connections.load() >= cfg.max_connections) {
            beast::error_code ignored;
            socket.close(ignored);  // over [server] max_connections
            return accept();
        }
        n_connections++;
        // The kernel's send buffer is bounded like ours: a client that stops reading holds at most
        // about twice max_stream_buffer_bytes per connection (the kernel doubles the value).
        beast::error_code ignored;
        socket.set_option(net::socket_base::send_buffer_size((int)std::min<int64_t>(cfg.max_stream_buffer_bytes, 1 << 30)), ignored);
        socket.set_option(tcp::no_delay(true), ignored);  // a streamed token goes out at once
        auto s = std::make_shared<Session>(*this, std::move(socket));
        {
            std::lock_guard<std::mutex> lk(sessions_mu);
            s->self_in_server = sessions.insert(sessions.end(), s);
            s->registered = true;
        }
        s->start();
        accept();
    });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { stop(); }

Expected<std::unique_ptr<HttpServer>> HttpServer::start(Runtime& runtime, const ServerConfig& cfg) { return start(&runtime, cfg); }

Expected<std::unique_ptr<HttpServer>> HttpServer::start(Runtime* runtime, const ServerConfig& cfg) {
    auto impl = std::make_unique<Impl>(runtime, cfg);
    beast::error_code ec;
    const auto addr = net::ip::make_address(cfg.host, ec);
    if (ec) return make_error("[server] host '", cfg.host, "' is not an IP address (", ec.message(), "); use e.g. 127.0.0.1 or 0.0.0.0");
    const tcp::endpoint ep(addr, (uint16_t)cfg.port);
    const std::string at = cfg.host + ":" + std::to_string(cfg.port);
    impl->acceptor.open(ep.protocol(), ec);
    if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) impl->acceptor.bind(ep, ec);
    if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return make_error("http server: cannot listen on ", at, ": ", ec.message(), " (another process on the port? set [server] port)");
    impl->bound_port = impl->acceptor.local_endpoint().port();
    impl->accept();
    for (int i = 0; i < std::max(1, cfg.io_threads); i++) impl->threads.emplace_back([io = &impl->ioc] { io->run(); });
    return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::stop() {
    Impl& s = *impl_;
    if (s.stopped.exchange(true)) return;
    s.draining = true;
    net::post(s.acceptor.get_executor(), [&s] {
        beast::error_code ignored;
        s.acceptor.close(ignored);
    });
    {
        std::lock_guard<std::mutex> lk(s.sessions_mu);
        for (auto& p : s.sessions) p->close_from_server();
    }
    // Every runtime request's last callback posts into ioc: wait for them before it goes.
    {
        std::unique_lock<std::mutex> lk(s.inflight_mu);
        if (Runtime* rt = s.runtime.load())
            for (RequestHandle h : s.inflight) rt->cancel(h);
        s.inflight_cv.wait(lk, [&] { return s.n_inflight_callbacks == 0; });
    }
    s.blocking.join();
    s.ioc.stop();
    for (auto& t : s.threads) t.join();
    s.threads.clear();
    // A request submitted by a handler that ran while stop() waited: cancel it and wait again.
    {
        std::unique_lock<std::mutex> lk(s.inflight_mu);
        if (Runtime* rt = s.runtime.load())
            for (RequestHandle h : s.inflight) rt->cancel(h);
        s.inflight_cv.wait(lk, [&] { return s.n_inflight_callbacks == 0; });
    }
    std::list<std::shared_ptr<Session>> sessions;
    {
        std::lock_guard<std::mutex> lk(s.sessions_mu);
        sessions.swap(s.sessions);
        for (auto& p : sessions) p->registered = false;
    }
    sessions.clear();  // the sockets close while the io_context still exists
}

void HttpServer::set_draining(bool draining) { impl_->draining = draining; }
void HttpServer::attach(Runtime& runtime) { impl_->runtime = &runtime; }
uint16_t HttpServer::port() const { return impl_->bound_port; }

}  // namespace steward::serve
