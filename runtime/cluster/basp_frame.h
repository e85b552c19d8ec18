// The worker gate's reader of BASP frames (CAF 0.17's wire format) from a front: it finds each
// frame's header, refuses one that announces more than the limit before any of its payload is passed
// on, and says which bytes may go on to CAF. A pure core: no sockets, no CAF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace steward {

// CAF 0.17's BASP header (caf/io/basp/header.hpp), big-endian, 32 bytes:
//   [0] operation  [1..2] padding  [3] flags  [4..8) payload_len  [8..16) operation_data
//   [16..24) source_actor  [24..32) dest_actor
// worker_gate.cpp checks the size against caf::io::basp::header_size at compile time.
inline constexpr size_t k_basp_header_size = 32;
inline constexpr uint8_t k_basp_client_handshake = 0x01;
inline constexpr uint8_t k_basp_max_operation = 0x06;  // heartbeat, the last of CAF 0.17's message types

struct BaspLimits {
    uint32_t max_frame_bytes = 64u << 20;      // a frame's payload; more closes the connection
    uint32_t max_handshake_bytes = 64u << 10;  // the first frame's (the client handshake's) payload
};

struct BaspHeader {
    uint8_t operation = 0;
    uint8_t flags = 0;
    uint32_t payload_len = 0;
    uint64_t operation_data = 0;
    uint64_t source_actor = 0;
    uint64_t dest_actor = 0;
};

// Decodes a header from exactly k_basp_header_size bytes.
BaspHeader decode_basp_header(const uint8_t* p);

// One direction of one connection (front -> worker). Not thread-safe: one per connection.
class BaspFrameReader {
public:
    explicit BaspFrameReader(BaspLimits limits) : limits_(limits) {}

    // Takes the next n bytes the peer sent and appends to `out` those that may go on to CAF: the
    // payload bytes of an accepted frame as they come, and a header only once it is whole and
    // accepted (CAF sizes its buffer from the header, so an over-limit header must never reach it).
    // False on a violation (error() says which); the connection must then be closed, and nothing of
    // the offending frame has been appended. At most n + k_basp_header_size bytes are appended.
    bool feed(const uint8_t* data, size_t n, std::vector<uint8_t>& out);

    const std::string& error() const { return error_; }
    // The payload bytes of the current frame not received yet (0 between frames).
    uint64_t n_payload_left() const { return payload_left_; }
    // The announced payload of the frame being received (0 between frames).
    uint32_t n_frame_bytes() const { return frame_bytes_; }
    uint64_t n_frames() const { return n_frames_; }

private:
    bool accept_header();

    BaspLimits limits_;
    uint8_t header_[k_basp_header_size] = {};  // the header being assembled
    size_t n_header_ = 0;                      // bytes of header_ filled
    uint64_t payload_left_ = 0;
    uint32_t frame_bytes_ = 0;
    uint64_t n_frames_ = 0;  // headers accepted
    std::string error_;
};

}  // namespace steward
