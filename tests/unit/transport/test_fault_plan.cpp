// UROCE_FAULTS' rules (fault_plan.h): which packets each rule sees (direction, destination
// QP, opcode class), how rules combine, delay, jitter and reorder, and the delay line.
#include <catch2/catch.hpp>
#include <map>

#include "transport/delay_line.h"
#include "transport/fault_plan.h"

using namespace uroce::transport;

namespace {

constexpr uint8_t kWriteOnly = 0x0a;
constexpr uint8_t kAck = 0x11;
constexpr uint8_t kSendOnly = 0x04;

}  // namespace

TEST_CASE("parse_fault_config takes direction, QP, opcode classes, delay and reorder",
          "[faults][fault_plan]") {
    std::string error;
    auto c = parse_fault_config(
        "dir=rx,qp=0x12ab,op=ack+read-response,delay=100:20,reorder=0.1:300", error);
    REQUIRE(c);
    CHECK(c->direction == FaultDirection::Rx);
    REQUIRE(c->qpn);
    CHECK(*c->qpn == 0x12ab);
    CHECK(c->op_classes == (kOpAck | kOpReadResponse));
    CHECK(c->delay_us == 100);
    CHECK(c->jitter_us == 20);
    CHECK(c->reorder == 0.1);
    CHECK(c->reorder_us == 300);

    c = parse_fault_config("reorder=0.5,qp=77,op=request,delay=5", error);
    REQUIRE(c);
    CHECK(c->direction == FaultDirection::Tx);
    CHECK(*c->qpn == 77);
    CHECK(c->op_classes == kOpRequest);
    CHECK(c->reorder_us == 200);  // the default hold
    CHECK(c->delay_us == 5);
    CHECK(c->jitter_us == 0);

    c = parse_fault_config("ce=0.25,dir=rx", error);
    REQUIRE(c);
    CHECK(c->ce == 0.25);
    CHECK(c->direction == FaultDirection::Rx);
    CHECK(FaultInjector(*c).enabled());

    c = parse_fault_config("drop=0.1", error);
    REQUIRE(c);
    CHECK(c->ce == 0.0);
    CHECK_FALSE(c->qpn);
    CHECK(c->op_classes == 0);
    CHECK(c->direction == FaultDirection::Tx);
}

TEST_CASE("parse_fault_config refuses bad rules with a clear message", "[faults][fault_plan]") {
    const std::pair<const char*, const char*> bad[] = {
        {"dir=up", "dir must be tx or rx"},
        {"qp=0x1000000", "qp must be an unsigned integer up to 16777215"},
        {"qp=-1", "qp must be"},
        {"op=nope", "unknown opcode class 'nope'"},
        {"op=", "unknown opcode class ''"},
        {"op=ack+", "unknown opcode class ''"},
        {"delay=abc", "delay must be"},
        {"delay=2000000", "up to 1000000"},
        {"delay=1:2:3", "delay must be"},
        {"reorder=2", "reorder must be a probability"},
        {"reorder=0.1:x", "reorder's hold time must be"},
        {"reorder=0.1:5:6", "reorder's hold time"},
        {"jitter=5", "unknown fault 'jitter'"},
        {"ce=1.5", "ce must be a probability"},
        {"ce=", "ce must be a probability"},
    };
    for (const auto& [spec, message] : bad) {
        INFO(spec);
        std::string error;
        CHECK_FALSE(parse_fault_config(spec, error));
        CHECK_THAT(error, Catch::Contains(message));
    }
}

TEST_CASE("parse_fault_plan splits rules at ';'", "[faults][fault_plan]") {
    std::string error;
    auto plan = parse_fault_plan("drop=0.1,seed=3;dir=rx,corrupt=0.2", error);
    REQUIRE(plan);
    REQUIRE(plan->size() == 2);
    CHECK((*plan)[0].drop == 0.1);
    CHECK((*plan)[0].seed == 3);
    CHECK((*plan)[1].direction == FaultDirection::Rx);
    CHECK((*plan)[1].corrupt == 0.2);

    plan = parse_fault_plan("", error);
    REQUIRE(plan);
    CHECK(plan->empty());
    plan = parse_fault_plan(";;, ;", error);
    REQUIRE(plan);
    CHECK(plan->empty());

    CHECK_FALSE(parse_fault_plan("drop=0.1;bogus=1", error));
    CHECK_THAT(error, Catch::StartsWith("rule 2: unknown fault 'bogus'"));
    // One rule: the message is the rule's own, as before rules existed.
    CHECK_FALSE(parse_fault_plan("drop=7", error));
    CHECK_THAT(error, Catch::StartsWith("drop must be"));
}

TEST_CASE("fault_op_class sorts every opcode", "[faults][fault_plan]") {
    const std::map<uint8_t, uint32_t> expected = {
        {0x00, kOpSend},
        {0x04, kOpSend},
        {0x05, kOpSend},
        {0x17, kOpSend},
        {0x06, kOpWrite},
        {0x0b, kOpWrite},
        {0x0c, kOpRead},
        {0x0d, kOpReadResponse},
        {0x10, kOpReadResponse},
        {0x11, kOpAck},
        {0x12, kOpAtomicResponse},
        {0x13, kOpAtomic},
        {0x14, kOpAtomic},
        {0x24, kOpSend},
        {0x2a, kOpWrite},  // UC
        {0x64, kOpSend},
        {0x65, kOpSend},  // UD
        {0xb1, kOpAck},
        {0xaa, kOpWrite},
        {0xac, kOpRead},  // XRC
        {0x81, kOpCnp},
        {0x1f, 0},
        {0xff, 0},
    };
    for (const auto& [opcode, cls] : expected) {
        INFO("opcode 0x" << std::hex << int{opcode});
        CHECK(fault_op_class(opcode) == cls);
    }
}

TEST_CASE("FaultPlan: a rule sees only its direction, QP and opcode classes",
          "[faults][fault_plan]") {
    SECTION("op: the first two ACKs are lost, nothing else") {
        FaultConfig r;
        r.drop = 1.0;
        r.until = 2;
        r.op_classes = kOpAck;
        FaultPlan plan({r});
        const uint8_t ops[] = {kWriteOnly, kAck, kWriteOnly, kSendOnly, kAck, kAck, kWriteOnly};
        const Fault want[] = {Fault::None, Fault::Drop, Fault::None, Fault::None,
                              Fault::Drop, Fault::None, Fault::None};
        for (size_t i = 0; i < std::size(ops); ++i) {
            INFO("packet " << i);
            CHECK(plan.next(FaultDirection::Tx, ops[i], 9).fault == want[i]);
        }
    }
    SECTION("qp: only packets for that QP") {
        FaultConfig r;
        r.drop = 1.0;
        r.until = 1;
        r.qpn = 0x5;
        FaultPlan plan({r});
        CHECK(plan.next(FaultDirection::Tx, kSendOnly, 4).fault == Fault::None);
        CHECK(plan.next(FaultDirection::Tx, kSendOnly, 0x1000005).fault == Fault::None);
        CHECK(plan.next(FaultDirection::Tx, kSendOnly, 5).fault == Fault::Drop);
        CHECK(plan.next(FaultDirection::Tx, kSendOnly, 5).fault == Fault::None);  // until=1
    }
    SECTION("dir: rx rules leave sent packets alone, and the other way round") {
        FaultConfig r;
        r.drop = 1.0;
        r.direction = FaultDirection::Rx;
        FaultPlan plan({r});
        CHECK_FALSE(plan.enabled(FaultDirection::Tx));
        CHECK(plan.enabled(FaultDirection::Rx));
        CHECK(plan.next(FaultDirection::Tx, kSendOnly, 5).fault == Fault::None);
        CHECK(plan.next(FaultDirection::Rx, kSendOnly, 5).fault == Fault::Drop);
        FaultPlan none({FaultConfig{}});
        CHECK_FALSE(none.enabled(FaultDirection::Tx));
        CHECK_FALSE(none.enabled(FaultDirection::Rx));
    }
}

TEST_CASE("FaultPlan: a rule's schedule does not depend on the other rules",
          "[faults][fault_plan]") {
    FaultConfig tx;
    tx.drop = 0.3;
    tx.seed = 5;
    FaultConfig rx;
    rx.direction = FaultDirection::Rx;
    rx.corrupt = 0.5;
    FaultConfig acks;
    acks.op_classes = kOpAck;
    acks.duplicate = 0.5;
    FaultPlan alone({tx});
    FaultPlan together({tx, rx, acks});
    size_t drops = 0;
    for (int i = 0; i < 2000; ++i) {
        const Fault a = alone.next(FaultDirection::Tx, kWriteOnly, 7).fault;
        together.next(FaultDirection::Rx, kAck, 7);
        const Fault b = together.next(FaultDirection::Tx, kWriteOnly, 7).fault;
        CHECK(a == b);
        drops += a == Fault::Drop;
    }
    CHECK(drops > 400);
    CHECK(drops < 800);
}

TEST_CASE("FaultPlan: the first loss, corruption or duplication wins; delays add up",
          "[faults][fault_plan]") {
    FaultConfig dup;
    dup.duplicate = 1.0;
    FaultConfig drop;
    drop.drop = 1.0;
    CHECK(FaultPlan({dup, drop}).next(FaultDirection::Tx, kSendOnly, 3).fault == Fault::Duplicate);
    CHECK(FaultPlan({drop, dup}).next(FaultDirection::Tx, kSendOnly, 3).fault == Fault::Drop);

    FaultConfig delay;
    delay.delay_us = 100;
    FaultConfig reorder;
    reorder.reorder = 1.0;
    reorder.reorder_us = 50;
    FaultDecision d = FaultPlan({delay, reorder}).next(FaultDirection::Tx, kSendOnly, 3);
    CHECK(d.fault == Fault::None);
    CHECK(d.delay_us == 150);
    CHECK(d.delayed);
    CHECK(d.reordered);
    // A lost packet is not held back as well.
    d = FaultPlan({delay, drop}).next(FaultDirection::Tx, kSendOnly, 3);
    CHECK(d.fault == Fault::Drop);
    CHECK(d.delay_us == 0);
    CHECK_FALSE(d.delayed);
}

TEST_CASE("FaultInjector: delay with jitter stays in its range, reorder at its rate",
          "[faults][fault_plan]") {
    FaultConfig c;
    c.delay_us = 300;
    c.jitter_us = 100;
    c.reorder = 0.1;
    c.reorder_us = 1000;
    c.seed = 9;
    FaultInjector f(c), again(c);
    uint64_t sum = 0;
    uint32_t lo = UINT32_MAX, hi = 0;
    int reordered = 0;
    constexpr int kN = 20000;
    for (int i = 0; i < kN; ++i) {
        const FaultDecision d = f.next();
        const FaultDecision e = again.next();
        REQUIRE(d.delay_us == e.delay_us);  // the seed fixes the schedule
        CHECK(d.fault == Fault::None);
        CHECK(d.delayed);
        const uint32_t base = d.delay_us - (d.reordered ? 1000 : 0);
        reordered += d.reordered;
        lo = std::min(lo, base);
        hi = std::max(hi, base);
        sum += base;
    }
    CHECK(lo == 200);
    CHECK(hi == 400);
    CHECK(sum / kN >= 295);
    CHECK(sum / kN <= 305);
    CHECK(reordered > kN / 20);
    CHECK(reordered < kN / 5);

    // Without jitter, every packet gets the delay exactly; until= ends it.
    FaultConfig plain;
    plain.delay_us = 70;
    plain.until = 3;
    FaultInjector g(plain);
    for (int i = 0; i < 3; ++i) CHECK(g.next().delay_us == 70);
    CHECK(g.next().delay_us == 0);
}

TEST_CASE("DelayLine: due order, ties in arrival order, bounded", "[faults][fault_plan]") {
    DelayLine line;
    auto packet = [](uint8_t tag) {
        DelayLine::Packet p;
        p.bytes = {tag};
        return p;
    };
    bool earliest = false;
    REQUIRE(line.push(500, packet(1), earliest));
    CHECK(earliest);
    REQUIRE(line.push(300, packet(2), earliest));
    CHECK(earliest);
    REQUIRE(line.push(500, packet(3), earliest));
    CHECK_FALSE(earliest);
    REQUIRE(line.push(900, packet(4), earliest));
    CHECK_FALSE(earliest);
    CHECK(line.next_due() == 300);
    std::vector<DelayLine::Packet> out;
    line.take_due(299, out);
    CHECK(out.empty());
    line.take_due(500, out);
    REQUIRE(out.size() == 3);
    CHECK(out[0].bytes[0] == 2);
    CHECK(out[1].bytes[0] == 1);
    CHECK(out[2].bytes[0] == 3);
    CHECK(line.size() == 1);
    CHECK(line.next_due() == 900);

    for (size_t i = line.size(); i < DelayLine::kMaxPackets; ++i)
        REQUIRE(line.push(1000 + i, packet(5), earliest));
    CHECK_FALSE(line.push(1, packet(6), earliest));
    CHECK(line.size() == DelayLine::kMaxPackets);
    out.clear();
    line.take_due(UINT64_MAX, out);
    CHECK(out.size() == DelayLine::kMaxPackets);
    CHECK_FALSE(line.next_due());
}
