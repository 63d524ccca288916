// SharedReceiveQueue: FIFO order across takers, capacity and SGE limits, and the one-shot
// limit event (fires once when the depth drops below the armed limit, then stays disarmed).
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "transport/shared_receive_queue.h"

using namespace uroce::transport;

namespace {

RecvWqe wqe(uint64_t id, uint32_t nsge = 1) {
    RecvWqe w;
    w.wr_id = id;
    w.sgl.count = nsge;
    return w;
}

}  // namespace

TEST_CASE("SRQ hands out WQEs in posting order and refuses past its limits", "[srq]") {
    int events = 0;
    SharedReceiveQueue srq(7, 3, 2, [&] { ++events; });
    CHECK(srq.pd() == 7);
    CHECK(srq.post(wqe(1)) == 0);
    CHECK(srq.post(wqe(2, 2)) == 0);
    CHECK(srq.post(wqe(9, 3)) == EINVAL);  // more SGEs than max_sge
    CHECK(srq.post(wqe(3)) == 0);
    CHECK(srq.post(wqe(4)) == ENOMEM);  // full
    CHECK(srq.depth() == 3);
    for (uint64_t id = 1; id <= 3; ++id) {
        auto w = srq.take();
        REQUIRE(w.has_value());
        CHECK(w->wr_id == id);
    }
    CHECK_FALSE(srq.take().has_value());
    CHECK(events == 0);  // never armed
}

TEST_CASE("SRQ limit event fires once below the armed limit", "[srq]") {
    int events = 0;
    SharedReceiveQueue srq(1, 8, 1, [&] { ++events; });
    CHECK(srq.arm_limit(9) == EINVAL);
    for (uint64_t id = 0; id < 4; ++id) REQUIRE(srq.post(wqe(id)) == 0);
    REQUIRE(srq.arm_limit(3) == 0);
    REQUIRE(srq.take());  // 3 left: not below 3
    CHECK(events == 0);
    REQUIRE(srq.take());  // 2 left
    CHECK(events == 1);
    CHECK(srq.limit() == 0);  // disarmed by the event
    REQUIRE(srq.take());
    CHECK(events == 1);
}

TEST_CASE("SRQ: concurrent takers get each WQE exactly once", "[srq]") {
    constexpr uint64_t kCount = 20000;
    SharedReceiveQueue srq(1, kCount, 1, {});
    for (uint64_t id = 0; id < kCount; ++id) REQUIRE(srq.post(wqe(id)) == 0);
    std::vector<std::vector<uint64_t>> got(4);
    std::vector<std::thread> threads;
    for (auto& g : got)
        threads.emplace_back([&srq, &g] {
            while (auto w = srq.take()) g.push_back(w->wr_id);
        });
    for (auto& t : threads) t.join();
    std::set<uint64_t> all;
    size_t total = 0;
    for (auto& g : got) {
        total += g.size();
        all.insert(g.begin(), g.end());
        // Each taker sees them in posting order.
        for (size_t i = 1; i < g.size(); ++i) CHECK(g[i - 1] < g[i]);
    }
    CHECK(total == kCount);
    CHECK(all.size() == kCount);
}

TEST_CASE("SRQ: a modify of both capacity and limit changes both or neither", "[srq]") {
    SharedReceiveQueue srq(1, 16, 1, {});
    for (uint64_t id = 0; id < 4; ++id) REQUIRE(srq.post(wqe(id)) == 0);
    CHECK(srq.modify(8, 12) == EINVAL);  // the limit above the new capacity
    CHECK(srq.capacity() == 16);
    CHECK(srq.limit() == 0);
    CHECK(srq.modify(3, 2) == EINVAL);  // fewer than the WQEs queued
    CHECK(srq.capacity() == 16);
    CHECK(srq.limit() == 0);
    REQUIRE(srq.arm_limit(10) == 0);
    CHECK(srq.modify(8, 4) == 0);  // below the old limit, but not the new one
    CHECK(srq.capacity() == 8);
    CHECK(srq.limit() == 4);
    CHECK(srq.resize(3) == EINVAL);  // below the armed limit (and the WQEs queued)
    CHECK(srq.capacity() == 8);
}
