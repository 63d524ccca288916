// CompletionQueue: FIFO order, capacity and overflow reports, and one-shot arming.
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "transport/completion_queue.h"

using namespace uroce::transport;

namespace {

Completion make(uint64_t wr_id, WcStatus status = WcStatus::Success, bool solicited = false) {
    Completion c;
    c.wr_id = wr_id;
    c.status = status;
    c.solicited = solicited;
    c.opcode = WcOpcode::Recv;
    c.byte_len = static_cast<uint32_t>(wr_id * 3);
    c.qp_num = 0x11;
    c.src_qp = 0x22;
    c.imm = static_cast<uint32_t>(wr_id ^ 0xabcd);
    return c;
}

// A CQ that counts its events and overflows.
struct CountingCq {
    std::atomic<int> events{0};
    std::atomic<int> overflows{0};
    CompletionQueue cq;
    explicit CountingCq(uint32_t capacity)
        : cq(
              capacity, [this] { ++events; }, [this] { ++overflows; }) {}
};

size_t poll_all(CompletionQueue& cq, std::vector<Completion>& out) {
    std::array<Completion, 16> buf;
    size_t total = 0;
    for (int i = 0; i < 100000; ++i) {
        const size_t n = cq.poll(buf);
        if (n == 0) break;
        out.insert(out.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
        total += n;
    }
    return total;
}

}  // namespace

TEST_CASE("CompletionQueue is FIFO", "[cq]") {
    CountingCq q(64);
    CHECK(q.cq.capacity() == 64);
    CHECK(q.cq.depth() == 0);
    std::array<Completion, 8> buf;
    CHECK(q.cq.poll(buf) == 0);

    for (uint64_t i = 1; i <= 40; ++i) REQUIRE(q.cq.push(make(i)));
    CHECK(q.cq.depth() == 40);

    // Polls of various sizes see the completions in push order, with all fields intact.
    uint64_t next = 1;
    for (size_t want : {1u, 3u, 8u, 0u, 8u, 8u, 8u, 8u}) {
        const size_t n = q.cq.poll(std::span(buf.data(), want));
        for (size_t i = 0; i < n; ++i) {
            const Completion expected = make(next++);
            CHECK(buf[i].wr_id == expected.wr_id);
            CHECK(buf[i].byte_len == expected.byte_len);
            CHECK(buf[i].imm == expected.imm);
            CHECK(buf[i].qp_num == expected.qp_num);
            CHECK(buf[i].src_qp == expected.src_qp);
            CHECK(buf[i].opcode == WcOpcode::Recv);
            CHECK(buf[i].status == WcStatus::Success);
        }
    }
    CHECK(next == 41);
    CHECK(q.cq.depth() == 0);
    CHECK(q.cq.poll(buf) == 0);
    // Without arming no events.
    CHECK(q.events == 0);
    CHECK(q.overflows == 0);
}

TEST_CASE("CompletionQueue interleaved push and poll keeps order", "[cq]") {
    CountingCq q(4);
    std::vector<Completion> out;
    uint64_t pushed = 0;
    for (int round = 0; round < 100; ++round) {
        for (int i = 0; i < 3; ++i) REQUIRE(q.cq.push(make(++pushed)));
        std::array<Completion, 2> two;
        const size_t n = q.cq.poll(two);
        REQUIRE(n == 2);
        out.insert(out.end(), two.begin(), two.end());
        poll_all(q.cq, out);
    }
    REQUIRE(out.size() == pushed);
    for (size_t i = 0; i < out.size(); ++i) CHECK(out[i].wr_id == i + 1);
    CHECK(q.overflows == 0);
}

TEST_CASE("CompletionQueue capacity and overflow", "[cq]") {
    CountingCq q(8);
    for (uint64_t i = 1; i <= 8; ++i) REQUIRE(q.cq.push(make(i)));
    CHECK(q.cq.depth() == 8);
    CHECK(q.overflows == 0);

    // The first completion that does not fit reports the overrun; further ones do not.
    CHECK_FALSE(q.cq.push(make(9)));
    CHECK(q.overflows == 1);
    for (uint64_t i = 10; i < 20; ++i) CHECK_FALSE(q.cq.push(make(i)));
    CHECK(q.overflows == 1);
    CHECK(q.cq.depth() == 8);

    // What was queued is intact; what overflowed is gone.
    std::vector<Completion> out;
    CHECK(poll_all(q.cq, out) == 8);
    for (size_t i = 0; i < out.size(); ++i) CHECK(out[i].wr_id == i + 1);

    // After the application drained it, a new overrun is reported again, once.
    for (uint64_t i = 1; i <= 8; ++i) REQUIRE(q.cq.push(make(i)));
    CHECK(q.overflows == 1);
    CHECK_FALSE(q.cq.push(make(9)));
    CHECK_FALSE(q.cq.push(make(10)));
    CHECK(q.overflows == 2);

    // Polling just one entry ends the overrun, too.
    std::array<Completion, 1> one;
    REQUIRE(q.cq.poll(one) == 1);
    CHECK(one[0].wr_id == 1);
    CHECK(q.cq.push(make(100)));
    CHECK_FALSE(q.cq.push(make(101)));
    CHECK(q.overflows == 3);

    // A poll that finds nothing does not.
    CountingCq empty(0);
    CHECK_FALSE(empty.cq.push(make(1)));
    CHECK(empty.overflows == 1);
    CHECK(empty.cq.poll(one) == 0);
    CHECK_FALSE(empty.cq.push(make(2)));
    CHECK(empty.overflows == 1);
}

TEST_CASE("CompletionQueue without callbacks", "[cq]") {
    CompletionQueue cq(2, nullptr, nullptr);
    cq.arm(false);
    CHECK(cq.push(make(1)));
    CHECK(cq.push(make(2)));
    CHECK_FALSE(cq.push(make(3)));
    CHECK(cq.depth() == 2);
}

TEST_CASE("CompletionQueue arm(next) fires once per arming", "[cq]") {
    CountingCq q(64);
    q.cq.push(make(1));
    CHECK(q.events == 0);  // not armed

    q.cq.arm(false);
    CHECK(q.events == 0);  // arming alone does not fire, even with completions queued
    q.cq.push(make(2));
    CHECK(q.events == 1);
    q.cq.push(make(3));
    q.cq.push(make(4, WcStatus::RemAccessErr));
    q.cq.push(make(5, WcStatus::Success, true));
    CHECK(q.events == 1);  // one shot

    q.cq.arm(false);
    q.cq.arm(false);  // arming twice is still one event
    q.cq.push(make(6));
    q.cq.push(make(7));
    CHECK(q.events == 2);

    // An overflowing completion does not consume the arming.
    CountingCq small(1);
    small.cq.push(make(1));
    small.cq.arm(false);
    CHECK_FALSE(small.cq.push(make(2)));
    CHECK(small.events == 0);
    CHECK(small.overflows == 1);
    std::array<Completion, 1> one;
    REQUIRE(small.cq.poll(one) == 1);
    small.cq.push(make(3));
    CHECK(small.events == 1);
}

TEST_CASE("CompletionQueue arm(solicited) fires on solicited or failed completions", "[cq]") {
    CountingCq q(64);
    q.cq.arm(true);
    q.cq.push(make(1));
    q.cq.push(make(2));
    CHECK(q.events == 0);
    q.cq.push(make(3, WcStatus::Success, true));
    CHECK(q.events == 1);
    q.cq.push(make(4, WcStatus::Success, true));
    CHECK(q.events == 1);  // one shot

    q.cq.arm(true);
    q.cq.push(make(5));
    CHECK(q.events == 1);
    q.cq.push(make(6, WcStatus::WrFlushErr));
    CHECK(q.events == 2);  // an error counts as solicited

    for (WcStatus s : {WcStatus::LocLenErr, WcStatus::RemAccessErr, WcStatus::RetryExcErr,
                       WcStatus::GeneralErr}) {
        q.cq.arm(true);
        const int before = q.events;
        q.cq.push(make(7));
        CHECK(q.events == before);
        q.cq.push(make(8, s));
        CHECK(q.events == before + 1);
    }

    SECTION("arm(next) over arm(solicited) fires on the next completion") {
        const int before = q.events;
        q.cq.arm(true);
        q.cq.arm(false);
        q.cq.push(make(9));
        CHECK(q.events == before + 1);
    }
    SECTION("arm(solicited) does not weaken an arm(next)") {
        const int before = q.events;
        q.cq.arm(false);
        q.cq.arm(true);
        q.cq.push(make(9));
        CHECK(q.events == before + 1);
    }
}

TEST_CASE("CompletionQueue event callback may re-arm and poll", "[cq]") {
    // The callback runs without the queue's lock: it can use the queue.
    CompletionQueue* self = nullptr;
    int events = 0;
    std::vector<uint64_t> seen;
    CompletionQueue cq(
        16,
        [&] {
            ++events;
            std::array<Completion, 16> buf;
            const size_t n = self->poll(buf);
            for (size_t i = 0; i < n; ++i) seen.push_back(buf[i].wr_id);
            self->arm(false);
        },
        nullptr);
    self = &cq;
    cq.arm(false);
    for (uint64_t i = 1; i <= 5; ++i) cq.push(make(i));
    CHECK(events == 5);
    CHECK(seen == std::vector<uint64_t>{1, 2, 3, 4, 5});
    CHECK(cq.depth() == 0);
}

TEST_CASE("CompletionQueue arming races with pushes from another thread", "[cq]") {
    // A producer pushes while the consumer polls, re-arming whenever it found the queue
    // empty. Every arming is answered by at most one event, and an arming made before a push
    // is never lost: after the last push the consumer's final arming has fired.
    constexpr uint64_t kTotal = 20000;
    std::atomic<int> events{0};
    std::atomic<int> overflows{0};
    CompletionQueue cq(
        kTotal, [&] { events.fetch_add(1); }, [&] { overflows.fetch_add(1); });
    std::atomic<bool> start{false};
    std::thread producer([&] {
        while (!start.load()) std::this_thread::yield();
        for (uint64_t i = 1; i <= kTotal; ++i) cq.push(make(i, WcStatus::Success, i % 7 == 0));
    });

    int arms = 0;
    uint64_t next = 1;
    bool in_order = true;
    std::array<Completion, 32> buf;
    start = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (long iter = 0; next <= kTotal && iter < 100000000; ++iter) {
        const size_t n = cq.poll(buf);
        for (size_t i = 0; i < n; ++i) in_order = in_order && buf[i].wr_id == next++;
        if (n == 0) {
            if (events.load() == arms) {
                cq.arm(iter % 2 == 0);
                ++arms;
            }
            if (std::chrono::steady_clock::now() > deadline) break;
            std::this_thread::yield();
        }
    }
    producer.join();
    CHECK(next == kTotal + 1);
    CHECK(in_order);
    CHECK(overflows == 0);
    // Re-arming only after the previous arming fired: all but possibly the last one fired.
    CHECK(arms > 0);
    CHECK(events <= arms);
    CHECK(events >= arms - 1);
    // Nothing is lost: arm once more after everything arrived; the next push fires.
    const int before = events.load();
    cq.arm(false);
    // A pending arming from the loop may still be unfired; either way one push fires.
    cq.push(make(kTotal + 1));
    CHECK(events.load() == before + 1);
}

TEST_CASE("CompletionQueue concurrent producers and consumers", "[cq]") {
    constexpr int kProducers = 3;
    constexpr uint64_t kEach = 5000;
    CompletionQueue cq(kProducers * kEach, nullptr, nullptr);
    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; ++p) {
        producers.emplace_back([&cq, p] {
            for (uint64_t i = 0; i < kEach; ++i) {
                Completion c;
                c.wr_id = (static_cast<uint64_t>(p) << 32) | i;
                cq.push(c);
            }
        });
    }
    std::vector<uint64_t> counts(kProducers, 0);
    bool per_producer_order = true;
    std::array<Completion, 64> buf;
    uint64_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (long iter = 0; got < kProducers * kEach && iter < 100000000; ++iter) {
        const size_t n = cq.poll(buf);
        for (size_t i = 0; i < n; ++i) {
            const auto p = static_cast<size_t>(buf[i].wr_id >> 32);
            const uint64_t seq = buf[i].wr_id & 0xffffffff;
            if (p >= kProducers) {
                per_producer_order = false;
                continue;
            }
            if (counts[p] != seq) per_producer_order = false;
            ++counts[p];
        }
        got += n;
        if (n == 0) {
            if (std::chrono::steady_clock::now() > deadline) break;
            std::this_thread::yield();
        }
    }
    for (auto& t : producers) t.join();
    CHECK(got == kProducers * kEach);
    CHECK(per_producer_order);
    for (uint64_t c : counts) CHECK(c == kEach);
}

TEST_CASE("CQ: remove_qp takes out one QP's completions and keeps the order of the rest", "[cq]") {
    CompletionQueue cq(8, nullptr, nullptr);
    for (uint64_t i = 0; i < 6; ++i) {
        Completion c;
        c.wr_id = i;
        c.qp_num = i % 2 ? 7 : 9;
        REQUIRE(cq.push(c));
    }
    CHECK(cq.remove_qp(7) == 3);
    CHECK(cq.remove_qp(7) == 0);
    CHECK(cq.depth() == 3);  // read without the lock (an empty poll's test)
    Completion out[8];
    REQUIRE(cq.poll(std::span(out, 8)) == 3);
    CHECK(out[0].wr_id == 0);
    CHECK(out[1].wr_id == 2);
    CHECK(out[2].wr_id == 4);
    CHECK(cq.depth() == 0);
    CHECK(cq.remove_qp(9) == 0);
}

TEST_CASE("CQ: remove_qp keeps the order of the rest when the queue has wrapped", "[cq]") {
    CompletionQueue cq(8, nullptr, nullptr);
    Completion out[8];
    uint64_t next = 0;
    auto push = [&](uint32_t qpn) {
        Completion c;
        c.wr_id = next++;
        c.qp_num = qpn;
        c.opcode = qpn == 5 ? WcOpcode::Recv : WcOpcode::Send;
        REQUIRE(cq.push(c));
    };
    // Round after round, so that the queue's front moves around its array.
    for (int round = 0; round < 7; ++round) {
        const uint64_t first = next;
        for (uint32_t i = 0; i < 6; ++i) push(i % 3 == 0 ? 5 : 9);  // 5 at 0 and 3
        push(11);
        CHECK(cq.remove_qp(5, round % 2 == 1) == (round % 2 == 1 ? 0u : 2u));
        CHECK(cq.remove_qp(11) == 1);
        std::vector<uint64_t> want;
        for (uint32_t i = 0; i < 6; ++i)
            if (i % 3 != 0 || round % 2 == 1) want.push_back(first + i);
        push(9);  // after the removal, behind what stayed
        want.push_back(first + 7);
        const size_t n = cq.poll(std::span(out, 8));
        REQUIRE(n == want.size());
        for (size_t i = 0; i < n; ++i) CHECK(out[i].wr_id == want[i]);
        CHECK(cq.depth() == 0);
    }
}

TEST_CASE("CQ: resize keeps what waits and refuses to shrink below it", "[cq]") {
    CompletionQueue cq(2, nullptr, nullptr);
    Completion c;
    REQUIRE(cq.push(c));
    REQUIRE(cq.push(c));
    CHECK_FALSE(cq.push(c));  // full at 2
    CHECK(cq.resize(1) == EINVAL);
    CHECK(cq.resize(0) == EINVAL);
    REQUIRE(cq.resize(3) == 0);
    CHECK(cq.capacity() == 3);
    CHECK(cq.push(c));
    CHECK(cq.depth() == 3);
}

TEST_CASE("CQ: a poller holding events back takes what it polls without an event", "[cq]") {
    int events = 0;
    CompletionQueue cq(
        8, [&events] { ++events; }, nullptr);
    Completion c;
    cq.arm(false);
    SECTION("taken by the poller: no event, still armed") {
        cq.hold_events();
        REQUIRE(cq.push(c));
        Completion out[1];
        REQUIRE(cq.poll(std::span(out, 1)) == 1);
        cq.release_events();
        CHECK(events == 0);
        REQUIRE(cq.push(c));  // the arming is still there for the next one
        CHECK(events == 1);
    }
    SECTION("left in the queue: the event goes out when the poller lets go") {
        cq.hold_events();
        REQUIRE(cq.push(c));
        CHECK(events == 0);
        cq.release_events();
        CHECK(events == 1);
        REQUIRE(cq.push(c));  // disarmed by that event
        CHECK(events == 1);
    }
    SECTION("not armed: nothing held, nothing fired") {
        Completion out[1];
        REQUIRE(cq.push(c));  // fires the arming
        REQUIRE(cq.poll(std::span(out, 1)) == 1);
        cq.hold_events();
        REQUIRE(cq.push(c));
        cq.release_events();
        CHECK(events == 1);
    }
}
