// libFuzzer harness for the receive path: parser, ICRC check, responder and completer of two
// real engines, with packets handed straight to Engine::receive_datagram.
//
// Two engines (A and B) with one connected RcQp each live for the whole run; every input starts
// from the same state: both QPs reset to RTS, the scenario's work posted (receives, a SEND, a
// WRITE, a READ; nothing reaches the wire because the transmit filter drops every packet, so
// all of it stays outstanding), memory refilled with known bytes. The input is then delivered
// to A (as if from B) and to B (as if from A), and afterwards the invariants are checked:
//   - guard bytes around every registered region are unchanged;
//   - regions no remote access can write (remote-read-only, send sources) are unchanged;
//   - in the region holding receive buffers and READ destinations, only the bytes those work
//     requests name may have changed;
//   - every completion names a work request that was posted, at most once, with a valid
//     status; a successful receive reports no more bytes than its buffers hold; a send WQE
//     completes successfully only after its request (the last packet of a SEND or WRITE, the
//     READ request) was transmitted: no peer can answer what it never got.
// A broken invariant aborts, which libFuzzer reports as a crash with the input.
//
// Input format (all fix-ups are optional so that inputs can also reach the early checks):
//   byte 0       scenario: bit 0 post receives, bit 1 a SEND, bit 2 a WRITE, bit 3 a READ,
//                bit 4 a second READ, bits 5-6 path MTU 256/512/1024/4096, bit 7 max_rd_atomic 2
//                (else 1: the second READ is not sent before the first completes)
//   then records: ctrl (1 byte), length (2 bytes, little-endian), that many packet bytes
//     ctrl bit 0  deliver to B (as if from A) instead of to A (as if from B)
//     ctrl bit 1  recompute the ICRC (otherwise the packet goes as it is)
//     ctrl bit 2  re-base the PSN: the first request (and the first response) of the input
//                 for a QP is moved to the PSN that QP expects, later ones keep their distance
//     ctrl bit 3  set the destination QP to the receiving QP
//     ctrl bit 4  point the RETH at the receiver's memory: rkey by the old rkey's low two bits
//                 (writable region, read-only region, the local-only region's key, unchanged),
//                 address folded into that region
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "transport/completion_queue.h"
#include "transport/engine.h"
#include "transport/rc_qp.h"
#include "uroce/icrc.h"
#include "uroce/wire.h"

namespace {

using namespace uroce::transport;
namespace wire = uroce::wire;

constexpr uint32_t kPd = 3;
constexpr size_t kGuard = 256;
constexpr uint8_t kGuardByte = 0xa5;

[[noreturn]] void violated(const char* what, size_t detail) {
    std::fprintf(stderr, "fuzz_receive: invariant violated: %s (%zu)\n", what, detail);
    std::abort();
}

uint8_t pattern(uint32_t seed, size_t i) {
    uint32_t x = seed * 0x9e3779b9u + static_cast<uint32_t>(i) * 0x85ebca6bu;
    x ^= x >> 15;
    x *= 0xc2b2ae35u;
    return static_cast<uint8_t>(x >> 24);
}

// One registered region inside a side's arena, with guard bytes on both sides.
struct Region {
    size_t offset = 0;  // in the arena
    size_t length = 0;
    uint64_t iova = 0;
    MemoryKeys keys;
};

// A slice of the local-only region that a work request may legitimately write.
struct Slice {
    size_t offset;  // in the region
    uint32_t length;
};

// Receive buffers (one SGE, two SGEs, a large one, a small one) and the READ destinations.
constexpr std::array<Slice, 5> kRecvSlices{Slice{0, 1500}, Slice{2048, 700}, Slice{3072, 900},
                                           Slice{4096, 4096}, Slice{8448, 64}};
constexpr Slice kReadDest1{10240, 3000};
constexpr Slice kReadDest2{13312, 1200};
constexpr size_t kLocalBytes = 16384;
// All of the above, in address order.
constexpr std::array<Slice, 7> kLocalSlices{kRecvSlices[0], kRecvSlices[1], kRecvSlices[2],
                                            kRecvSlices[3], kRecvSlices[4], kReadDest1,
                                            kReadDest2};

struct Side {
    uroce::IpAddress ip;
    std::unique_ptr<Engine> engine;
    std::shared_ptr<CompletionQueue> scq;
    std::shared_ptr<CompletionQueue> rcq;
    std::shared_ptr<RcQp> qp;
    std::vector<uint8_t> arena;
    std::vector<uint8_t> reference;  // what the arena holds at the start of every input
    Region writable;                 // remote WRITE/READ target
    Region local;                    // receives and READ destinations; local write only
    Region read_only;                // remote READ only
    Region source;                   // SEND/WRITE sources; no access bit at all
    uint32_t sq_psn = 0;
    uint32_t rq_psn = 0;

    // Request PSNs this side has transmitted since the input began (the transmit filter sees
    // them on whichever thread sends), and per posted send WQE the PSN whose transmission a
    // successful completion presupposes: the last packet of a SEND or WRITE, a READ's request.
    std::mutex sent_mutex;
    std::set<uint32_t> sent_psns;
    std::map<uint64_t, uint32_t> needed_psn;

    uint8_t* at(const Region& r, size_t off) { return arena.data() + r.offset + off; }
    uint64_t addr(const Region& r, size_t off) { return reinterpret_cast<uint64_t>(at(r, off)); }
    Sge sge(const Region& r, size_t off, uint32_t len) {
        return Sge{addr(r, off), len, r.keys.lkey};
    }
};

class Harness {
  public:
    Harness() {
        const auto pid = static_cast<uint32_t>(::getpid());
        const uint32_t net = 127u << 24 | (1 + pid % 250) << 16 | 77u << 8;
        port_ = static_cast<uint16_t>(20000 + pid % 20000);
        // PSNs near the wrap on one side, so that the fuzzer crosses it.
        setup(a_, net | 1, 0xfffff8, 0x000100);
        setup(b_, net | 2, 0x000100, 0xfffff8);
    }

    void run(const uint8_t* data, size_t size) {
        if (size == 0) return;
        const uint8_t scenario = data[0];
        reset(scenario);
        anchors_ = {};
        size_t pos = 1;
        for (int n = 0; n < 64 && pos + 3 <= size; ++n) {
            const uint8_t ctrl = data[pos];
            const size_t len = std::min<size_t>(data[pos + 1] | data[pos + 2] << 8, size - pos - 3);
            deliver(ctrl, std::span(data + pos + 3, len));
            pos += 3 + len;
        }
        check(a_);
        check(b_);
    }

  private:
    void setup(Side& s, uint32_t ip, uint32_t sq_psn, uint32_t rq_psn) {
        s.ip = uroce::IpAddress::v4(ip);
        s.sq_psn = sq_psn;
        s.rq_psn = rq_psn;
        EngineConfig config;
        config.ip = s.ip;
        config.port = port_;
        config.mtu = 4096;
        std::string error;
        int err = 0;
        s.engine = Engine::create(config, error, err);
        if (!s.engine) {
            std::fprintf(stderr, "fuzz_receive: Engine::create: %s (errno %d)\n", error.c_str(),
                         err);
            std::exit(1);
        }
        // Nothing reaches the wire; request PSNs are recorded.
        s.engine->set_transmit_filter(
            [&s](std::span<const uint8_t> bytes, const uroce::IpAddress&) {
                const wire::OpcodeInfo* info =
                    bytes.size() >= wire::kBthBytes ? wire::opcode_info(bytes[0]) : nullptr;
                if (info && (info->flags & wire::kRequest)) {
                    const uint32_t psn =
                        uint32_t{bytes[9]} << 16 | uint32_t{bytes[10]} << 8 | bytes[11];
                    std::lock_guard lock(s.sent_mutex);
                    s.sent_psns.insert(psn);
                }
                return false;
            });
        s.scq = std::make_shared<CompletionQueue>(4096, nullptr, nullptr);
        s.rcq = std::make_shared<CompletionQueue>(4096, nullptr, nullptr);
        s.qp = std::make_shared<RcQp>(*s.engine, s.engine->allocate_qpn(), kPd,
                                      QpCaps{64, 64, kMaxSge, kMaxSge, kMaxInlineData}, s.scq,
                                      s.rcq, nullptr);
        s.engine->attach(s.qp);

        size_t off = kGuard;
        auto place = [&](Region& r, size_t len, uint64_t iova) {
            r.offset = off;
            r.length = len;
            r.iova = iova;
            off += len + kGuard;
        };
        place(s.writable, 16384, 0x7000'0000'0000ull);
        place(s.local, kLocalBytes, 0x7100'0000'0000ull);
        place(s.read_only, 8192, 0x7200'0000'0000ull);
        place(s.source, 8192, 0x7300'0000'0000ull);
        s.arena.assign(off, kGuardByte);
        for (Region* r : {&s.writable, &s.local, &s.read_only, &s.source})
            for (size_t i = 0; i < r->length; ++i)
                s.arena[r->offset + i] = pattern(ip, r->offset + i);
        s.reference = s.arena;
        auto reg = [&](Region& r, uint32_t access) {
            r.keys = s.engine->memory().add(kPd, s.addr(r, 0), r.length, r.iova, access);
        };
        reg(s.writable, kLocalWrite | kRemoteWrite | kRemoteRead);
        reg(s.local, kLocalWrite);
        reg(s.read_only, kRemoteRead);
        reg(s.source, 0);
    }

    // Both QPs back to RTS with the scenario's work posted and the memory as it started.
    void reset(uint8_t scenario) {
        static constexpr std::array<uint32_t, 4> kMtus{256, 512, 1024, 4096};
        const uint32_t mtu = kMtus[(scenario >> 5) & 3];
        for (Side* s : {&a_, &b_}) {
            Side& peer = s == &a_ ? b_ : a_;
            QpAttributes at;
            at.access = kRemoteWrite | kRemoteRead;
            at.dst_ip = peer.ip;
            at.dest_qpn = peer.qp->qpn();
            at.mtu = mtu;
            at.rq_psn = s->rq_psn;
            at.sq_psn = s->sq_psn;
            at.timeout = 0;  // no retransmission timer: runs stay reproducible
            at.retry_cnt = 7;
            at.rnr_retry = 3;
            at.min_rnr_timer = 1;
            at.max_rd_atomic = (scenario & 0x80) ? 2 : 1;  // with 1, the second READ waits
            at.max_dest_rd_atomic = 2;
            s->qp->modify(at, s->qp->state(), QpState::Reset);
            s->qp->modify(at, QpState::Reset, QpState::Init);
            s->qp->modify(at, QpState::Init, QpState::Rtr);
            drain(*s);
            if (std::memcmp(s->arena.data(), s->reference.data(), s->arena.size()) != 0)
                std::memcpy(s->arena.data(), s->reference.data(),
                            s->arena.size());  // in place: registered
            s->qp->modify(at, QpState::Rtr, QpState::Rts);
            if (s->qp->state() != QpState::Rts) violated("reset did not reach RTS", 0);
            post(*s, peer, scenario, mtu);
        }
    }

    void post(Side& s, Side& peer, uint8_t scenario, uint32_t mtu) {
        {
            std::lock_guard lock(s.sent_mutex);
            s.sent_psns.clear();
        }
        s.needed_psn.clear();
        recv_lengths_[&s == &a_].clear();
        uint32_t next_psn = s.sq_psn;
        if (scenario & 0x01) {
            uint64_t id = 100;
            for (size_t i = 0; i < kRecvSlices.size(); ++i) {
                RecvWqe r;
                r.wr_id = id++;
                r.sgl.sge[r.sgl.count++] =
                    s.sge(s.local, kRecvSlices[i].offset, kRecvSlices[i].length);
                // Slices 1 and 2 form one receive of two SGEs.
                if (i == 1) {
                    ++i;
                    r.sgl.sge[r.sgl.count++] =
                        s.sge(s.local, kRecvSlices[i].offset, kRecvSlices[i].length);
                }
                s.qp->post_recv(r);
                recv_lengths_[&s == &a_][r.wr_id] = static_cast<uint32_t>(r.sgl.total_length());
            }
        }
        auto send = [&](uint64_t id, SendOpcode op, Sge sge, uint64_t raddr, uint32_t rkey) {
            SendWqe w;
            w.wr_id = id;
            w.opcode = op;
            w.sgl.sge[w.sgl.count++] = sge;
            w.length = sge.length;
            w.remote_addr = raddr;
            w.rkey = rkey;
            w.imm = 0x12345678;
            if (s.qp->post_send(w) != 0) return;
            const uint32_t packets = std::max<uint32_t>(1, (sge.length + mtu - 1) / mtu);
            s.needed_psn[id] =
                (op == SendOpcode::RdmaRead ? next_psn : next_psn + packets - 1) & wire::kPsnMask;
            next_psn += packets;
        };
        if (scenario & 0x02) send(1, SendOpcode::SendWithImm, s.sge(s.source, 0, 3000), 0, 0);
        if (scenario & 0x04)
            send(2, SendOpcode::RdmaWrite, s.sge(s.source, 4096, 2500), peer.writable.iova + 100,
                 peer.writable.keys.rkey);
        if (scenario & 0x08)
            send(3, SendOpcode::RdmaRead, s.sge(s.local, kReadDest1.offset, kReadDest1.length),
                 peer.writable.iova + 5000, peer.writable.keys.rkey);
        if (scenario & 0x10)
            send(4, SendOpcode::RdmaRead, s.sge(s.local, kReadDest2.offset, kReadDest2.length),
                 peer.read_only.iova, peer.read_only.keys.rkey);
    }

    // Throws away the completions of the previous input.
    static void drain(Side& s) {
        std::array<Completion, 64> buf;
        for (int i = 0; i < 1000 && s.scq->poll(buf) > 0;) ++i;
        for (int i = 0; i < 1000 && s.rcq->poll(buf) > 0;) ++i;
    }

    void deliver(uint8_t ctrl, std::span<const uint8_t> bytes) {
        Side& to = (ctrl & 1) ? b_ : a_;
        Side& from = (ctrl & 1) ? a_ : b_;
        std::vector<uint8_t>& pkt = scratch_;
        pkt.assign(bytes.begin(), bytes.end());
        if (pkt.size() >= wire::kBthBytes + wire::kIcrcBytes) {
            if (ctrl & 0x04) rebase_psn(to, ctrl & 1, pkt);
            if (ctrl & 0x08) {
                const uint32_t qpn = to.qp->qpn();
                pkt[5] = static_cast<uint8_t>(qpn >> 16);
                pkt[6] = static_cast<uint8_t>(qpn >> 8);
                pkt[7] = static_cast<uint8_t>(qpn);
            }
            if (ctrl & 0x10) point_reth(to, pkt);
            if (ctrl & 0x02) {
                const wire::IpFlow flow{from.ip, to.ip, port_, port_};
                const uint32_t crc =
                    wire::icrc(flow, wire::Ipv4Unseen{},
                               std::span<const uint8_t>(pkt.data(), pkt.size() - wire::kIcrcBytes));
                for (size_t i = 0; i < 4; ++i)
                    pkt[pkt.size() - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
            }
        }
        to.engine->receive_datagram(pkt, from.ip, port_);
    }

    void rebase_psn(Side& to, bool to_b, std::vector<uint8_t>& pkt) {
        const wire::OpcodeInfo* info = wire::opcode_info(pkt[0]);
        const bool response = info && (info->flags & wire::kResponse);
        const uint32_t base = response ? to.sq_psn : to.rq_psn;
        const uint32_t psn = uint32_t{pkt[9]} << 16 | uint32_t{pkt[10]} << 8 | pkt[11];
        Anchor& anchor = anchors_[to_b][response];
        if (!anchor.set) anchor = {true, psn};
        const uint32_t out = (base + psn - anchor.psn) & wire::kPsnMask;
        pkt[9] = static_cast<uint8_t>(out >> 16);
        pkt[10] = static_cast<uint8_t>(out >> 8);
        pkt[11] = static_cast<uint8_t>(out);
    }

    static void point_reth(Side& to, std::vector<uint8_t>& pkt) {
        const wire::OpcodeInfo* info = wire::opcode_info(pkt[0]);
        if (!info || !(info->headers & wire::kHasReth) ||
            pkt.size() < wire::kBthBytes + wire::kRethBytes + wire::kIcrcBytes)
            return;
        uint8_t* reth = pkt.data() + wire::kBthBytes;
        uint64_t va = 0;
        for (int i = 0; i < 8; ++i) va = va << 8 | reth[i];
        const uint32_t old_rkey =
            uint32_t{reth[8]} << 24 | uint32_t{reth[9]} << 16 | uint32_t{reth[10]} << 8 | reth[11];
        const Region* r = nullptr;
        uint32_t rkey = old_rkey;
        switch (old_rkey & 3) {
            case 0:
                r = &to.writable;
                break;
            case 1:
                r = &to.read_only;
                break;
            case 2:
                r = &to.local;
                rkey = to.local.keys.rkey;
                break;
            default:
                return;
        }
        if (r != &to.local) rkey = r->keys.rkey;
        va = r->iova + va % r->length;
        for (int i = 0; i < 8; ++i) reth[i] = static_cast<uint8_t>(va >> (56 - 8 * i));
        for (int i = 0; i < 4; ++i) reth[8 + i] = static_cast<uint8_t>(rkey >> (24 - 8 * i));
    }

    void check(Side& s) {
        const std::vector<uint8_t>& ref = s.reference;
        auto unchanged = [&](size_t from, size_t len, const char* what) {
            if (std::memcmp(s.arena.data() + from, ref.data() + from, len) == 0) return;
            for (size_t i = from; i < from + len; ++i)
                if (s.arena[i] != ref[i]) violated(what, i);
        };
        // Guards: before every region, and after the last one.
        for (const Region* r : {&s.writable, &s.local, &s.read_only, &s.source})
            unchanged(r->offset - kGuard, kGuard, "guard bytes before a region");
        unchanged(s.arena.size() - kGuard, kGuard, "guard bytes after the last region");
        unchanged(s.read_only.offset, s.read_only.length, "remote-read-only region written");
        unchanged(s.source.offset, s.source.length, "send source region written");
        // The local-only region: only receive buffers and READ destinations may change.
        size_t from = 0;
        for (const Slice& sl : kLocalSlices) {
            unchanged(s.local.offset + from, sl.offset - from,
                      "local region written outside its work requests' buffers");
            from = sl.offset + sl.length;
        }
        unchanged(s.local.offset + from, kLocalBytes - from,
                  "local region written outside its work requests' buffers");

        const bool is_a = &s == &a_;
        std::array<Completion, 64> buf;
        std::set<uint64_t> seen;
        for (int round = 0; round < 100; ++round) {
            const size_t n = s.scq->poll(buf);
            if (n == 0) break;
            for (size_t i = 0; i < n; ++i) {
                const Completion& c = buf[i];
                const auto needed = s.needed_psn.find(c.wr_id);
                if (needed == s.needed_psn.end())
                    violated("send completion for a WQE never posted", c.wr_id);
                if (!seen.insert(c.wr_id).second) violated("send WQE completed twice", c.wr_id);
                if (c.status > WcStatus::GeneralErr)
                    violated("invalid status", static_cast<size_t>(c.status));
                // No peer can have answered a request that never went out.
                if (c.status == WcStatus::Success) {
                    std::lock_guard lock(s.sent_mutex);
                    if (!s.sent_psns.contains(needed->second))
                        violated("send WQE completed successfully before its request was sent",
                                 c.wr_id);
                }
            }
        }
        seen.clear();
        for (int round = 0; round < 100; ++round) {
            const size_t n = s.rcq->poll(buf);
            if (n == 0) break;
            for (size_t i = 0; i < n; ++i) {
                const Completion& c = buf[i];
                auto it = recv_lengths_[is_a].find(c.wr_id);
                if (it == recv_lengths_[is_a].end())
                    violated("receive completion for a WQE never posted", c.wr_id);
                if (!seen.insert(c.wr_id).second) violated("receive WQE completed twice", c.wr_id);
                if (c.status > WcStatus::GeneralErr)
                    violated("invalid status", static_cast<size_t>(c.status));
                if (c.status == WcStatus::Success && c.byte_len > it->second)
                    violated("receive longer than its buffers", c.byte_len);
            }
        }
    }

    struct Anchor {
        bool set = false;
        uint32_t psn = 0;
    };

    uint16_t port_ = 0;
    Side a_;
    Side b_;
    std::array<std::array<Anchor, 2>, 2> anchors_{};            // [to B][response]
    std::array<std::map<uint64_t, uint32_t>, 2> recv_lengths_;  // [is A] wr_id -> bytes
    std::vector<uint8_t> scratch_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // Never destroyed: the engines' threads keep running until the process exits.
    static Harness* harness = new Harness;
    harness->run(data, size);
    return 0;
}
