// A context's QP number space: 4096 numbers per device slot, one more slot claimed (and
// routed before use) whenever the held ones are full, until QpnSpace::kMaxNumbers are out
// whichever slots the context drew; numbers unique, never 0, 1 or the multicast QPN; each
// slot's QPs counting in that slot's table.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <new>
#include <set>
#include <unordered_set>
#include <vector>

#include "tests/unit/transport/scratch_dir.h"
#include "transport/device_slots.h"
#include "transport/multicast_groups.h"
#include "transport/qpn_space.h"

using namespace uroce::transport;
using namespace std::chrono_literals;

namespace {

std::string table_path() {
    return (uroce::transport::test::scratch_dir("uroce-qpn-space") / "slots").string();
}

// A QpnSpace over a real slot table, recording what it asked for.
struct Space {
    std::string path = table_path();
    std::vector<uint16_t> routed;
    std::vector<uint16_t> tables;  // slots a counter table was made for
    int route_error = 0;
    std::unordered_set<uint32_t> taken;
    std::unique_ptr<QpnSpace> space;

    // `primary`: the slot to open with (0: whichever the table hands out).
    explicit Space(uint16_t primary_number = 0) {
        std::string error;
        int err = 0;
        auto primary = DeviceSlots::claim(path, error, err, 0ms);
        REQUIRE(primary);
        // A slot given back goes behind every slot never used, so each claim draws a new one
        // (at random): within 4095 claims the wanted one comes.
        for (unsigned i = 0; primary_number != 0 && primary->number() != primary_number; ++i) {
            REQUIRE(i < DeviceSlots::kSlots);
            primary.reset();
            primary = DeviceSlots::claim(path, error, err, 0ms);
            REQUIRE(primary);
        }
        QpnSpace::Hooks h;
        h.claim_slot = [this](std::string& e, int& r) {
            return DeviceSlots::claim(path, e, r, 0ms);
        };
        h.route_slot = [this](uint16_t n) {
            if (route_error != 0) return route_error;
            routed.push_back(n);
            return 0;
        };
        h.counter_table = [this](uint16_t n) {
            tables.push_back(n);
            return QpCounterTable::make_private();
        };
        space = std::make_unique<QpnSpace>(std::move(primary), std::move(h));
    }
    uint32_t allocate() {
        const uint32_t n =
            space->allocate(QpnSpace::Kind::Qp, [this](uint32_t q) { return taken.contains(q); });
        REQUIRE(taken.insert(n).second);
        return n;
    }
};

// Numbers a slot holds: the last slot's last number is the multicast QPN, never handed out.
// Slots are drawn at random, so any test may get that slot (a test that assumed 4096
// everywhere failed about 1 run in 40).
uint32_t capacity(uint32_t slot) {
    return slot == DeviceSlots::slot_of(kMulticastQpn) ? QpnSpace::kPerSlot - 1
                                                       : QpnSpace::kPerSlot;
}

}  // namespace

TEST_CASE(
    "QpnSpace: 4096 QPs in the first slot, then a further slot routed before its first "
    "number",
    "[qpn_space]") {
    Space s;
    const uint16_t first = s.space->primary_number();
    CHECK(first != 0);
    CHECK(s.tables == std::vector<uint16_t>{first});
    for (uint32_t i = 0; i < capacity(first); ++i) {
        const uint32_t qpn = s.allocate();
        REQUIRE(DeviceSlots::slot_of(qpn) == first);
    }
    CHECK(s.space->slots_held() == 1);
    CHECK(s.routed.empty());

    const uint32_t next = s.allocate();
    const uint16_t second = static_cast<uint16_t>(DeviceSlots::slot_of(next));
    CHECK(second != first);
    CHECK(second != 0);
    CHECK(s.routed == std::vector<uint16_t>{second});
    CHECK(s.tables == std::vector<uint16_t>{first, second});
    CHECK(s.space->slots_held() == 2);

    // Each QP counts in its own slot's table.
    const uint32_t in_first = *std::find_if(s.taken.begin(), s.taken.end(), [&](uint32_t q) {
        return DeviceSlots::slot_of(q) == first && (q & 0xfff) == (next & 0xfff);
    });
    CHECK(&s.space->counters(in_first) != &s.space->counters(next));
    CHECK(&s.space->counters(next) == &s.space->counters(next));

    // A number given back in the first slot waits behind the second slot's never used ones.
    s.space->release(QpnSpace::Kind::Qp, in_first);
    s.taken.erase(in_first);
    const uint32_t after = s.allocate();
    CHECK(after != in_first);
    CHECK(DeviceSlots::slot_of(after) == second);
    CHECK(s.space->slots_held() == 2);
}

TEST_CASE(
    "QpnSpace: a number given back is handed out again only after every other free number, "
    "the one given back longest ago first",
    "[qpn_space]") {
    Space s;
    const uint32_t room = capacity(s.space->primary_number());
    // Ten QPs alive at any time: each new one after the first ten replaces the oldest, whose
    // packets may still be on the wire. Before, a number drawn at random in the slot came back
    // within a few dozen draws (a late packet for the old QP reached the new one).
    constexpr size_t kAlive = 10;
    std::vector<uint32_t> order;  // every number handed out, in order
    std::set<uint32_t> seen;
    for (uint32_t i = 0; i < room; ++i) {
        if (order.size() >= kAlive) {
            const uint32_t oldest = order[order.size() - kAlive];
            s.space->release(QpnSpace::Kind::Qp, oldest);
            s.taken.erase(oldest);
        }
        const uint32_t n = s.allocate();
        INFO("allocation " << i);
        REQUIRE(seen.insert(n).second);  // never one handed out before
        order.push_back(n);
    }
    // Every number of the slot went out once, none in a second slot; now the first one
    // given back comes first, then the next.
    CHECK(s.space->slots_held() == 1);
    for (size_t j = 0; j < 3; ++j) {
        const uint32_t oldest = order[order.size() - kAlive];
        s.space->release(QpnSpace::Kind::Qp, oldest);
        s.taken.erase(oldest);
        CHECK(s.allocate() == order[j]);
        order.push_back(order[j]);
    }
}

TEST_CASE("QpnSpace: a full context gets the one number given back at once", "[qpn_space]") {
    Space s;
    const uint32_t room = capacity(s.space->primary_number());
    // The slot full, the number given back is its only free one: handed out again at once,
    // rather than a second slot claimed.
    for (uint32_t i = 0; i < room; ++i) s.allocate();
    const uint32_t back = *s.taken.begin();
    s.space->release(QpnSpace::Kind::Qp, back);
    s.taken.erase(back);
    CHECK(s.allocate() == back);  // the only free number of the slot held
    CHECK(s.space->slots_held() == 1);
}

TEST_CASE("QpnSpace: XRC SRQ numbers are counted apart from QP numbers", "[qpn_space]") {
    Space s;
    for (uint32_t i = 0; i < capacity(s.space->primary_number()); ++i) s.allocate();
    std::unordered_set<uint32_t> srqns;
    const uint32_t srqn =
        s.space->allocate(QpnSpace::Kind::XrcSrq, [&](uint32_t n) { return srqns.contains(n); });
    // The QPs filled the first slot; the SRQ's numbers there are all free.
    CHECK(DeviceSlots::slot_of(srqn) == s.space->primary_number());
    CHECK(s.space->slots_held() == 1);
}

TEST_CASE(
    "QpnSpace: at kMaxNumbers, or when a slot cannot be routed, allocation fails and "
    "holds nothing more",
    "[qpn_space]") {
    SECTION("route refused") {
        Space s;
        for (uint32_t i = 0; i < capacity(s.space->primary_number()); ++i) s.allocate();
        s.route_error = EPERM;
        CHECK_THROWS_AS(s.allocate(), std::bad_alloc);
        CHECK(s.space->slots_held() == 1);
        CHECK(s.tables.size() == 1);
        s.route_error = 0;
        const uint32_t qpn = s.allocate();
        CHECK(DeviceSlots::slot_of(qpn) != s.space->primary_number());
    }
    SECTION("every number out") {
        Space s;
        std::set<uint32_t> slots;
        // Each new slot is claimed when the last one is full: the sum of the capacities of
        // the slots claimed so far says when the next allocation must claim one more.
        uint32_t room = capacity(s.space->primary_number());
        slots.insert(s.space->primary_number());
        while (s.taken.size() < QpnSpace::kMaxNumbers) {
            const uint32_t slot = DeviceSlots::slot_of(s.allocate());
            if (slots.insert(slot).second) room += capacity(slot);
            REQUIRE(s.taken.size() <= room);  // never more numbers than the slots held have
        }
        // Sixteen slots, or seventeen if the short one is among them (1 run in 256).
        CHECK(slots.size() == (slots.contains(DeviceSlots::slot_of(kMulticastQpn)) ? 17u : 16u));
        CHECK(s.space->slots_held() == slots.size());
        CHECK(!s.taken.contains(0));
        CHECK(!s.taken.contains(1));
        CHECK(!s.taken.contains(kMulticastQpn));
        CHECK_THROWS_AS(s.allocate(), std::bad_alloc);
        CHECK(s.space->slots_held() == slots.size());
    }
}

TEST_CASE(
    "QpnSpace: a context that drew slot 4095 (one number short) still gets kMaxNumbers QPs, "
    "through a seventeenth slot",
    "[qpn_space]") {
    const uint16_t last = static_cast<uint16_t>(DeviceSlots::slot_of(kMulticastQpn));
    Space s(last);
    REQUIRE(s.space->primary_number() == last);
    for (uint32_t i = 0; i < QpnSpace::kMaxNumbers; ++i) s.allocate();
    CHECK(s.taken.size() == QpnSpace::kMaxNumbers);
    CHECK(!s.taken.contains(kMulticastQpn));
    CHECK(s.space->slots_held() == 17);
    CHECK(s.routed.size() == 16);
    // The seventeenth slot holds exactly the one number the short slot lacked.
    const uint16_t seventeenth = s.routed.back();
    CHECK(std::count_if(s.taken.begin(), s.taken.end(),
                        [&](uint32_t q) { return DeviceSlots::slot_of(q) == seventeenth; }) == 1);
    CHECK_THROWS_AS(s.allocate(), std::bad_alloc);
    CHECK(s.space->slots_held() == 17);

    // A number given back may be handed out again; the one after it may not.
    const uint32_t back = *s.taken.begin();
    s.space->release(QpnSpace::Kind::Qp, back);
    s.taken.erase(back);
    s.allocate();
    CHECK_THROWS_AS(s.allocate(), std::bad_alloc);
}

TEST_CASE("QpnSpace: the order of numbers within a slot is drawn anew for each context",
          "[qpn_space]") {
    // A blind attacker must not guess the next QPN: two contexts' first 16 numbers (their
    // low 12 bits; the slots differ anyway) agree by chance with odds of 1 in 4096^16.
    Space a, b;
    std::vector<uint32_t> low_a, low_b;
    for (int i = 0; i < 16; ++i) {
        low_a.push_back(a.allocate() & (QpnSpace::kPerSlot - 1));
        low_b.push_back(b.allocate() & (QpnSpace::kPerSlot - 1));
    }
    CHECK(low_a != low_b);
    // Nor is either the numbers in order.
    std::vector<uint32_t> sorted = low_a;
    std::sort(sorted.begin(), sorted.end());
    CHECK(low_a != sorted);
}
