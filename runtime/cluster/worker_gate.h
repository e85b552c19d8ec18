// The worker's public port: a small TCP acceptor in front of CAF's middleman. It terminates TLS
// (mutual: a front must present a certificate of the configured CA), holds each connection to the
// limits (connections, frame size, bytes of frames in progress) by reading every BASP header before
// CAF sees it, and relays what passes to CAF's middleman, published on a loopback-only port.
// docs/cluster.md#threat-model says why the bound lives here and not in CAF.
#pragma once

#include <steward/expected.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cluster/basp_frame.h"

namespace steward {

struct WorkerGateOptions {
    std::string host;       // the public address fronts connect to
    int port = 0;           // 0: an ephemeral one (port() says which)
    int upstream_port = 0;  // CAF's middleman, published on 127.0.0.1
    bool tls = false;       // false only for [cluster] insecure_loopback (the caller checks the host)
    // PEM files: this worker's certificate chain, its key, the CA fronts' certificates must chain to.
    std::string cert, key, ca;
    BaspLimits limits;
    int max_connections = 64;                 // past it a new connection is closed at once
    int64_t max_pending_bytes = 256ll << 20;  // payload bytes of frames in progress, all connections together
    double handshake_timeout_ms = 5000;       // TLS and the front's BASP handshake must be done within it
};

// "" when the three PEM files load as a certificate chain, its private key and a CA certificate;
// else an error naming the [cluster] key, the file and the fix. Both a worker's gate and a front's
// CAF TLS layer (which would abort on a bad file mid-connect) check their files with it at start.
std::string tls_files_error(const std::string& cert, const std::string& key, const std::string& ca);

class WorkerGate {
public:
    // Binds and starts the gate's thread. Errors: the address cannot be bound, a TLS file cannot be
    // read or does not parse (the message names the file and the key).
    static Expected<std::unique_ptr<WorkerGate>> start(const WorkerGateOptions& o);
    // Closes the port and every connection, then joins the gate's thread.
    ~WorkerGate();
    int port() const;

    struct Impl;

private:
    explicit WorkerGate(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace steward
