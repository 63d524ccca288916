// RingQueue (transport/ring_queue.h): first in, first out across wrap-arounds and growth,
// the array kept once grown, elements built in place.
#include <catch2/catch.hpp>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "transport/ring_queue.h"
#include "transport/work_request.h"

using namespace uroce::transport;

namespace {

struct Item {
    uint64_t id = 0;
    uint32_t tag = 7;  // a default the in-place build must keep
};

}  // namespace

TEST_CASE("RingQueue keeps FIFO order through wrap-around and growth", "[ring_queue]") {
    RingQueue<Item> q;
    CHECK(q.empty());
    CHECK(q.capacity() == 0);
    std::deque<uint64_t> model;
    std::mt19937 rng(12);
    uint64_t next = 1;
    for (int step = 0; step < 20000; ++step) {
        // Grow to at most 40 queued, with the head anywhere in the array.
        if (model.empty() || (model.size() < 40 && rng() % 3 != 0)) {
            Item& added = q.emplace_back(Item{next});
            CHECK(added.id == next);
            model.push_back(next++);
        } else {
            REQUIRE(q.front().id == model.front());
            q.pop_front();
            model.pop_front();
        }
        REQUIRE(q.size() == model.size());
        if (!model.empty()) {
            CHECK(q.front().id == model.front());
            CHECK(q.back().id == model.back());
            const size_t mid = model.size() / 2;
            CHECK(q[mid].id == model[mid]);
        }
    }
    // Room for the most ever queued at once, in a power of two.
    CHECK(q.capacity() == 64);
}

TEST_CASE("RingQueue grows while wrapped without losing order", "[ring_queue]") {
    RingQueue<Item> q;
    for (uint64_t i = 0; i < 4; ++i) q.push_back(Item{i});
    REQUIRE(q.capacity() == 4);
    q.pop_front();
    q.pop_front();
    q.push_back(Item{4});
    q.push_back(Item{5});  // the array is full, its head at index 2
    q.push_back(Item{6});  // grows: the elements are copied front first
    CHECK(q.capacity() == 8);
    REQUIRE(q.size() == 5);
    for (uint64_t i = 0; i < 5; ++i) CHECK(q[i].id == i + 2);
}

TEST_CASE("RingQueue builds in place and keeps its array across clear", "[ring_queue]") {
    RingQueue<Item> q;
    // Defaults of members not given apply, also in a slot that held an element before.
    q.emplace_back().tag = 99;
    q.pop_front();
    const Item& fresh = q.emplace_back();
    CHECK(fresh.id == 0);
    CHECK(fresh.tag == 7);
    for (uint64_t i = 0; i < 10; ++i) q.push_back(Item{i});
    const size_t grown = q.capacity();
    q.clear();
    CHECK(q.empty());
    CHECK(q.capacity() == grown);
    q.push_back(Item{42});
    CHECK(q.front().id == 42);
    CHECK(q.size() == 1);
}

TEST_CASE("RingQueue truncate keeps the first elements, wrapped or not", "[ring_queue]") {
    RingQueue<Item> q;
    for (uint64_t i = 0; i < 6; ++i) q.push_back(Item{i});
    for (int i = 0; i < 5; ++i) q.pop_front();  // the front near the array's end
    for (uint64_t i = 6; i < 10; ++i) q.push_back(Item{i});
    REQUIRE(q.size() == 5);  // 5..9, wrapped
    const size_t capacity = q.capacity();
    q.truncate(9);  // more than it holds: nothing changes
    CHECK(q.size() == 5);
    q.truncate(3);
    REQUIRE(q.size() == 3);
    q.push_back(Item{42});
    std::vector<uint64_t> got;
    while (!q.empty()) {
        got.push_back(q.front().id);
        q.pop_front();
    }
    CHECK(got == std::vector<uint64_t>{5, 6, 7, 42});
    CHECK(q.capacity() == capacity);
}

TEST_CASE("RingQueue holds work requests whole", "[ring_queue]") {
    // What the RC QP keeps in it: a send WQE with inline data and a scatter list.
    RingQueue<SendWqe> q;
    for (uint32_t i = 0; i < 3; ++i) {
        SendWqe w;
        w.wr_id = i;
        w.length = 100 + i;
        w.inline_data[kMaxInlineData - 1] = static_cast<uint8_t>(i + 1);
        w.sgl.count = 1;
        w.sgl.sge[0] = {0x1000u * i, 64, 5};
        q.emplace_back(w);
    }
    for (uint32_t i = 0; i < 3; ++i) {
        CHECK(q.front().wr_id == i);
        CHECK(q.front().length == 100 + i);
        CHECK(q.front().inline_data[kMaxInlineData - 1] == i + 1);
        CHECK(q.front().sgl.sge[0].addr == 0x1000u * i);
        q.pop_front();
    }
    CHECK(q.empty());
}
