// WorkerGate: one Asio thread; per connection, TLS (or not), a connection to CAF on loopback, and two
// pumps: front -> CAF through a BaspFrameReader (each header checked before it goes on), CAF -> front
// as it comes. Each pump has one buffer and waits for its write before it reads again, so a
// connection holds at most two buffers here, and CAF at most one frame of max_frame_bytes.
#include "cluster/worker_gate.h"

#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <chrono>
#include <thread>

namespace steward {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t k_buffer_bytes = 64 << 10;

// Touched on the gate's thread only. n_open and n_pending_bytes are the limits' state; the refusal
// counts thin out and number the log lines (worth_logging).
struct Counters {
    int64_t n_refused_full = 0, n_refused_tls = 0, n_refused_frame = 0, n_refused_timeout = 0, n_open = 0,
            n_pending_bytes = 0;
};

// A plain socket and a TLS stream, for the one Connection template below.
tcp::socket& lowest(tcp::socket& s) {
    return s;
}
tcp::socket& lowest(asio::ssl::stream<tcp::socket>& s) {
    return s.next_layer();
}

// A flood of refused peers must not flood the log: the first 8 refusals of a kind, then the 16th,
// 32nd, 64th, ... (each line carries the count so far).
bool worth_logging(int64_t n) {
    return n <= 8 || (n & (n - 1)) == 0;
}

template <class Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>> {
public:
    Connection(Stream stream, const WorkerGateOptions& o, Counters& c)
        : front_(std::move(stream)),
          caf_(front_.get_executor()),
          deadline_(front_.get_executor()),
          o_(o),
          c_(c),
          reader_(o.limits),
          in_(k_buffer_bytes),
          back_(k_buffer_bytes) {
        c_.n_open++;
    }
    ~Connection() {
        c_.n_pending_bytes -= charged_;
        c_.n_open--;
    }

    void start() {
        auto self = this->shared_from_this();
        deadline_.expires_after(std::chrono::milliseconds((int64_t)o_.handshake_timeout_ms));
        deadline_.async_wait([self](const boost::system::error_code& ec) {
            if (ec || self->reader_.n_frames() > 0 || self->closed_) return;
            if (worth_logging(++self->c_.n_refused_timeout))
                spdlog::warn(
                    "worker gate: closed {}: no handshake within {} ms ([cluster] connect_timeout_ms; {} so far)",
                    self->peer_, (long long)self->o_.handshake_timeout_ms, (long long)self->c_.n_refused_timeout);
            self->close();
        });
        boost::system::error_code ec;
        auto ep = lowest(front_).remote_endpoint(ec);
        peer_ = ec ? "a peer" : ep.address().to_string() + ":" + std::to_string(ep.port());
        if constexpr (std::is_same_v<Stream, tcp::socket>) {
            connect_caf();
        } else {
            front_.async_handshake(asio::ssl::stream_base::server, [self](const boost::system::error_code& ec) {
                if (ec) {
                    if (!self->closed_ && worth_logging(++self->c_.n_refused_tls)) {
                        spdlog::warn(
                            "worker gate: refused {}: TLS handshake failed ({}); a front needs a certificate of the "
                            "worker's [cluster] tls_ca ({} refused so far)",
                            self->peer_, ec.message(), (long long)self->c_.n_refused_tls);
                    }
                    return self->close();
                }
                self->connect_caf();
            });
        }
    }

private:
    void connect_caf() {
        auto self = this->shared_from_this();
        caf_.async_connect(tcp::endpoint(asio::ip::address_v4::loopback(), (unsigned short)o_.upstream_port),
                           [self](const boost::system::error_code& ec) {
                               if (ec) {
                                   spdlog::warn("worker gate: cannot reach the worker's own middleman: {}",
                                                ec.message());
                                   return self->close();
                               }
                               self->read_front();
                               self->read_caf();
                           });
    }

    void read_front() {
        auto self = this->shared_from_this();
        front_.async_read_some(asio::buffer(in_), [self](const boost::system::error_code& ec, size_t n) {
            if (ec) return self->close();
            self->out_.clear();
            const bool ok = self->reader_.feed(self->in_.data(), n, self->out_);
            // Bytes CAF may have to hold for frames in progress, across connections: what this
            // connection's reader has announced and not received yet.
            const int64_t now = self->reader_.n_frame_bytes();
            self->c_.n_pending_bytes += now - self->charged_;
            self->charged_ = now;
            if (!ok || self->c_.n_pending_bytes > self->o_.max_pending_bytes) {
                if (worth_logging(++self->c_.n_refused_frame))
                    spdlog::warn(
                        "worker gate: closed {} ({} frames refused so far): {}", self->peer_,
                        (long long)self->c_.n_refused_frame,
                        ok ? "its frame would take the payload in progress over [cluster] max_pending_bytes (" +
                                 std::to_string(self->o_.max_pending_bytes) + ")"
                           : self->reader_.error());
                return self->close();
            }
            if (self->reader_.n_frames() > 0) self->deadline_.cancel();
            asio::async_write(self->caf_, asio::buffer(self->out_),
                              [self](const boost::system::error_code& ec, size_t) {
                                  if (ec) return self->close();
                                  self->read_front();
                              });
        });
    }

    void read_caf() {
        auto self = this->shared_from_this();
        caf_.async_read_some(asio::buffer(back_), [self](const boost::system::error_code& ec, size_t n) {
            if (ec) return self->close();
            asio::async_write(self->front_, asio::buffer(self->back_.data(), n),
                              [self](const boost::system::error_code& ec, size_t) {
                                  if (ec) return self->close();
                                  self->read_caf();
                              });
        });
    }

    // Both sides at once: CAF sees its connection end (and tells the worker's actors, as for a front
    // that went away), the front sees its own end.
    void close() {
        if (closed_) return;
        closed_ = true;
        boost::system::error_code ec;
        deadline_.cancel();
        lowest(front_).shutdown(tcp::socket::shutdown_both, ec);
        lowest(front_).close(ec);
        caf_.shutdown(tcp::socket::shutdown_both, ec);
        caf_.close(ec);
    }

    Stream front_;
    tcp::socket caf_;
    asio::steady_timer deadline_;
    const WorkerGateOptions& o_;
    Counters& c_;
    BaspFrameReader reader_;
    std::vector<uint8_t> in_;    // [k_buffer_bytes] read from the front
    std::vector<uint8_t> out_;   // [<= k_buffer_bytes + header] what passed the reader, being written to CAF
    std::vector<uint8_t> back_;  // [k_buffer_bytes] read from CAF, being written to the front
    int64_t charged_ = 0;        // this connection's share of n_pending_bytes
    bool closed_ = false;
    std::string peer_;
};

}  // namespace

std::string tls_files_error(const std::string& cert, const std::string& key, const std::string& ca) {
    namespace ssl = asio::ssl;
    ssl::context t(ssl::context::tls);
    boost::system::error_code ec;
    if (t.use_certificate_chain_file(cert, ec); ec)
        return "[cluster] tls_cert '" + cert + "': cannot load it (" + ec.message() + "); give a PEM certificate chain";
    if (t.use_private_key_file(key, ssl::context::pem, ec); ec)
        return "[cluster] tls_key '" + key + "': cannot load it (" + ec.message() +
               "); give the PEM private key of tls_cert, unencrypted";
    if (SSL_CTX_check_private_key(t.native_handle()) != 1)
        return "[cluster] tls_key '" + key + "' is not the key of tls_cert '" + cert + "'; give the pair's key";
    if (t.load_verify_file(ca, ec); ec)
        return "[cluster] tls_ca '" + ca + "': cannot load it (" + ec.message() +
               "); give the PEM certificate of the cluster's CA";
    return "";
}

namespace {

std::unique_ptr<asio::ssl::context> make_tls_server(const WorkerGateOptions& o) {
    namespace ssl = asio::ssl;
    auto t = std::make_unique<ssl::context>(ssl::context::tls_server);
    t->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
    t->use_certificate_chain_file(o.cert);
    t->use_private_key_file(o.key, ssl::context::pem);
    t->load_verify_file(o.ca);
    // Mutual: a front without a certificate of that CA does not get past the handshake.
    t->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    return t;
}

}  // namespace

struct WorkerGate::Impl {
    // Declared before io: the connections that io's destructor destroys refer to them.
    WorkerGateOptions o;
    Counters c;
    std::unique_ptr<asio::ssl::context> tls;
    asio::io_context io{1};
    tcp::acceptor acceptor{io};
    int port = 0;
    std::thread thread;

    void accept() {
        acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket s) {
            if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
            if (!ec) {
                if (c.n_open >= o.max_connections) {
                    // Closed before anything is read: a flood of connections costs a socket each, briefly.
                    if (worth_logging(++c.n_refused_full))
                        spdlog::warn(
                            "worker gate: refused a connection: {} are open ([cluster] max_connections); {} refused so "
                            "far",
                            (long long)c.n_open, (long long)c.n_refused_full);
                    boost::system::error_code ignored;
                    s.close(ignored);
                } else {
                    s.set_option(tcp::no_delay(true));
                    if (tls)
                        std::make_shared<Connection<asio::ssl::stream<tcp::socket>>>(
                            asio::ssl::stream<tcp::socket>(std::move(s), *tls), o, c)
                            ->start();
                    else
                        std::make_shared<Connection<tcp::socket>>(std::move(s), o, c)->start();
                }
            }
            accept();
        });
    }
};

Expected<std::unique_ptr<WorkerGate>> WorkerGate::start(const WorkerGateOptions& o) {
    auto impl = std::make_unique<Impl>();
    impl->o = o;
    if (o.tls) {
        if (std::string e = tls_files_error(o.cert, o.key, o.ca); !e.empty()) return make_error(e);
        impl->tls = make_tls_server(o);
    }
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(o.host == "localhost" ? "127.0.0.1" : o.host, ec);
    if (ec && o.host.size() > 2 && o.host.front() == '[')
        addr = asio::ip::make_address(o.host.substr(1, o.host.size() - 2), ec);
    if (ec)
        return make_error("cannot listen on ", o.host, ":", std::to_string(o.port), ": '", o.host,
                          "' is not an IP address; give one (--listen HOST:PORT)");
    tcp::endpoint ep(addr, (unsigned short)o.port);
    impl->acceptor.open(ep.protocol(), ec);
    if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) impl->acceptor.bind(ep, ec);
    if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
        return make_error("cannot listen on ", o.host, ":", std::to_string(o.port), ": ", ec.message(),
                          "; pick a free port (--listen HOST:PORT) or stop what holds it");
    impl->port = impl->acceptor.local_endpoint().port();
    impl->accept();
    Impl* raw = impl.get();
    impl->thread = std::thread([raw] { raw->io.run(); });
    return std::unique_ptr<WorkerGate>(new WorkerGate(std::move(impl)));
}

WorkerGate::WorkerGate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerGate::~WorkerGate() {
    // Connections are owned by their pending operations: stopping the loop and destroying the
    // context (with impl_) destroys them, closing their sockets.
    asio::post(impl_->io, [raw = impl_.get()] {
        boost::system::error_code ec;
        raw->acceptor.close(ec);
        raw->io.stop();
    });
    if (impl_->thread.joinable()) impl_->thread.join();
}

int WorkerGate::port() const {
    return impl_->port;
}

}  // namespace steward
