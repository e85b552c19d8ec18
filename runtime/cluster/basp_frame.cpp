// BaspFrameReader: header by header, payload by payload, each header checked before it goes on.
#include "cluster/basp_frame.h"

#include <algorithm>

namespace steward {

namespace {

uint64_t read_be(const uint8_t* p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

}  // namespace

BaspHeader decode_basp_header(const uint8_t* p) {
    BaspHeader h;
    h.operation = p[0];
    h.flags = p[3];
    h.payload_len = (uint32_t)read_be(p + 4, 4);
    h.operation_data = read_be(p + 8, 8);
    h.source_actor = read_be(p + 16, 8);
    h.dest_actor = read_be(p + 24, 8);
    return h;
}

bool BaspFrameReader::accept_header() {
    const BaspHeader h = decode_basp_header(header_);
    // A front speaks first after the worker's server handshake: its client handshake, then messages.
    // Anything else first is not a CAF front (or is one replaying frames of another connection).
    if (n_frames_ == 0 && h.operation != k_basp_client_handshake) {
        error_ = "the first frame is not a BASP client handshake (operation " + std::to_string(h.operation) + ")";
        return false;
    }
    if (h.operation > k_basp_max_operation) {
        error_ = "a frame has an unknown BASP operation " + std::to_string(h.operation);
        return false;
    }
    const uint32_t limit =
        n_frames_ == 0 ? std::min(limits_.max_handshake_bytes, limits_.max_frame_bytes) : limits_.max_frame_bytes;
    if (h.payload_len > limit) {
        error_ = std::string(n_frames_ == 0 ? "the handshake" : "a frame") + " announces " +
                 std::to_string(h.payload_len) + " payload bytes, over the limit of " + std::to_string(limit) +
                 (n_frames_ == 0 ? "" : " ([cluster] max_frame_bytes)");
        return false;
    }
    n_frames_++;
    payload_left_ = h.payload_len;
    frame_bytes_ = h.payload_len;
    return true;
}

bool BaspFrameReader::feed(const uint8_t* data, size_t n, std::vector<uint8_t>& out) {
    if (!error_.empty()) return false;
    size_t i = 0;
    while (i < n) {
        if (payload_left_ > 0) {
            const size_t take = (size_t)std::min<uint64_t>(payload_left_, n - i);
            out.insert(out.end(), data + i, data + i + take);
            payload_left_ -= take;
            i += take;
            if (payload_left_ == 0) frame_bytes_ = 0;
            continue;
        }
        const size_t take = std::min(k_basp_header_size - n_header_, n - i);
        std::copy(data + i, data + i + take, header_ + n_header_);
        n_header_ += take;
        i += take;
        if (n_header_ < k_basp_header_size) break;
        n_header_ = 0;
        if (!accept_header()) return false;
        out.insert(out.end(), header_, header_ + k_basp_header_size);
        if (payload_left_ == 0) frame_bytes_ = 0;
    }
    return true;
}

}  // namespace steward
