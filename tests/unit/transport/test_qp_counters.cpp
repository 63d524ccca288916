// QP counters (qp_counters.h): the shared table file marks the blocks QPs took, so that a
// reader lists exactly the QPs that existed; a file of another layout is started afresh by a
// writer and refused by a reader; and two engines count NAKs by kind, duplicates and injected
// faults into their QPs' blocks, in step with the engines' own counters.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/unit/transport/engine_pair.h"
#include "tests/unit/transport/scratch_dir.h"
#include "transport/qp_counters.h"

using namespace uroce::transport;
using namespace uroce::transport::test;

namespace {

// Each test's table in a directory of its own (scratch_dir.h).
std::string table_path() {
    return (test::scratch_dir("uroce-qpcounters") / "counters.qp.5").string();
}

std::unique_ptr<QpCounterTable> open_table(const std::string& path) {
    std::string error;
    auto t = QpCounterTable::open_shared(path, error);
    INFO(error);
    REQUIRE(t);
    return t;
}

std::vector<QpCounterTable::Entry> read_all(const std::string& path) {
    std::vector<QpCounterTable::Entry> out;
    std::string error;
    const bool ok = QpCounterTable::read_all(path, out, error);
    INFO(error);
    REQUIRE(ok);
    return out;
}

}  // namespace

TEST_CASE("QP table: readers list exactly the blocks QPs took, with their QPNs", "[qp_counters]") {
    const std::string path = table_path();
    auto t = open_table(path);
    CHECK(read_all(path).empty());  // a new table: no QP yet

    const uint32_t q1 = 5u << 12 | 0x123, q2 = 5u << 12 | 0x7;
    t->for_qpn(q1).claim(q1);
    t->for_qpn(q2).claim(q2);
    bump(t->for_qpn(q1).tx_packets, 3);
    bump(t->for_qpn(q1).tx_faults, 2);
    bump(t->for_qpn(q2).rx_seq_naks);

    const auto all = read_all(path);
    REQUIRE(all.size() == 2);
    CHECK(all[0].qpn == q2);  // by index
    CHECK(all[0].values.rx_seq_naks == 1);
    CHECK(all[0].values.tx_packets == 0);
    CHECK(all[1].qpn == q1);
    CHECK(all[1].values.tx_packets == 3);
    CHECK(all[1].values.tx_faults == 2);

    QpCounterValues v;
    bool owned = false;
    std::string error;
    REQUIRE(QpCounterTable::read(path, q1, v, owned, error));
    CHECK(owned);
    CHECK(v.tx_packets == 3);
    REQUIRE(QpCounterTable::read(path, 5u << 12 | 0x124, v, owned, error));
    CHECK_FALSE(owned);  // never taken
    CHECK(v.tx_packets == 0);

    // A new QP of the same number starts from zero; the figures stay after the table goes.
    t->for_qpn(q1).claim(q1);
    bump(t->for_qpn(q1).rx_packets);
    t.reset();
    const auto again = read_all(path);
    REQUIRE(again.size() == 2);
    CHECK(again[1].values.tx_packets == 0);
    CHECK(again[1].values.rx_packets == 1);

    // A context that takes the slot later keeps what was there (the QPs of its predecessor).
    auto t2 = open_table(path);
    CHECK(read_all(path).size() == 2);
}

TEST_CASE("QP table: a file of another layout is refused by readers, restarted by writers",
          "[qp_counters]") {
    const std::string path = table_path();
    {
        // A version 1 table: magic "uroecqp1", 128-byte blocks, no owner word; block 3 full
        // of non-zero figures that must never show as a QP's.
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
        REQUIRE(fd >= 0);
        const uint64_t header[2] = {0x31707163656f7275ull, 0x1234};
        REQUIRE(::pwrite(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header));
        std::vector<uint64_t> junk(32, 0x0101010101010101ull);
        REQUIRE(::pwrite(fd, junk.data(), junk.size() * 8, 4096 + 3 * 128) ==
                static_cast<ssize_t>(junk.size() * 8));
        REQUIRE(::ftruncate(fd, 4096 + 4096 * 128) == 0);
        ::close(fd);
    }
    std::vector<QpCounterTable::Entry> out;
    std::string error;
    CHECK_FALSE(QpCounterTable::read_all(path, out, error));
    CHECK_THAT(error, Catch::Matches(".*(is not a QP counters file|written by a uroce with other "
                                     "QP counters).*"));

    auto t = open_table(path);  // started afresh
    CHECK(read_all(path).empty());
    for (uint32_t i = 0; i < 8; ++i) CHECK(t->for_qpn(i).tx_packets.load() == 0);
    CHECK(std::filesystem::file_size(path) ==
          4096 + QpCounterTable::kQps * QpCounterTable::kStride);
}

TEST_CASE("QP counters: NAKs by kind, duplicates and injected faults, in step with the engine",
          "[qp_counters][faults]") {
    PairOptions o;
    o.mem_bytes = 128 * 1024;
    o.faults_a.drop = 0.05;  // a's requests (and ACKs) lost: b NAKs and sees duplicates
    o.faults_a.seed = 77;
    Pair p(o);
    p.connect();
    constexpr uint32_t kWrite = 24 * kMtu + 100;
    for (int i = 0; i < 8; ++i) {
        INFO("round " << i);
        fill(p.a.at(0), kWrite, 500 + static_cast<uint64_t>(i));
        REQUIRE(p.a.qp->post_send(rdma_wqe(SendOpcode::RdmaWrite, 1, {p.a.sge(0, kWrite)}, p.b.iova,
                                           p.b.keys.rkey)) == 0);
        REQUIRE(p.wait_one(*p.a.scq).status == WcStatus::Success);
        CHECK(first_mismatch(p.b.at(0), kWrite, 500 + static_cast<uint64_t>(i)) == kWrite);
    }
    QpCounters& qa = p.a.engine->qp_counters(p.a.qp->qpn());
    QpCounters& qb = p.b.engine->qp_counters(p.b.qp->qpn());
    // Each engine has one QP: its counters are the engine's.
    CHECK(qa.tx_faults.load() == p.a.counters().tx_dropped_fault.load());
    CHECK(qa.tx_faults.load() > 0);
    CHECK(qb.tx_faults.load() == 0);
    CHECK(qb.tx_seq_naks.load() == p.b.counters().tx_seq_naks.load());
    CHECK(qb.tx_seq_naks.load() > 0);
    CHECK(qb.tx_naks.load() ==
          qb.tx_seq_naks.load() + qb.tx_rnr_naks.load() + qb.tx_other_naks.load());
    CHECK(qb.rx_duplicate.load() == p.b.counters().rx_duplicate.load());
    CHECK(qa.rx_naks.load() == p.a.counters().rx_naks.load());
    CHECK(qa.rx_naks.load() ==
          qa.rx_seq_naks.load() + qa.rx_rnr_naks.load() + qa.rx_other_naks.load());
    CHECK(qa.rx_rnr_naks.load() == 0);
    CHECK(qa.rx_other_naks.load() == 0);
    // b injects nothing, and loopback loses nothing: each NAK b sent reaches a, inside a's
    // window (it names a PSN a still waits an ACK for, and the ACKs come after it).
    CHECK(p.wait_until([&] { return qa.rx_seq_naks.load() == qb.tx_seq_naks.load(); }));
    CHECK(qa.rx_wrong_peer.load() == 0);
}
