// The responder's READ resources (responder_resources.h): which READ sends its responses
// next. Always the oldest with responses left, whatever was sent, replayed or recycled since;
// next_to_send() starts where it last found one, so these cases check that it still sees
// a resource that a duplicate made send again, behind one that is sending.
#include <algorithm>
#include <catch2/catch.hpp>
#include <initializer_list>

#include "transport/responder_resources.h"

using namespace uroce::transport;

namespace {

ReadResource read_at(uint32_t psn, uint32_t npkts) {
    ReadResource r;
    r.psn = psn;
    r.npkts = npkts;
    r.length = npkts * 4096;
    r.mtu = 4096;
    return r;
}

// A responder with `capacity` resources, given READs of `npkts` responses at `psns`.
ReadResources holding(uint32_t capacity, std::initializer_list<uint32_t> psns, uint32_t npkts) {
    ReadResources reads;
    reads.set_capacity(capacity);
    for (uint32_t psn : psns) REQUIRE(reads.admit(read_at(psn, npkts)) != nullptr);
    return reads;
}

// Sends every response of `r` (what RcQp::send_responses does, packet by packet).
void send_all(ReadResource& r) {
    while (r.sending()) {
        r.next += 1;
        r.sent_once = std::max(r.sent_once, r.next);
    }
}

// The READ next_to_send() gives, which must be the one at `psn`.
ReadResource& next_is(ReadResources& reads, uint32_t psn) {
    ReadResource* r = reads.next_to_send();
    REQUIRE(r != nullptr);
    CHECK(r->psn == psn);
    return *r;
}

}  // namespace

TEST_CASE("Responder resources: the oldest READ with responses left sends first",
          "[responder_resources]") {
    ReadResources reads;
    reads.set_capacity(4);
    CHECK(reads.next_to_send() == nullptr);
    CHECK_FALSE(reads.busy());

    REQUIRE(reads.admit(read_at(100, 4)) != nullptr);
    REQUIRE(reads.admit(read_at(104, 2)) != nullptr);
    REQUIRE(reads.admit(read_at(106, 3)) != nullptr);

    ReadResource& first = next_is(reads, 100);
    // Part-way through, it is still the one.
    first.next = 2;
    CHECK(reads.next_to_send() == &first);
    send_all(first);
    send_all(next_is(reads, 104));
    send_all(next_is(reads, 106));
    CHECK(reads.next_to_send() == nullptr);
    CHECK_FALSE(reads.busy());

    // A READ admitted after all went out sends next.
    REQUIRE(reads.admit(read_at(109, 1)) != nullptr);
    next_is(reads, 109);
}

TEST_CASE("Responder resources: a duplicate makes an older READ send again, before newer ones",
          "[responder_resources]") {
    ReadResources reads = holding(4, {200, 204}, 4);
    ReadResource* first = &next_is(reads, 200);
    send_all(*first);
    ReadResource* second = &next_is(reads, 204);
    second->next = 1;  // the second READ is under way

    // A duplicate of the first READ's response 2 (RcQp::on_duplicate_read moves its cursor).
    ReadResource* dup = reads.find(202);
    REQUIRE(dup == first);
    dup->next = 2;
    dup->run_start = 2;
    CHECK(first->sending());
    CHECK(reads.next_to_send() == first);
    send_all(*first);
    CHECK(reads.next_to_send() == second);
    send_all(*second);
    CHECK(reads.next_to_send() == nullptr);

    // Found with nothing to send again: still none.
    CHECK(reads.find(205) == second);
    CHECK(reads.next_to_send() == nullptr);
    CHECK(reads.find(999) == nullptr);
}

TEST_CASE("Responder resources: recycling the oldest finished READ keeps the order",
          "[responder_resources]") {
    ReadResources reads = holding(2, {300, 302}, 2);
    // Both still have responses to go out: a third READ finds no resource.
    CHECK(reads.admit(read_at(304, 2)) == nullptr);
    send_all(next_is(reads, 300));
    // The second is part-way; the first is recycled for a third.
    next_is(reads, 302).next = 1;
    REQUIRE(reads.admit(read_at(304, 2)) != nullptr);
    CHECK(reads.size() == 2);
    send_all(next_is(reads, 302));
    next_is(reads, 304);

    // Cleared (a QP back to RESET): nothing to send; a new READ sends.
    reads.clear();
    CHECK(reads.next_to_send() == nullptr);
    REQUIRE(reads.admit(read_at(0, 1)) != nullptr);
    REQUIRE(reads.next_to_send() != nullptr);
}
