// The engine's send path (engine.h): packets built, ICRC'd and handed to the socket one at a
// time or as GSO trains (transmit_batch.h), with the fallback for paths that refuse trains,
// and written to the capture (packet_capture.h) once the socket took them.
#include <cerrno>
#include <cstring>

#include "transport/app_memory_guard.h"
#include "transport/engine.h"
#include "uroce/icrc.h"

namespace uroce::transport {

namespace {

// The ICRC goes on the wire least significant byte first.
void store_icrc(uint8_t* at, uint32_t crc) {
    at[0] = static_cast<uint8_t>(crc);
    at[1] = static_cast<uint8_t>(crc >> 8);
    at[2] = static_cast<uint8_t>(crc >> 16);
    at[3] = static_cast<uint8_t>(crc >> 24);
}

}  // namespace

const UdpSocket& Engine::sender_for_qpn(uint32_t qpn) {
    const uint16_t port = source_port_for_qpn(qpn);
    const UdpSocket& sock = send_sockets_.for_port(port);
    if (sock.port() != port) bump(counters_->tx_sport_fallback);
    return sock;
}

Engine::TransmitResult Engine::transmit(const wire::Headers& h, std::span<const iovec> payload,
                                        uint32_t payload_len, const IpAddress& dst_ip,
                                        const UdpSocket& sock, uint8_t ttl, TransmitBatch* batch,
                                        QpCounters* qp) {
    // One decision per packet the engine is asked to send (UROCE_FAULTS).
    const FaultDecision fault = faults_.enabled(FaultDirection::Tx)
                                    ? faults_.next(FaultDirection::Tx, h.bth.opcode, h.bth.dest_qp)
                                    : FaultDecision{};
    const bool faulted = fault.fault == Fault::Corrupt || fault.fault == Fault::Duplicate ||
                         fault.delay_us != 0 || fault.ce;
    if (batch && (ttl != 0 || !gso_enabled() || faulted || !batch->usable() || batch->alone_)) {
        // Sent alone, after what the batch holds (whose pin stays: the caller gathered this
        // packet's payload under it).
        if (!batch->empty()) send_batch(*batch);
        batch = nullptr;
    }
    uint8_t local_hdr[wire::kMaxHeaderBytes];
    wire::Headers out = h;
    out.bth.pad = wire::pad_for(payload_len);
    const size_t hlen = wire::build_headers(out, local_hdr);
    if (hlen == 0) {
        bump(counters_->tx_errors);
        return TransmitResult::Failed;
    }
    uint16_t index = 0;  // packet k of a train is the k-th segment Linux cuts from it
    const auto bytes = static_cast<uint32_t>(hlen + payload_len + out.bth.pad + 4);
    TransmitBatch::Slot slot;
    if (batch) {
        const auto header_bytes = static_cast<uint32_t>(hlen);
        bool placed = batch->place(sock, dst_ip, h.bth.dest_qp, bytes, header_bytes, slot);
        if (!placed) {
            send_batch(*batch);  // keeps the pin
            placed = batch->place(sock, dst_ip, h.bth.dest_qp, bytes, header_bytes, slot);
        }
        // A packet before it can never be sent: its QP fails, nothing after it leaves.
        if (batch->failed_tag_ != TransmitBatch::kNoTag) return TransmitResult::Failed;
        if (placed)
            index = slot.index_in_train;
        else
            batch = nullptr;  // fits no train, even alone: sent alone, and refused
    }
    // The ICRC covers the UDP source port: it is the port of the socket that sends.
    const wire::IpFlow flow{config_.ip, dst_ip, sock.port(), config_.port};
    // What the ICRC covers after the pseudo-header: the header, the payload where it is
    // (application memory), the pad.
    static const uint8_t kZeros[4] = {0, 0, 0, 0};
    std::span<const uint8_t> pieces[kMaxSge + 2];
    size_t npieces = 0;
    pieces[npieces++] = {local_hdr, hlen};
    for (const iovec& v : payload)
        if (v.iov_len != 0)
            pieces[npieces++] = {static_cast<const uint8_t*>(v.iov_base), v.iov_len};
    if (out.bth.pad) pieces[npieces++] = {kZeros, out.bth.pad};
    const std::span<const std::span<const uint8_t>> covered(pieces, npieces);
    iovec local_iov[kMaxSge + 3];
    std::span<const iovec> packet;
    uint8_t local_icrc[4];
    uint32_t crc = 0;
    if (batch) {
        // Built whole in the staging area (transmit_batch.h). The ICRC is taken from the
        // payload where it is, before the copy: a CRC over the copy waits for the copy's
        // stores (docs/performance-log.md, 2026-12-02). An application that changes its
        // buffer while the send is in flight gets a packet its peer drops for its ICRC, and
        // a resend, rather than a torn packet that passes.
        uint8_t* const at = batch->at(slot);
        auto build = [&crc, &flow, index, covered, at] {
            crc = wire::icrc(flow, wire::Ipv4Unseen{index, true}, covered);
            uint8_t* to = at;
            for (const auto& piece : covered) {
                std::memcpy(to, piece.data(), piece.size());
                to += piece.size();
            }
        };
        // The payload is application memory: its pages may be gone (app_memory_guard.h).
        if (!guarded(build)) {
            bump(counters_->app_memory_faults);
            return TransmitResult::Failed;
        }
        store_icrc(at + bytes - 4, crc);
        local_iov[0] = {at, bytes};
        packet = std::span(local_iov, 1);
    } else {
        // Alone: header, payload where it is, pad, ICRC, an iovec each.
        for (size_t i = 0; i < npieces; ++i)
            local_iov[i] = {const_cast<uint8_t*>(pieces[i].data()), pieces[i].size()};
        auto compute = [&crc, &flow, covered] {
            crc = wire::icrc(flow, wire::Ipv4Unseen{0, true}, covered);
        };
        // The payload is application memory: its pages may be gone (app_memory_guard.h).
        if (!guarded(compute)) {
            bump(counters_->app_memory_faults);
            return TransmitResult::Failed;
        }
        store_icrc(local_icrc, crc);
        local_iov[npieces] = {local_icrc, 4};
        packet = std::span(local_iov, npieces + 1);
    }
    if (fault.fault == Fault::Drop) {
        bump(counters_->tx_dropped_fault);
        if (qp) bump(qp->tx_faults);
        return TransmitResult::Lost;
    }
    if (has_transmit_filter_.load(std::memory_order_acquire) && !pass_filter(packet, dst_ip)) {
        bump(counters_->tx_dropped_filter);
        return TransmitResult::Lost;
    }
    if (batch) {
        batch->add(sock, dst_ip, h.bth.dest_qp, slot, bytes, payload_len);
        return TransmitResult::Queued;
    }
    if (faulted) return send_faulted(fault, qp, packet, bytes, flow, sock, ttl);
    const TransmitResult sent = account_send(sock.send(dst_ip, config_.port, packet, ttl), 1);
    if (capture_ && sent == TransmitResult::Sent) {
        capture_->sent(flow, 0, ttl, packet, tx_ecn());
        note_capture_written();
    }
    return sent;
}

Engine::TransmitResult Engine::account_send(int err, uint64_t packets) {
    switch (err) {
        case 0:
            bump(counters_->tx_packets, packets);
            return TransmitResult::Sent;
        case EAGAIN:
        case ENOBUFS:
            // Waiting here would stall every thread that needs this QP's mutex; the
            // retransmission machinery recovers the packet as it would a loss.
            bump(counters_->tx_dropped_full, packets);
            return TransmitResult::Lost;
        case EMSGSIZE:
            bump(counters_->tx_too_big, packets);
            return TransmitResult::Failed;
        default:
            // A route that is down for a moment (ENETUNREACH, EHOSTUNREACH, a firewall's
            // EPERM) may come back: treated as a loss, the retry counter decides.
            bump(counters_->tx_errors, packets);
            return TransmitResult::Lost;
    }
}

Engine::TransmitResult Engine::flush(TransmitBatch& batch) {
    const TransmitResult result = send_batch(batch);
    batch.unpin();
    return result;
}

Engine::TransmitResult Engine::send_batch(TransmitBatch& batch) {
    if (batch.count_ == 0) return TransmitResult::Sent;
    size_t t = 0;
    if (batch.ntrains_ > 1 && gso_enabled()) {
        // Every train in one system call. The kernel takes them in order and stops at the
        // first it refuses: that one, and those after it, go through send_train, which
        // meets the refusal again and handles it as a lone train's.
        UdpSocket::Datagram datagrams[TransmitBatch::kMaxTrains];
        for (size_t i = 0; i < batch.ntrains_; ++i) {
            const TransmitBatch::Train& train = batch.trains_[i];
            datagrams[i] = {batch.train_iov(i),
                            static_cast<uint16_t>(train.count > 1 ? train.segment_bytes : 0)};
        }
        const size_t taken = batch.from_->send_many(batch.dst_ip_, config_.port,
                                                    std::span(datagrams, batch.ntrains_));
        if (taken > 0) bump(counters_->tx_multi_sends);
        for (; t < taken; ++t) train_sent(batch, t);
    }
    TransmitResult worst = TransmitResult::Sent;
    for (; t < batch.ntrains_; ++t) {
        const TransmitResult r = send_train(batch, t);
        // The request of a packet that can never be sent fails, and its QP with it: the
        // trains after it stay here.
        if (r == TransmitResult::Failed) {
            worst = r;
            break;
        }
        if (r == TransmitResult::Lost) worst = r;
    }
    batch.clear();
    return worst;
}

void Engine::train_sent(TransmitBatch& batch, size_t t) {
    const TransmitBatch::Train& train = batch.trains_[t];
    account_send(0, train.count);
    if (train.count > 1) bump(counters_->tx_gso_sends);
    capture_sent(batch, train.first, train.count);
    count_qp_sent(batch, train.first, train.count);
}

void Engine::count_qp_sent(const TransmitBatch& batch, size_t first, size_t count) {
    if (!batch.qp_counters_) return;
    uint64_t payload = 0;
    for (size_t i = first; i < first + count; ++i) payload += batch.packets_[i].payload_len;
    bump(batch.qp_counters_->tx_packets, count);
    bump(batch.qp_counters_->tx_payload_bytes, payload);
}

Engine::TransmitResult Engine::send_train(TransmitBatch& batch, size_t t) {
    const TransmitBatch::Train& train = batch.trains_[t];
    TransmitResult result;
    bool counted = false;  // the QP's counters already have the packets
    const std::span<const iovec> iov = batch.train_iov(t);
    if (train.count == 1) {
        result = account_send(batch.from_->send(batch.dst_ip_, config_.port, iov), 1);
        if (result == TransmitResult::Sent) capture_sent(batch, train.first, 1);
    } else if (!gso_enabled()) {
        // An earlier train of this batch found the path refusing GSO.
        size_t sent_alone = 0;
        result = send_one_by_one(batch, t, sent_alone);
        counted = true;
    } else {
        const int err = batch.from_->send(batch.dst_ip_, config_.port, iov, 0,
                                          static_cast<uint16_t>(train.segment_bytes));
        if (err == EINVAL || err == EMSGSIZE || err == EIO || err == EOPNOTSUPP ||
            err == ENOPROTOOPT) {
            // This path cannot take GSO (a device without checksum offload, an old kernel): no
            // more trains from this engine, once a packet went out alone. A segment larger
            // than the path's MTU is refused alone too (tx_too_big): that is the QP's path
            // MTU setting, not GSO's fault, and the engine's other paths keep GSO.
            bump(counters_->tx_gso_fallbacks);
            size_t sent_alone = 0;
            result = send_one_by_one(batch, t, sent_alone);
            if (sent_alone > 0) gso_.store(false, std::memory_order_relaxed);
            counted = true;
        } else {
            result = account_send(err, train.count);
            if (result == TransmitResult::Sent) {
                bump(counters_->tx_gso_sends);
                capture_sent(batch, train.first, train.count);
            }
        }
    }
    if (result == TransmitResult::Failed && batch.failed_tag_ == TransmitBatch::kNoTag)
        batch.failed_tag_ = batch.packets_[train.first].tag;
    if (result == TransmitResult::Sent && !counted) count_qp_sent(batch, train.first, train.count);
    return result;
}

Engine::TransmitResult Engine::send_one_by_one(TransmitBatch& batch, size_t t, size_t& sent) {
    const TransmitBatch::Train& train = batch.trains_[t];
    TransmitResult worst = TransmitResult::Sent;
    for (size_t i = train.first; i < train.first + train.count; ++i) {
        const TransmitBatch::Packet& p = batch.packets_[i];
        const iovec iov = batch.packet_iov(i);
        const std::span<const iovec> packet(&iov, 1);
        if (i != train.first) {
            // Sent alone it carries identification 0: its ICRC (the last four bytes) must say
            // so. The packet is the staging area's copy: no application memory is read.
            uint8_t* const data = batch.packet_data(i);
            const wire::IpFlow flow{config_.ip, batch.dst_ip_, batch.from_->port(), config_.port};
            store_icrc(data + p.bytes - 4, wire::icrc(flow, wire::Ipv4Unseen{},
                                                      std::span<const uint8_t>(data, p.bytes - 4)));
        }
        const TransmitResult r =
            account_send(batch.from_->send(batch.dst_ip_, config_.port, packet), 1);
        if (r == TransmitResult::Sent) ++sent;
        if (r == TransmitResult::Sent && batch.qp_counters_) {
            bump(batch.qp_counters_->tx_packets);
            bump(batch.qp_counters_->tx_payload_bytes, p.payload_len);
        }
        if (r == TransmitResult::Sent && capture_) {
            // Sent alone: identification 0, as its ICRC now says.
            const wire::IpFlow flow{config_.ip, batch.dst_ip_, batch.from_->port(), config_.port};
            capture_->sent(flow, 0, 0, packet, tx_ecn());
            note_capture_written();
        }
        if (r == TransmitResult::Failed) {
            // The request it belongs to fails, and the QP with it: what follows stays here.
            if (batch.failed_tag_ == TransmitBatch::kNoTag) batch.failed_tag_ = p.tag;
            return r;
        }
        if (r == TransmitResult::Lost && worst == TransmitResult::Sent) {
            worst = r;
        }
    }
    return worst;
}

void Engine::capture_sent(const TransmitBatch& batch, size_t first, size_t count) {
    if (!capture_) return;
    const wire::IpFlow flow{config_.ip, batch.dst_ip_, batch.from_->port(), config_.port};
    for (size_t i = first; i < first + count; ++i) {
        const iovec iov = batch.packet_iov(i);
        // Packet k of a train has the ICRC for identification k (the segment Linux cuts).
        capture_->sent(flow, static_cast<uint16_t>(i - first), 0, std::span(&iov, 1), tx_ecn());
    }
    note_capture_written();
}

}  // namespace uroce::transport
