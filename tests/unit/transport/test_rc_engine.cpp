// The RC transport end to end without libibverbs: two Engines on two loopback addresses,
// one RcQp on each (see engine_pair.h).
#include <catch2/catch.hpp>

#include "tests/unit/transport/engine_pair.h"

using namespace uroce::transport;
using uroce::IpAddress;
using namespace uroce::transport::test;
using namespace std::chrono_literals;

TEST_CASE("RC engine: SEND to a posted receive", "[rc]") {
    Pair p;
    p.connect();

    SECTION("three packets, gathered from two SGEs, scattered to two") {
        fill(p.a.at(100), 3000, 1);
        // The receive buffer: 1000 bytes, then 4000 bytes elsewhere.
        REQUIRE(p.b.qp->post_recv(recv_wqe(77, {p.b.sge(0, 1000), p.b.sge(8192, 4000)})) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(5, {p.a.sge(100, 1700), p.a.sge(1800, 1300)})) == 0);

        const Completion r = p.wait_one(*p.b.rcq);
        CHECK(r.status == WcStatus::Success);
        CHECK(r.wr_id == 77);
        CHECK(r.opcode == WcOpcode::Recv);
        CHECK(r.byte_len == 3000);
        CHECK(r.qp_num == p.b.qp->qpn());
        CHECK(r.src_qp == p.a.qp->qpn());
        CHECK_FALSE(r.with_imm);
        CHECK_FALSE(r.solicited);

        const Completion s = p.wait_one(*p.a.scq);
        CHECK(s.status == WcStatus::Success);
        CHECK(s.wr_id == 5);
        CHECK(s.opcode == WcOpcode::Send);
        CHECK(s.qp_num == p.a.qp->qpn());

        // Byte for byte: the first 1000 in the first SGE, the rest at the second.
        std::vector<uint8_t> got(p.b.at(0), p.b.at(1000));
        got.insert(got.end(), p.b.at(8192), p.b.at(8192 + 2000));
        CHECK(first_mismatch(got.data(), got.size(), 1) == 3000);
        CHECK(all_bytes(p.b.at(1000), 8192 - 1000, kUntouched));
        CHECK(all_bytes(p.b.at(8192 + 2000), 2000, kUntouched));
        CHECK(p.stays_empty(*p.a.rcq));
        CHECK(p.stays_empty(*p.b.scq));
    }

    SECTION("inline, with immediate data, solicited") {
        SendWqe w;
        w.wr_id = 9;
        w.opcode = SendOpcode::SendWithImm;
        w.is_inline = true;
        w.solicited = true;
        w.length = 200;
        fill(w.inline_data.data(), 200, 2);
        w.imm = 0x12345678;
        REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 4096)})) == 0);
        REQUIRE(p.a.qp->post_send(w) == 0);

        const Completion r = p.wait_one(*p.b.rcq);
        CHECK(r.status == WcStatus::Success);
        CHECK(r.byte_len == 200);
        CHECK(r.with_imm);
        CHECK(r.imm == 0x12345678);
        CHECK(r.solicited);
        CHECK(first_mismatch(p.b.at(0), 200, 2) == 200);
        CHECK(all_bytes(p.b.at(200), 100, kUntouched));
        CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    }

    SECTION("zero-length, unsignaled, and messages of exactly one and two MTUs, in order") {
        fill(p.a.at(0), 4 * kMtu, 3);
        for (uint64_t i = 0; i < 4; ++i)
            REQUIRE(p.b.qp->post_recv(recv_wqe(100 + i, {p.b.sge(i * 4096, 4096)})) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(1, {})) == 0);
        SendWqe quiet = send_wqe(2, {p.a.sge(0, kMtu)});
        quiet.signaled = false;
        REQUIRE(p.a.qp->post_send(quiet) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(3, {p.a.sge(0, 2 * kMtu)})) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(4, {p.a.sge(0, 2 * kMtu + 1)})) == 0);

        const auto r = p.wait(*p.b.rcq, 4);
        REQUIRE(r.size() == 4);
        const uint32_t lengths[] = {0, kMtu, 2 * kMtu, 2 * kMtu + 1};
        for (size_t i = 0; i < 4; ++i) {
            INFO("receive " << i);
            CHECK(r[i].status == WcStatus::Success);
            CHECK(r[i].wr_id == 100 + i);
            CHECK(r[i].byte_len == lengths[i]);
            CHECK(first_mismatch(p.b.at(i * 4096), lengths[i], 3) == lengths[i]);
            CHECK(p.b.at(i * 4096)[lengths[i]] == kUntouched);
        }
        // The unsignaled SEND completes silently.
        const auto s = p.wait(*p.a.scq, 3);
        REQUIRE(s.size() == 3);
        CHECK(s[0].wr_id == 1);
        CHECK(s[1].wr_id == 3);
        CHECK(s[2].wr_id == 4);
        for (const Completion& c : s) CHECK(c.status == WcStatus::Success);
        CHECK(p.stays_empty(*p.a.scq));
    }

    SECTION("both directions at once") {
        fill(p.a.at(0), 5000, 4);
        fill(p.b.at(0), 6000, 5);
        REQUIRE(p.a.qp->post_recv(recv_wqe(1, {p.a.sge(16384, 8000)})) == 0);
        REQUIRE(p.b.qp->post_recv(recv_wqe(2, {p.b.sge(16384, 8000)})) == 0);
        REQUIRE(p.a.qp->post_send(send_wqe(3, {p.a.sge(0, 5000)})) == 0);
        REQUIRE(p.b.qp->post_send(send_wqe(4, {p.b.sge(0, 6000)})) == 0);
        const Completion ra = p.wait_one(*p.a.rcq);
        const Completion rb = p.wait_one(*p.b.rcq);
        CHECK(ra.status == WcStatus::Success);
        CHECK(ra.byte_len == 6000);
        CHECK(rb.status == WcStatus::Success);
        CHECK(rb.byte_len == 5000);
        CHECK(first_mismatch(p.a.at(16384), 6000, 5) == 6000);
        CHECK(first_mismatch(p.b.at(16384), 5000, 4) == 5000);
        CHECK(p.wait_one(*p.a.scq).wr_id == 3);
        CHECK(p.wait_one(*p.b.scq).wr_id == 4);
    }
}

TEST_CASE("RC engine: a request waits for a late receive (RNR)", "[rc]") {
    Pair p;
    p.connect();
    fill(p.a.at(0), 2500, 6);
    SendWqe w = send_wqe(1, {p.a.sge(0, 2500)});
    WcOpcode expected = WcOpcode::Recv;
    SECTION("SEND") {}
    SECTION("multi-packet WRITE with immediate data: only its last packet needs a receive") {
        w = rdma_wqe(SendOpcode::RdmaWriteWithImm, 1, {p.a.sge(0, 2500)}, p.b.iova, p.b.keys.rkey);
        w.imm = 0x600d;
        expected = WcOpcode::RecvRdmaWithImm;
    }
    REQUIRE(p.a.qp->post_send(w) == 0);
    // The responder has nothing posted: it answers RNR NAKs until it has.
    REQUIRE(p.wait_until([&] { return p.b.counters().tx_rnr_naks.load() > 0; }));
    CHECK(p.a.scq->depth() == 0);
    REQUIRE(p.b.qp->post_recv(recv_wqe(2, {p.b.sge(8192, 4096)})) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.wr_id == 2);
    CHECK(r.opcode == expected);
    CHECK(r.byte_len == 2500);
    const size_t at = expected == WcOpcode::Recv ? 8192 : 0;
    CHECK(first_mismatch(p.b.at(at), 2500, 6) == 2500);
    if (expected == WcOpcode::RecvRdmaWithImm) {
        CHECK(r.with_imm);
        CHECK(r.imm == 0x600d);
        CHECK(all_bytes(p.b.at(8192), 4096, kUntouched));
    }
    const Completion s = p.wait_one(*p.a.scq);
    CHECK(s.status == WcStatus::Success);
    CHECK(s.wr_id == 1);
    CHECK(p.a.counters().rx_naks.load() > 0);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);
}

TEST_CASE("RC engine: RNR retry exhaustion", "[rc]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.rnr_retry = 2;
    p.connect(attrs, default_attributes());
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(0, 100)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(2, {p.a.sge(0, 100)})) == 0);
    const auto s = p.wait(*p.a.scq, 2);
    REQUIRE(s.size() == 2);
    CHECK(s[0].wr_id == 1);
    CHECK(s[0].status == WcStatus::RnrRetryExcErr);
    CHECK(s[1].wr_id == 2);
    CHECK(s[1].status == WcStatus::WrFlushErr);
    CHECK(p.a.qp->state() == QpState::Err);
    // The first try and two retries, each answered by an RNR NAK; NAKs that arrive after
    // the requester gave up are not counted by it.
    CHECK(p.a.counters().rx_naks.load() == 3);
    CHECK(p.b.counters().tx_rnr_naks.load() >= 3);
    // The responder is not at fault and stays up.
    CHECK(p.b.qp->state() == QpState::Rts);
}

TEST_CASE("RC engine: RDMA WRITE", "[rc]") {
    Pair p;
    p.connect();

    SECTION("multi-packet, to a remote iova different from the address") {
        fill(p.a.at(0), 5000, 7);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 11,
                                           {p.a.sge(0, 2000), p.a.sge(2000, 3000)},
                                           p.b.iova + 10000, p.b.keys.rkey)) == 0);
        const Completion s = p.wait_one(*p.a.scq);
        CHECK(s.status == WcStatus::Success);
        CHECK(s.wr_id == 11);
        CHECK(s.opcode == WcOpcode::RdmaWrite);
        CHECK(s.qp_num == p.a.qp->qpn());
        CHECK(first_mismatch(p.b.at(10000), 5000, 7) == 5000);
        CHECK(all_bytes(p.b.at(0), 10000, kUntouched));
        CHECK(all_bytes(p.b.at(15000), p.b.mem.size() - 15000, kUntouched));
        // A WRITE consumes no receive and completes nothing at the responder.
        CHECK(p.stays_empty(*p.b.rcq));
        CHECK(p.b.scq->depth() == 0);
    }

    SECTION("with immediate data, to the last bytes of the region") {
        const size_t end = p.b.mem.size();
        fill(p.a.at(0), 3 * kMtu, 8);
        REQUIRE(p.b.qp->post_recv(recv_wqe(5, {})) == 0);
        SendWqe w = rdma_wqe(SendOpcode::RdmaWriteWithImm, 12, {p.a.sge(0, 3 * kMtu)},
                             p.b.iova + end - 3 * kMtu, p.b.keys.rkey);
        w.imm = 0xcafef00d;
        REQUIRE(p.a.qp->post_send(w) == 0);
        const Completion r = p.wait_one(*p.b.rcq);
        CHECK(r.status == WcStatus::Success);
        CHECK(r.wr_id == 5);
        CHECK(r.opcode == WcOpcode::RecvRdmaWithImm);
        CHECK(r.byte_len == 3 * kMtu);
        CHECK(r.with_imm);
        CHECK(r.imm == 0xcafef00d);
        CHECK(first_mismatch(p.b.at(end - 3 * kMtu), 3 * kMtu, 8) == 3 * kMtu);
        CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    }

    SECTION("many, back to back, in order") {
        fill(p.a.at(0), 32 * 1024, 9);
        for (uint64_t i = 0; i < 32; ++i) {
            REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, i, {p.a.sge(i * 1024, 1024)},
                                               p.b.iova + 32768 + i * 1024, p.b.keys.rkey)) == 0);
        }
        const auto s = p.wait(*p.a.scq, 32);
        REQUIRE(s.size() == 32);
        for (uint64_t i = 0; i < 32; ++i) {
            CHECK(s[i].wr_id == i);
            CHECK(s[i].status == WcStatus::Success);
        }
        CHECK(first_mismatch(p.b.at(32768), 32 * 1024, 9) == 32 * 1024);
    }
}

TEST_CASE("RC engine: RDMA READ", "[rc]") {
    Pair p;
    p.connect();

    SECTION("multi-packet, scattered to two SGEs") {
        fill(p.b.at(20000), 5000, 10);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 21,
                                           {p.a.sge(0, 1000), p.a.sge(4096, 4000)},
                                           p.b.iova + 20000, p.b.keys.rkey)) == 0);
        const Completion s = p.wait_one(*p.a.scq);
        CHECK(s.status == WcStatus::Success);
        CHECK(s.wr_id == 21);
        CHECK(s.opcode == WcOpcode::RdmaRead);
        CHECK(s.byte_len == 5000);
        std::vector<uint8_t> got(p.a.at(0), p.a.at(1000));
        got.insert(got.end(), p.a.at(4096), p.a.at(4096 + 4000));
        CHECK(first_mismatch(got.data(), got.size(), 10) == 5000);
        CHECK(all_bytes(p.a.at(1000), 4096 - 1000, kUntouched));
        CHECK(all_bytes(p.a.at(8096), 1000, kUntouched));
        // The responder's memory is unchanged and it completes nothing.
        CHECK(first_mismatch(p.b.at(20000), 5000, 10) == 5000);
        CHECK(p.stays_empty(*p.b.rcq));
    }

    SECTION("several READs and WRITEs interleaved complete in order") {
        fill(p.b.at(0), 16384, 11);
        fill(p.a.at(32768), 16384, 12);
        uint64_t id = 0;
        for (uint64_t i = 0; i < 4; ++i) {
            REQUIRE(
                p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, id++, {p.a.sge(i * 4096, 4096)},
                                           p.b.iova + i * 4096, p.b.keys.rkey)) == 0);
            REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, id++,
                                               {p.a.sge(32768 + i * 4096, 4096)},
                                               p.b.iova + 32768 + i * 4096, p.b.keys.rkey)) == 0);
        }
        const auto s = p.wait(*p.a.scq, 8);
        REQUIRE(s.size() == 8);
        for (uint64_t i = 0; i < 8; ++i) {
            CHECK(s[i].wr_id == i);
            CHECK(s[i].status == WcStatus::Success);
            CHECK(s[i].opcode == (i % 2 == 0 ? WcOpcode::RdmaRead : WcOpcode::RdmaWrite));
        }
        CHECK(first_mismatch(p.a.at(0), 16384, 11) == 16384);
        CHECK(first_mismatch(p.b.at(32768), 16384, 12) == 16384);
    }

    SECTION("zero bytes, READ and WRITE") {
        REQUIRE(p.a.qp->post_send(
                    rdma_wqe(SendOpcode::RdmaRead, 1, {}, p.b.iova + 5, p.b.keys.rkey)) == 0);
        REQUIRE(p.a.qp->post_send(
                    rdma_wqe(SendOpcode::RdmaWrite, 2, {}, p.b.iova + 5, p.b.keys.rkey)) == 0);
        const auto s = p.wait(*p.a.scq, 2);
        REQUIRE(s.size() == 2);
        CHECK(s[0].wr_id == 1);
        CHECK(s[0].status == WcStatus::Success);
        CHECK(s[0].opcode == WcOpcode::RdmaRead);
        CHECK(s[0].byte_len == 0);
        CHECK(s[1].wr_id == 2);
        CHECK(s[1].status == WcStatus::Success);
        CHECK(all_bytes(p.a.at(0), p.a.mem.size(), kUntouched));
        CHECK(all_bytes(p.b.at(0), p.b.mem.size(), kUntouched));
    }

    SECTION("one byte") {
        p.b.at(777)[0] = 0x5a;
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 1, {p.a.sge(3, 1)}, p.b.iova + 777,
                                           p.b.keys.rkey)) == 0);
        const Completion s = p.wait_one(*p.a.scq);
        CHECK(s.status == WcStatus::Success);
        CHECK(s.byte_len == 1);
        CHECK(p.a.at(3)[0] == 0x5a);
        CHECK(p.a.at(2)[0] == kUntouched);
        CHECK(p.a.at(4)[0] == kUntouched);
    }
}

TEST_CASE("RC engine: remote access errors", "[rc]") {
    Pair p;
    QpAttributes attrs_b = default_attributes();
    SendOpcode op = SendOpcode::RdmaWrite;
    uint64_t remote = p.b.iova + 1000;
    uint32_t rkey = p.b.keys.rkey;
    uint32_t length = 2000;

    SECTION("unknown rkey") {
        rkey = p.b.keys.rkey + 0x100;
    }
    SECTION("lkey used as rkey") {
        rkey = p.b.keys.lkey;
    }
    SECTION("one byte past the region") {
        remote = p.b.iova + p.b.mem.size() - length + 1;
    }
    SECTION("one byte before the region") {
        remote = p.b.iova - 1;
    }
    SECTION("deregistered region") {
        REQUIRE(p.b.engine->memory().remove(p.b.keys.lkey));
    }
    SECTION("region without remote write") {
        rkey =
            p.b.engine->memory().add(kPd, p.b.addr(0), p.b.mem.size(), p.b.iova, kRemoteRead).rkey;
    }
    SECTION("region of another protection domain") {
        rkey = p.b.engine->memory()
                   .add(kPd + 1, p.b.addr(0), p.b.mem.size(), p.b.iova, kRemoteWrite)
                   .rkey;
    }
    SECTION("QP without remote write") {
        attrs_b.access = kRemoteRead;
    }
    SECTION("READ from a region without remote read") {
        op = SendOpcode::RdmaRead;
        rkey =
            p.b.engine->memory().add(kPd, p.b.addr(0), p.b.mem.size(), p.b.iova, kRemoteWrite).rkey;
    }
    SECTION("READ from a QP without remote read") {
        op = SendOpcode::RdmaRead;
        attrs_b.access = kRemoteWrite;
    }
    SECTION("READ past the region") {
        op = SendOpcode::RdmaRead;
        remote = p.b.iova + p.b.mem.size() - 1;
    }

    p.connect(default_attributes(), attrs_b);
    INFO((op == SendOpcode::RdmaRead ? "READ" : "WRITE")
         << " remote " << std::hex << remote << " rkey " << rkey << " (region " << p.b.iova
         << " rkey " << p.b.keys.rkey << ") QP access " << attrs_b.access);
    if (op == SendOpcode::RdmaWrite) fill(p.a.at(0), length, 13);
    REQUIRE(p.b.qp->post_recv(recv_wqe(50, {p.b.sge(40000, 4096)})) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(op, 1, {p.a.sge(0, length)}, remote, rkey)) == 0);
    // Posted behind the bad request before its NAK can have come back: flushed.
    REQUIRE(p.a.qp->post_send(send_wqe(2, {p.a.sge(0, 10)})) == 0);

    const auto s = p.wait(*p.a.scq, 2);
    REQUIRE(s.size() == 2);
    CHECK(s[0].wr_id == 1);
    CHECK(s[0].status == WcStatus::RemAccessErr);
    CHECK(s[1].wr_id == 2);
    CHECK(s[1].status == WcStatus::WrFlushErr);
    CHECK(p.a.qp->state() == QpState::Err);

    // The responder went to ERR too, flushing its receive, and said why.
    CHECK(p.wait_until([&] { return p.b.qp->state() == QpState::Err; }));
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.wr_id == 50);
    CHECK(r.status == WcStatus::WrFlushErr);
    CHECK(r.opcode == WcOpcode::Recv);
    CHECK(has_event(p.b, AsyncEventType::QpAccessError));
    CHECK(p.b.counters().tx_access_naks.load() == 1);
    CHECK(p.a.counters().rx_naks.load() >= 1);

    // No byte reached the responder's memory, none came back to the requester.
    CHECK(all_bytes(p.b.at(0), 40000, kUntouched));
    if (op == SendOpcode::RdmaWrite) CHECK(first_mismatch(p.a.at(0), length, 13) == length);
    if (op == SendOpcode::RdmaRead) CHECK(all_bytes(p.a.at(0), length, kUntouched));

    // Work posted to a QP in ERR is flushed at once.
    REQUIRE(p.a.qp->post_send(send_wqe(3, {p.a.sge(0, 10)})) == 0);
    const Completion f = p.wait_one(*p.a.scq);
    CHECK(f.wr_id == 3);
    CHECK(f.status == WcStatus::WrFlushErr);
    CHECK(p.stays_empty(*p.a.scq));
}

TEST_CASE("RC engine: retry exhaustion when the peer QP is gone", "[rc]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 8;  // about 1 ms
    attrs.retry_cnt = 1;
    p.connect(attrs, default_attributes());
    p.b.engine->detach(p.b.qp->qpn());

    fill(p.a.at(0), 3000, 14);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(0, 3000)})) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 2, {p.a.sge(0, 100)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    const auto s = p.wait(*p.a.scq, 2);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    REQUIRE(s.size() == 2);
    CHECK(s[0].wr_id == 1);
    CHECK(s[0].status == WcStatus::RetryExcErr);
    CHECK(s[0].opcode == WcOpcode::Send);
    CHECK(s[1].wr_id == 2);
    CHECK(s[1].status == WcStatus::WrFlushErr);
    CHECK(p.a.qp->state() == QpState::Err);
    // The first try and one retry, each timed out.
    CHECK(p.a.counters().retransmit_timeouts.load() == 2);
    CHECK(p.a.counters().retransmitted_packets.load() >= 1);
    CHECK(p.b.counters().rx_unknown_qp.load() >= 2);
    // Two timeouts of ~1 ms: well under a second even on a slow machine.
    CHECK(elapsed >= 2ms);
    CHECK(elapsed < 5s);
}

TEST_CASE("RC engine: modify to ERR flushes every posted work request", "[rc]") {
    Pair p;
    QpAttributes attrs = default_attributes();
    attrs.timeout = 22;  // 17 s: no retransmission timeout during the test
    p.connect(attrs, default_attributes());
    // Nobody answers: everything stays outstanding.
    p.b.engine->detach(p.b.qp->qpn());

    for (uint64_t i = 0; i < 4; ++i)
        REQUIRE(p.a.qp->post_recv(recv_wqe(100 + i, {p.a.sge(8192 + i * 1024, 1024)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(0, 3000)})) == 0);
    SendWqe quiet = send_wqe(2, {p.a.sge(0, 10)});
    quiet.signaled = false;
    REQUIRE(p.a.qp->post_send(quiet) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 3, {p.a.sge(0, 100)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 4, {p.a.sge(0, 100)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    // Behind the READ (max_rd_atomic 1), not yet sent.
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 5, {p.a.sge(0, 100)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(6, {p.a.sge(0, 10)})) == 0);
    // SEND (3 packets), SEND, WRITE, READ go out; the second READ waits for the first.
    REQUIRE(p.wait_until([&] { return p.b.counters().rx_unknown_qp.load() >= 6; }));
    CHECK(p.a.scq->depth() == 0);
    CHECK(p.a.rcq->depth() == 0);

    REQUIRE(p.a.qp->modify(p.a.qp->attributes(), QpState::Rts, QpState::Err) == 0);
    CHECK(p.a.qp->state() == QpState::Err);

    // Every work request, the unsignaled one too, completes flushed and in order.
    const auto s = p.wait(*p.a.scq, 6);
    REQUIRE(s.size() == 6);
    const WcOpcode ops[] = {WcOpcode::Send,     WcOpcode::Send,     WcOpcode::RdmaWrite,
                            WcOpcode::RdmaRead, WcOpcode::RdmaRead, WcOpcode::Send};
    for (uint64_t i = 0; i < 6; ++i) {
        INFO("send " << i);
        CHECK(s[i].wr_id == i + 1);
        CHECK(s[i].status == WcStatus::WrFlushErr);
        CHECK(s[i].opcode == ops[i]);
        CHECK(s[i].qp_num == p.a.qp->qpn());
    }
    const auto r = p.wait(*p.a.rcq, 4);
    REQUIRE(r.size() == 4);
    for (uint64_t i = 0; i < 4; ++i) {
        CHECK(r[i].wr_id == 100 + i);
        CHECK(r[i].status == WcStatus::WrFlushErr);
        CHECK(r[i].opcode == WcOpcode::Recv);
    }
    CHECK(all_bytes(p.a.at(8192), 4096, kUntouched));

    // In ERR, new work is flushed at once; nothing is sent.
    const uint64_t sent = p.a.counters().tx_packets.load();
    REQUIRE(p.a.qp->post_send(send_wqe(7, {p.a.sge(0, 10)})) == 0);
    REQUIRE(p.a.qp->post_recv(recv_wqe(8, {p.a.sge(0, 10)})) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::WrFlushErr);
    CHECK(p.wait_one(*p.a.rcq).status == WcStatus::WrFlushErr);
    CHECK(p.stays_empty(*p.a.scq));
    CHECK(p.a.rcq->depth() == 0);
    CHECK(p.a.counters().tx_packets.load() == sent);

    // Back to RESET, nothing can be posted.
    REQUIRE(p.a.qp->modify(p.a.qp->attributes(), QpState::Err, QpState::Reset) == 0);
    CHECK(p.a.qp->state() == QpState::Reset);
    CHECK(p.a.qp->post_send(send_wqe(9, {p.a.sge(0, 10)})) == EINVAL);
    CHECK(p.a.qp->post_recv(recv_wqe(10, {p.a.sge(0, 10)})) == EINVAL);
    CHECK(p.a.scq->depth() == 0);
    CHECK(p.a.rcq->depth() == 0);
}

TEST_CASE("RC engine: posting in states that take no work, and full queues", "[rc]") {
    PairOptions opt;
    opt.caps.max_send_wr = 2;
    opt.caps.max_recv_wr = 2;
    Pair p(opt);
    // RESET takes nothing; INIT and RTR take receives only.
    CHECK(p.a.qp->post_send(send_wqe(1, {})) == EINVAL);
    CHECK(p.a.qp->post_recv(recv_wqe(1, {})) == EINVAL);
    QpAttributes attrs = default_attributes();
    attrs.dst_ip = p.b.ip;
    attrs.dest_qpn = p.b.qp->qpn();
    REQUIRE(p.a.qp->modify(attrs, QpState::Reset, QpState::Init) == 0);
    CHECK(p.a.qp->post_send(send_wqe(1, {})) == EINVAL);
    CHECK(p.a.qp->post_recv(recv_wqe(1, {})) == 0);
    REQUIRE(p.a.qp->modify(attrs, QpState::Init, QpState::Rtr) == 0);
    CHECK(p.a.qp->post_send(send_wqe(1, {})) == EINVAL);
    CHECK(p.a.qp->post_recv(recv_wqe(2, {})) == 0);
    CHECK(p.a.qp->post_recv(recv_wqe(3, {})) == ENOMEM);
    // A modify that expects the wrong current state is refused.
    CHECK(p.a.qp->modify(attrs, QpState::Init, QpState::Rts) == EINVAL);
    CHECK(p.a.qp->state() == QpState::Rtr);
    CHECK(p.a.scq->depth() == 0);
    CHECK(p.a.rcq->depth() == 0);
}

TEST_CASE("RC engine: PSNs wrap at 2^24", "[rc]") {
    PairOptions opt;
    opt.mem_bytes = 128 * 1024;
    Pair p(opt);
    QpAttributes pa = default_attributes();
    QpAttributes pb = default_attributes();
    pa.sq_psn = 0xfffff0;  // 16 PSNs before the wrap
    pb.sq_psn = 0xfffffa;  // 6 PSNs before the wrap
    p.connect(pa, pb);

    // a -> b: 20 SENDs of two packets each, 40 PSNs across the wrap.
    constexpr size_t kMsg = 2 * kMtu;
    fill(p.a.at(0), 20 * kMsg, 15);
    for (uint64_t i = 0; i < 20; ++i)
        REQUIRE(p.b.qp->post_recv(recv_wqe(i, {p.b.sge(i * kMsg, kMsg)})) == 0);
    for (uint64_t i = 0; i < 20; ++i)
        REQUIRE(p.a.qp->post_send(send_wqe(i, {p.a.sge(i * kMsg, kMsg)})) == 0);

    // b -> a: a 16-packet READ across the wrap, then (fenced, so that it sends what the READ
    // brought) a 16-packet WRITE of the same bytes back to a.
    constexpr size_t kReadFrom = 64 * 1024;  // in a
    constexpr size_t kReadTo = 64 * 1024;    // in b
    constexpr size_t kWriteTo = 96 * 1024;   // in a
    constexpr uint32_t kLen = 16 * kMtu;
    fill(p.a.at(kReadFrom), kLen, 16);
    REQUIRE(p.b.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 100, {p.b.sge(kReadTo, kLen)},
                                       p.a.iova + kReadFrom, p.a.keys.rkey)) == 0);
    SendWqe back = rdma_wqe(SendOpcode::RdmaWrite, 101, {p.b.sge(kReadTo, kLen)},
                            p.a.iova + kWriteTo, p.a.keys.rkey);
    back.fence = true;
    REQUIRE(p.b.qp->post_send(back) == 0);

    const auto r = p.wait(*p.b.rcq, 20);
    REQUIRE(r.size() == 20);
    for (uint64_t i = 0; i < 20; ++i) {
        INFO("message " << i);
        CHECK(r[i].wr_id == i);
        CHECK(r[i].status == WcStatus::Success);
        CHECK(r[i].byte_len == kMsg);
    }
    CHECK(first_mismatch(p.b.at(0), 20 * kMsg, 15) == 20 * kMsg);
    const auto sa = p.wait(*p.a.scq, 20);
    REQUIRE(sa.size() == 20);
    for (uint64_t i = 0; i < 20; ++i) CHECK(sa[i].status == WcStatus::Success);

    const auto sb = p.wait(*p.b.scq, 2);
    REQUIRE(sb.size() == 2);
    CHECK(sb[0].wr_id == 100);
    CHECK(sb[0].status == WcStatus::Success);
    CHECK(sb[0].byte_len == kLen);
    CHECK(sb[1].wr_id == 101);
    CHECK(sb[1].status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(kReadTo), kLen, 16) == kLen);
    CHECK(first_mismatch(p.a.at(kWriteTo), kLen, 16) == kLen);

    // Past the wrap, the connection goes on.
    fill(p.a.at(0), 3000, 17);
    REQUIRE(p.b.qp->post_recv(recv_wqe(200, {p.b.sge(0, 4096)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(200, {p.a.sge(0, 3000)})) == 0);
    const Completion last = p.wait_one(*p.b.rcq);
    CHECK(last.status == WcStatus::Success);
    CHECK(last.byte_len == 3000);
    CHECK(first_mismatch(p.b.at(0), 3000, 17) == 3000);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);
    CHECK(p.a.counters().rx_naks.load() == 0);
    CHECK(p.b.counters().rx_naks.load() == 0);
}

TEST_CASE("RC engine: 200 SENDs of 10 KB arrive intact and in order with 10% loss", "[rc]") {
    constexpr size_t kCount = 200;
    constexpr size_t kSize = 10 * 1024;
    PairOptions opt;
    opt.mem_bytes = kCount * kSize;
    opt.faults_a = FaultConfig{0.1, 1234};
    opt.faults_b = FaultConfig{0.1, 5678};
    Pair p(opt);
    QpAttributes pa = default_attributes();
    QpAttributes pb = default_attributes();
    pa.timeout = 12;  // 17 ms: a lost tail costs little
    pb.timeout = 12;
    uint32_t start_psn = 0x123456;
    SECTION("from an arbitrary PSN") {
        start_psn = 0x123456;
    }
    SECTION("across the PSN wrap") {
        start_psn = 0xfffc00;
    }
    pa.sq_psn = start_psn;
    p.connect(pa, pb);

    for (size_t i = 0; i < kCount; ++i) fill(p.a.at(i * kSize), kSize, 1000 + i);
    for (uint64_t i = 0; i < kCount; ++i)
        REQUIRE(p.b.qp->post_recv(recv_wqe(i, {p.b.sge(i * kSize, kSize)})) == 0);
    for (uint64_t i = 0; i < kCount; ++i)
        REQUIRE(p.a.qp->post_send(send_wqe(i, {p.a.sge(i * kSize, kSize)})) == 0);

    const auto r = p.wait(*p.b.rcq, kCount, 90s);
    INFO("received " << r.size() << " of " << kCount);
    const auto s = p.wait(*p.a.scq, kCount, 30s);
    CHECK(r.size() == kCount);
    CHECK(s.size() == kCount);
    size_t in_order = 0;
    for (size_t i = 0; i < r.size(); ++i) {
        if (r[i].wr_id != i || r[i].status != WcStatus::Success || r[i].byte_len != kSize) break;
        ++in_order;
    }
    CHECK(in_order == kCount);
    size_t intact = 0;
    for (size_t i = 0; i < kCount; ++i)
        intact += first_mismatch(p.b.at(i * kSize), kSize, 1000 + i) == kSize;
    CHECK(intact == kCount);
    size_t sends_ok = 0;
    for (size_t i = 0; i < s.size(); ++i)
        sends_ok += s[i].wr_id == i && s[i].status == WcStatus::Success;
    CHECK(sends_ok == kCount);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);

    const EngineCounters& ca = p.a.counters();
    const EngineCounters& cb = p.b.counters();
    INFO("a: tx " << ca.tx_packets << " dropped " << ca.tx_dropped_fault << " retransmitted "
                  << ca.retransmitted_packets << " timeouts " << ca.retransmit_timeouts << " naks "
                  << ca.rx_naks);
    INFO("b: tx " << cb.tx_packets << " dropped " << cb.tx_dropped_fault << " duplicates "
                  << cb.rx_duplicate << " out of sequence " << cb.rx_out_of_sequence);
    // 2000 request packets at least, about a tenth of them dropped.
    CHECK(ca.tx_dropped_fault.load() > 0);
    CHECK(cb.tx_dropped_fault.load() > 0);
    CHECK(ca.tx_packets.load() + ca.tx_dropped_fault.load() >= kCount * kSize / kMtu);
    // Every dropped request packet was sent again at least once.
    CHECK(ca.retransmitted_packets.load() > 0);
    CHECK(ca.retransmitted_packets.load() >= ca.tx_dropped_fault.load());
    CHECK(cb.rx_out_of_sequence.load() > 0);
    CHECK(ca.tx_errors.load() == 0);
    CHECK(cb.tx_errors.load() == 0);
    CHECK(ca.rx_bad_icrc.load() == 0);
    CHECK(cb.rx_bad_icrc.load() == 0);
}

TEST_CASE("RC engine: READs and WRITEs arrive intact with 10% loss", "[rc]") {
    constexpr size_t kCount = 40;  // of each
    constexpr uint32_t kSize = 10 * 1024;
    constexpr size_t kHalf = kCount * kSize;
    PairOptions opt;
    opt.mem_bytes = 2 * kHalf;
    opt.faults_a = FaultConfig{0.1, 99};
    opt.faults_b = FaultConfig{0.1, 98};
    Pair p(opt);
    QpAttributes pa = default_attributes();
    QpAttributes pb = default_attributes();
    pa.timeout = 12;
    pb.timeout = 12;
    SECTION("one READ outstanding at a time") {
        pa.max_rd_atomic = 1;
    }
    SECTION("four READs outstanding") {
        pa.max_rd_atomic = 4;
        pb.max_dest_rd_atomic = 4;
    }
    p.connect(pa, pb);

    // a reads b[0, kHalf) into a[0, kHalf) and writes a[kHalf, 2 kHalf) to the same place in b.
    for (size_t i = 0; i < kCount; ++i) {
        fill(p.b.at(i * kSize), kSize, 2000 + i);
        fill(p.a.at(kHalf + i * kSize), kSize, 3000 + i);
    }
    uint64_t id = 0;
    for (size_t i = 0; i < kCount; ++i) {
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, id++, {p.a.sge(i * kSize, kSize)},
                                           p.b.iova + i * kSize, p.b.keys.rkey)) == 0);
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, id++,
                                           {p.a.sge(kHalf + i * kSize, kSize)},
                                           p.b.iova + kHalf + i * kSize, p.b.keys.rkey)) == 0);
    }
    const auto s = p.wait(*p.a.scq, 2 * kCount, 90s);
    CHECK(s.size() == 2 * kCount);
    size_t ok = 0;
    for (size_t i = 0; i < s.size(); ++i) ok += s[i].wr_id == i && s[i].status == WcStatus::Success;
    CHECK(ok == 2 * kCount);
    size_t intact_reads = 0;
    size_t intact_writes = 0;
    for (size_t i = 0; i < kCount; ++i) {
        intact_reads += first_mismatch(p.a.at(i * kSize), kSize, 2000 + i) == kSize;
        intact_writes += first_mismatch(p.b.at(kHalf + i * kSize), kSize, 3000 + i) == kSize;
    }
    CHECK(intact_reads == kCount);
    CHECK(intact_writes == kCount);
    CHECK(p.a.qp->state() == QpState::Rts);
    CHECK(p.b.qp->state() == QpState::Rts);
    CHECK(p.a.counters().tx_dropped_fault.load() > 0);
    CHECK(p.b.counters().tx_dropped_fault.load() > 0);
    CHECK(p.a.counters().retransmitted_packets.load() > 0);
    // Lost READ responses make the responder read again.
    CHECK(p.b.counters().rx_duplicate.load() > 0);
}

TEST_CASE("RC engine: local protection errors", "[rc]") {
    Pair p;
    p.connect();
    SendWqe bad;
    SECTION("SEND from an unknown lkey") {
        bad = send_wqe(1, {Sge{p.a.addr(0), 100, p.a.keys.lkey + 0x100}});
    }
    SECTION("SEND with the rkey as lkey") {
        bad = send_wqe(1, {Sge{p.a.addr(0), 100, p.a.keys.rkey}});
    }
    SECTION("SEND past the end of the region") {
        bad = send_wqe(1, {p.a.sge(p.a.mem.size() - 50, 100)});
    }
    SECTION("WRITE whose second SGE is bad") {
        bad = rdma_wqe(SendOpcode::RdmaWrite, 1,
                       {p.a.sge(0, 2000), Sge{p.a.addr(0), 100, p.a.keys.lkey + 0x100}}, p.b.iova,
                       p.b.keys.rkey);
    }
    SECTION("READ into a region without local write") {
        const MemoryKeys ro = p.a.engine->memory().add(kPd, p.a.addr(0), 4096, 0, kRemoteRead);
        bad = rdma_wqe(SendOpcode::RdmaRead, 1, {Sge{p.a.addr(0), 100, ro.lkey}}, p.b.iova,
                       p.b.keys.rkey);
    }
    SECTION("SEND from a region of another protection domain") {
        const MemoryKeys other = p.a.engine->memory().add(kPd + 1, p.a.addr(0), 4096, 0, 0);
        bad = send_wqe(1, {Sge{p.a.addr(0), 100, other.lkey}});
    }
    REQUIRE(p.b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 4096)})) == 0);
    REQUIRE(p.a.qp->post_send(bad) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(2, {p.a.sge(0, 10)})) == 0);
    const auto s = p.wait(*p.a.scq, 2);
    REQUIRE(s.size() == 2);
    CHECK(s[0].wr_id == 1);
    CHECK(s[0].status == WcStatus::LocProtErr);
    CHECK(s[1].wr_id == 2);
    CHECK(s[1].status == WcStatus::WrFlushErr);
    CHECK(p.a.qp->state() == QpState::Err);
    // Nothing of the bad request reached the responder, which is unaffected.
    CHECK(p.stays_empty(*p.b.rcq));
    CHECK(p.b.qp->state() == QpState::Rts);
    CHECK(all_bytes(p.b.at(0), p.b.mem.size(), kUntouched));
}

TEST_CASE("RC engine: receive errors at the responder", "[rc]") {
    Pair p;
    p.connect();
    fill(p.a.at(0), 3000, 20);
    WcStatus requester_status = WcStatus::Success;
    WcStatus responder_status = WcStatus::Success;
    SECTION("SEND longer than the receive buffer") {
        REQUIRE(p.b.qp->post_recv(recv_wqe(7, {p.b.sge(0, 1000), p.b.sge(2000, 1000)})) == 0);
        requester_status = WcStatus::RemInvReqErr;
        responder_status = WcStatus::LocLenErr;
    }
    SECTION("receive buffer with a bad lkey") {
        REQUIRE(p.b.qp->post_recv(recv_wqe(7, {Sge{p.b.addr(0), 4096, 0x12345678}})) == 0);
        requester_status = WcStatus::RemOpErr;
        responder_status = WcStatus::LocProtErr;
    }
    REQUIRE(p.b.qp->post_recv(recv_wqe(8, {p.b.sge(8192, 4096)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(0, 3000)})) == 0);

    const Completion s = p.wait_one(*p.a.scq);
    CHECK(s.wr_id == 1);
    CHECK(s.status == requester_status);
    const auto r = p.wait(*p.b.rcq, 2);
    REQUIRE(r.size() == 2);
    CHECK(r[0].wr_id == 7);
    CHECK(r[0].status == responder_status);
    CHECK(r[1].wr_id == 8);
    CHECK(r[1].status == WcStatus::WrFlushErr);
    CHECK(p.a.qp->state() == QpState::Err);
    CHECK(p.b.qp->state() == QpState::Err);
    // The second receive buffer was never touched, nor anything past the first.
    CHECK(all_bytes(p.b.at(8192), 4096, kUntouched));
    CHECK(all_bytes(p.b.at(3000), 1000, kUntouched));
}

TEST_CASE("RC engine: the first request reaching a QP in RTR establishes it", "[rc]") {
    Pair p;
    QpAttributes pa = default_attributes();
    QpAttributes pb = default_attributes();
    pa.dst_ip = p.b.ip;
    pa.dest_qpn = p.b.qp->qpn();
    pb.dst_ip = p.a.ip;
    pb.dest_qpn = p.a.qp->qpn();
    pa.sq_psn = 0x4242;
    pb.rq_psn = 0x4242;
    REQUIRE(p.a.qp->modify(pa, QpState::Reset, QpState::Init) == 0);
    REQUIRE(p.a.qp->modify(pa, QpState::Init, QpState::Rtr) == 0);
    REQUIRE(p.a.qp->modify(pa, QpState::Rtr, QpState::Rts) == 0);
    REQUIRE(p.b.qp->modify(pb, QpState::Reset, QpState::Init) == 0);
    REQUIRE(p.b.qp->modify(pb, QpState::Init, QpState::Rtr) == 0);

    fill(p.a.at(0), 2000, 21);
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(0, 4096)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(2, {p.a.sge(0, 2000)})) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), 2000, 21) == 2000);
    // A responder in RTR acknowledges too.
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::Success);
    CHECK(has_event(p.b, AsyncEventType::CommEstablished));
    CHECK(p.b.qp->state() == QpState::Rtr);
    // A QP in RTR sends nothing.
    CHECK(p.b.qp->post_send(send_wqe(3, {})) == EINVAL);
}

TEST_CASE("RC engine: SQD finishes started work and starts nothing new", "[rc]") {
    PairOptions opt;
    opt.mem_bytes = 2 * 1024 * 1024;
    Pair p(opt);
    QpAttributes pa = default_attributes();
    pa.sqd_notify = true;
    p.connect(pa, default_attributes());

    constexpr uint32_t kBig = 1024 * 1024;  // more than the send window: still going on
    fill(p.a.at(0), kBig, 22);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kBig)}, p.b.iova,
                                       p.b.keys.rkey)) == 0);
    // modify() takes the whole set of attributes: start from the current ones.
    const QpAttributes current = p.a.qp->attributes();
    CHECK(current.sqd_notify);
    REQUIRE(p.a.qp->modify(current, QpState::Rts, QpState::Sqd) == 0);
    CHECK(p.a.qp->state() == QpState::Sqd);
    fill(p.a.at(kBig), 100, 23);
    REQUIRE(p.b.qp->post_recv(recv_wqe(5, {p.b.sge(kBig, 4096)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(2, {p.a.sge(kBig, 100)})) == 0);

    // The WRITE completes, then the send queue is drained: the SEND was not started.
    const Completion w = p.wait_one(*p.a.scq);
    CHECK(w.wr_id == 1);
    CHECK(w.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), kBig, 22) == kBig);
    CHECK(p.wait_until([&] { return has_event(p.a, AsyncEventType::SqDrained); }));
    CHECK(p.stays_empty(*p.b.rcq));
    CHECK(p.a.scq->depth() == 0);

    // Back in RTS it goes.
    REQUIRE(p.a.qp->modify(current, QpState::Sqd, QpState::Rts) == 0);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.wr_id == 5);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.byte_len == 100);
    CHECK(first_mismatch(p.b.at(kBig), 100, 23) == 100);
    const Completion s = p.wait_one(*p.a.scq);
    CHECK(s.wr_id == 2);
    CHECK(s.status == WcStatus::Success);
}

TEST_CASE("RC engine: messages larger than the send window", "[rc]") {
    constexpr uint32_t kBig = 1024 * 1024 + 123;  // 1025 packets
    PairOptions opt;
    opt.mem_bytes = 4 * 1024 * 1024;
    Pair p(opt);
    p.connect();
    const size_t kSendAt = 0;
    const size_t kWriteAt = 1536 * 1024;
    const size_t kReadAt = 2688 * 1024;
    fill(p.a.at(kSendAt), kBig, 24);
    fill(p.a.at(kWriteAt), kBig, 25);
    fill(p.b.at(kReadAt), kBig, 26);
    REQUIRE(p.b.qp->post_recv(recv_wqe(1, {p.b.sge(kSendAt, kBig)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(1, {p.a.sge(kSendAt, kBig)})) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 2, {p.a.sge(kWriteAt, kBig)},
                                       p.b.iova + kWriteAt, p.b.keys.rkey)) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 3, {p.a.sge(kReadAt, kBig)},
                                       p.b.iova + kReadAt, p.b.keys.rkey)) == 0);
    const auto s = p.wait(*p.a.scq, 3, 60s);
    REQUIRE(s.size() == 3);
    for (uint64_t i = 0; i < 3; ++i) {
        CHECK(s[i].wr_id == i + 1);
        CHECK(s[i].status == WcStatus::Success);
    }
    CHECK(s[2].byte_len == kBig);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.status == WcStatus::Success);
    CHECK(r.byte_len == kBig);
    CHECK(first_mismatch(p.b.at(kSendAt), kBig, 24) == kBig);
    CHECK(first_mismatch(p.b.at(kWriteAt), kBig, 25) == kBig);
    CHECK(first_mismatch(p.a.at(kReadAt), kBig, 26) == kBig);
}

TEST_CASE("RC engine: a full send queue refuses work", "[rc]") {
    PairOptions opt;
    opt.caps.max_send_wr = 3;
    Pair p(opt);
    QpAttributes attrs = default_attributes();
    attrs.timeout = 22;
    p.connect(attrs, default_attributes());
    p.b.engine->detach(p.b.qp->qpn());  // nothing is acknowledged
    for (uint64_t i = 0; i < 3; ++i) REQUIRE(p.a.qp->post_send(send_wqe(i, {})) == 0);
    CHECK(p.a.qp->post_send(send_wqe(3, {})) == ENOMEM);
    CHECK(p.a.scq->depth() == 0);
}

TEST_CASE("RC engine: a QP is usable again after ERR and RESET", "[rc]") {
    Pair p;
    p.connect();
    // Into ERR by a remote access error.
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, 10)}, p.b.iova,
                                       p.b.keys.rkey + 0x100)) == 0);
    CHECK(p.wait_one(*p.a.scq).status == WcStatus::RemAccessErr);
    REQUIRE(p.wait_until([&] { return p.b.qp->state() == QpState::Err; }));

    for (Side* s : {&p.a, &p.b}) {
        REQUIRE(s->qp->modify(s->qp->attributes(), QpState::Err, QpState::Reset) == 0);
        CHECK(s->qp->state() == QpState::Reset);
    }
    QpAttributes pa = default_attributes();
    QpAttributes pb = default_attributes();
    pa.sq_psn = 0xabcdef;
    pb.sq_psn = 0x000100;
    p.connect(pa, pb);

    fill(p.a.at(0), 5000, 27);
    fill(p.b.at(32768), 3000, 28);
    REQUIRE(p.b.qp->post_recv(recv_wqe(10, {p.b.sge(0, 8192)})) == 0);
    REQUIRE(p.a.qp->post_send(send_wqe(11, {p.a.sge(0, 5000)})) == 0);
    REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaRead, 12, {p.a.sge(16384, 3000)},
                                       p.b.iova + 32768, p.b.keys.rkey)) == 0);
    const auto s = p.wait(*p.a.scq, 2);
    REQUIRE(s.size() == 2);
    CHECK(s[0].status == WcStatus::Success);
    CHECK(s[1].status == WcStatus::Success);
    const Completion r = p.wait_one(*p.b.rcq);
    CHECK(r.wr_id == 10);
    CHECK(r.status == WcStatus::Success);
    CHECK(first_mismatch(p.b.at(0), 5000, 27) == 5000);
    CHECK(first_mismatch(p.a.at(16384), 3000, 28) == 3000);
}
