// UROCE_FAULTS parsing and the fault injector's drop decisions.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/fault_injector.h"

using namespace uroce::transport;

namespace {

std::vector<bool> draws(const FaultConfig& config, size_t n) {
    FaultInjector f(config);
    std::vector<bool> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) out.push_back(f.drop_next());
    return out;
}

}  // namespace

TEST_CASE("parse_fault_config accepts good specs", "[faults]") {
    std::string error;

    SECTION("empty: no faults") {
        auto c = parse_fault_config("", error);
        REQUIRE(c);
        CHECK(c->drop == 0.0);
        CHECK(c->seed == 1);
    }
    SECTION("drop and seed") {
        auto c = parse_fault_config("drop=0.05,seed=7", error);
        REQUIRE(c);
        CHECK(c->drop == Approx(0.05));
        CHECK(c->seed == 7);
    }
    SECTION("either order, either alone") {
        auto c = parse_fault_config("seed=123,drop=0.5", error);
        REQUIRE(c);
        CHECK(c->drop == 0.5);
        CHECK(c->seed == 123);
        c = parse_fault_config("seed=9", error);
        REQUIRE(c);
        CHECK(c->drop == 0.0);
        CHECK(c->seed == 9);
        c = parse_fault_config("drop=0.25", error);
        REQUIRE(c);
        CHECK(c->drop == 0.25);
        CHECK(c->seed == 1);
    }
    SECTION("the bounds of the probability") {
        auto c = parse_fault_config("drop=0", error);
        REQUIRE(c);
        CHECK(c->drop == 0.0);
        c = parse_fault_config("drop=1", error);
        REQUIRE(c);
        CHECK(c->drop == 1.0);
        c = parse_fault_config("drop=1.0", error);
        REQUIRE(c);
        CHECK(c->drop == 1.0);
        c = parse_fault_config("drop=1e-3", error);
        REQUIRE(c);
        CHECK(c->drop == Approx(0.001));
    }
    SECTION("the largest seed") {
        auto c = parse_fault_config("seed=18446744073709551615", error);
        REQUIRE(c);
        CHECK(c->seed == UINT64_MAX);
        c = parse_fault_config("seed=0", error);
        REQUIRE(c);
        CHECK(c->seed == 0);
    }
    SECTION("until: a window of candidate packets") {
        auto c = parse_fault_config("drop=0.05,until=1000", error);
        REQUIRE(c);
        CHECK(c->until == 1000);
        c = parse_fault_config("drop=0.05", error);
        REQUIRE(c);
        CHECK(c->until == 0);
    }
    SECTION("a later value of a key wins") {
        auto c = parse_fault_config("drop=0.1,drop=0.2,seed=1,seed=2", error);
        REQUIRE(c);
        CHECK(c->drop == Approx(0.2));
        CHECK(c->seed == 2);
    }
    SECTION("empty items are skipped") {
        // Stray commas (a trailing one, doubled ones) carry no setting and are ignored.
        auto c = parse_fault_config(",drop=0.5,,seed=3,", error);
        REQUIRE(c);
        CHECK(c->drop == 0.5);
        CHECK(c->seed == 3);
        c = parse_fault_config(",,,", error);
        REQUIRE(c);
        CHECK(c->drop == 0.0);
    }
}

TEST_CASE("parse_fault_config rejects bad specs", "[faults]") {
    const char* const bad[] = {
        // unknown keys
        "loss=0.1",
        "Drop=0.1",
        "drop=0.1,shuffle=0.1",
        "=0.1",
        // the newer faults: probabilities, and burst's ENTER:LEAVE with LEAVE > 0
        "corrupt=1.5",
        "corrupt=",
        "duplicate=-1",
        "duplicate=x",
        "burst=0.1",
        "burst=0.1:",
        "burst=:0.5",
        "burst=0.1:0",
        "burst=0.1:1.5",
        "burst=2:0.5",
        "burst=0.1:0.5:0.2",
        " drop=0.1",
        // probabilities outside [0,1]
        "drop=-0.1",
        "drop=1.0001",
        "drop=2",
        "drop=inf",
        "drop=nan",
        "drop=1e10",
        // not numbers
        "drop=",
        "drop=abc",
        "drop=0.1x",
        "drop=0.1 ",
        "drop=0.1;seed=2",
        "seed=",
        "seed=abc",
        "seed=-1",
        "seed=1.5",
        "seed=0x10",
        "seed=12 ",
        "seed=18446744073709551616",
        "until=",
        "until=-1",
        "until=ten",
        "until=1e3",
        // no '='
        "drop",
        "drop0.1",
        "drop=0.1,seed",
        "seed=1,,x",
    };
    for (const char* spec : bad) {
        INFO("spec '" << spec << "'");
        std::string error;
        CHECK_FALSE(parse_fault_config(spec, error));
        CHECK_FALSE(error.empty());
    }
}

TEST_CASE("parse_fault_config takes burst, corrupt and duplicate", "[faults]") {
    std::string error;
    auto c = parse_fault_config("burst=0.01:0.25,corrupt=0.001,duplicate=0.5,seed=3", error);
    INFO(error);
    REQUIRE(c);
    CHECK(c->burst_enter == Approx(0.01));
    CHECK(c->burst_leave == Approx(0.25));
    CHECK(c->corrupt == Approx(0.001));
    CHECK(c->duplicate == 0.5);
    CHECK(c->drop == 0.0);
    CHECK(c->seed == 3);
    c = parse_fault_config("burst=0:1", error);
    REQUIRE(c);
    CHECK(c->burst_enter == 0.0);
    CHECK_FALSE(FaultInjector(*c).enabled());
    CHECK_FALSE(parse_fault_config("burst=0.1:0", error));
    CHECK(error.find("burst") != std::string::npos);
}

TEST_CASE("FaultInjector: each fault at its rate, all reproducible from the seed", "[faults]") {
    FaultConfig cfg;
    cfg.corrupt = 0.02;
    cfg.duplicate = 0.03;
    cfg.seed = 11;
    FaultInjector a(cfg), b(cfg);
    constexpr int kDraws = 100000;
    int corrupt = 0, duplicate = 0, drop = 0;
    for (int i = 0; i < kDraws; ++i) {
        const FaultDecision da = a.next();
        const FaultDecision db = b.next();
        REQUIRE(da.fault == db.fault);
        REQUIRE(da.draw == db.draw);
        corrupt += da.fault == Fault::Corrupt;
        duplicate += da.fault == Fault::Duplicate;
        drop += da.fault == Fault::Drop;
    }
    CHECK(drop == 0);
    CHECK(corrupt > kDraws * 0.02 * 0.8);
    CHECK(corrupt < kDraws * 0.02 * 1.2);
    // A packet gets one fault: duplicates are drawn among the packets not corrupted.
    CHECK(duplicate > kDraws * 0.03 * 0.98 * 0.8);
    CHECK(duplicate < kDraws * 0.03 * 1.2);
    // Another seed, other positions.
    cfg.seed = 12;
    FaultInjector c(cfg);
    FaultInjector again(FaultConfig{0.0, 11, 0, 0.02, 0.03});
    int differ = 0;
    for (int i = 0; i < 1000; ++i) differ += c.next().fault != again.next().fault;
    CHECK(differ > 0);
}

TEST_CASE("FaultInjector: the drop stream is the same with other faults added", "[faults]") {
    // Seeds published for drop= experiments keep dropping the same packets.
    FaultConfig plain{0.05, 7};
    FaultConfig more = plain;
    more.corrupt = 0.1;
    more.duplicate = 0.1;
    FaultInjector p(plain), m(more);
    for (int i = 0; i < 10000; ++i) {
        INFO("packet " << i);
        REQUIRE((p.next().fault == Fault::Drop) == (m.next().fault == Fault::Drop));
    }
}

TEST_CASE("FaultInjector: burst losses come in runs of mean length 1/LEAVE", "[faults]") {
    FaultConfig cfg;
    cfg.burst_enter = 0.01;
    cfg.burst_leave = 0.25;
    cfg.seed = 5;
    FaultInjector f(cfg);
    constexpr int kDraws = 200000;
    int lost = 0, runs = 0, longest = 0, run = 0;
    for (int i = 0; i < kDraws; ++i) {
        if (f.next().fault == Fault::Drop) {
            ++lost;
            if (run++ == 0) ++runs;
            longest = std::max(longest, run);
        } else {
            run = 0;
        }
    }
    REQUIRE(runs > 100);
    const double mean = static_cast<double>(lost) / runs;
    CHECK(mean > 3.2);  // 1 / 0.25 = 4
    CHECK(mean < 4.8);
    CHECK(longest >= 10);
    // Stationary share of the bad state: 0.01 / (0.01 + 0.25), about 3.8%.
    CHECK(lost > kDraws * 0.030);
    CHECK(lost < kDraws * 0.047);
    // The same seed, the same bursts; until= ends them.
    FaultInjector g(cfg), h(cfg);
    for (int i = 0; i < 5000; ++i) REQUIRE(g.next().fault == h.next().fault);
    cfg.until = 1000;
    FaultInjector u(cfg);
    int late = 0;
    for (int i = 0; i < 20000; ++i) late += u.next().fault != Fault::None && i >= 1000;
    CHECK(late == 0);
}

namespace {
// The clock an outage test's injector reads: the test moves it.
int64_t g_fake_now_ns = 0;
int64_t fake_now_ns() {
    return g_fake_now_ns;
}
}  // namespace

TEST_CASE("parse_fault_config takes outage=ENTER:US", "[faults]") {
    std::string error;
    auto c = parse_fault_config("outage=0.001:5000,seed=4", error);
    REQUIRE(c);
    CHECK(c->outage_enter == Approx(0.001));
    CHECK(c->outage_us == 5000);
    CHECK(c->seed == 4);
    c = parse_fault_config("outage=1:10000000", error);
    REQUIRE(c);
    CHECK(c->outage_us == 10'000'000);
    for (const char* bad :
         {"outage=0.1", "outage=0.1:", "outage=:100", "outage=2:100", "outage=0.1:0",
          "outage=0.1:10000001", "outage=0.1:5:3", "outage=0.1:-5", "outage=x:100"}) {
        INFO(bad);
        error.clear();
        CHECK_FALSE(parse_fault_config(bad, error));
        CHECK(error.find("outage") != std::string::npos);
    }
}

TEST_CASE("FaultInjector: an outage loses every packet for its time, however few are sent",
          "[faults]") {
    FaultConfig cfg;
    cfg.outage_enter = 0.01;
    cfg.outage_us = 500;
    cfg.seed = 9;
    g_fake_now_ns = 1'000'000;
    FaultInjector f(cfg, &fake_now_ns);
    REQUIRE(f.enabled());
    CHECK_FALSE(f.singles_out());  // only losses: trains stay whole
    // A packet every 10 us: each outage takes the 50 packets sent in its 500 us.
    constexpr int kPackets = 100000;
    std::vector<bool> lost(kPackets);
    int runs = 0;
    for (int i = 0; i < kPackets; ++i) {
        lost[i] = f.next().fault == Fault::Drop;
        g_fake_now_ns += 10'000;
    }
    for (int i = 0; i < kPackets;) {
        if (!lost[i]) {
            ++i;
            continue;
        }
        int run = 0;
        while (i < kPackets && lost[i]) ++run, ++i;
        ++runs;
        INFO("run ending at packet " << i);
        // Back-to-back outages join: a run is a whole number of outages.
        if (i < kPackets) CHECK(run % 50 == 0);
    }
    CHECK(runs > 500);  // about 100000 / (100 + 50)
    CHECK(runs < 900);

    // A sparse sender (a packet every 200 us, as a retry is) loses three packets to an
    // outage of 500 us, where a per-packet burst would take as many packets as it lasts.
    cfg.outage_enter = 1.0;
    g_fake_now_ns = 5'000'000;
    FaultInjector sparse(cfg, &fake_now_ns);
    std::vector<bool> got;
    for (int i = 0; i < 4; ++i) {
        got.push_back(sparse.next().fault == Fault::Drop);
        g_fake_now_ns += 200'000;
    }
    // Packets at 0, 200 and 400 us fall in the outage the first one began; the one at 600
    // us finds the link up (and, with ENTER 1, takes it down again itself).
    CHECK(got == std::vector<bool>{true, true, true, true});
    cfg.outage_enter = 0.5;
    cfg.seed = 3;
    g_fake_now_ns = 5'000'000;
    FaultInjector half(cfg, &fake_now_ns);
    int up_after_outage = 0;
    bool down = false;
    int64_t down_until = 0;
    for (int i = 0; i < 2000; ++i) {
        const bool l = half.next().fault == Fault::Drop;
        const bool inside = down && g_fake_now_ns < down_until;
        if (inside) CHECK(l);                          // nothing gets through a running outage
        if (!inside && down && !l) ++up_after_outage;  // and the link comes back after it
        if (l && !inside) {
            down = true;
            down_until = g_fake_now_ns + 500'000;
        }
        g_fake_now_ns += 200'000;
    }
    CHECK(up_after_outage > 100);

    // The same seed and the same times, the same losses; until= ends them.
    cfg.outage_enter = 0.01;
    cfg.seed = 9;
    g_fake_now_ns = 1;
    FaultInjector g(cfg, &fake_now_ns);
    std::vector<bool> again;
    for (int i = 0; i < 5000; ++i) {
        again.push_back(g.next().fault == Fault::Drop);
        g_fake_now_ns += 10'000;
    }
    CHECK(std::equal(again.begin(), again.end(), lost.begin()));
    cfg.until = 1000;
    g_fake_now_ns = 1;
    FaultInjector u(cfg, &fake_now_ns);
    int late = 0, early = 0;
    for (int i = 0; i < 20000; ++i) {
        const bool l = u.next().fault != Fault::None;
        late += l && i >= 1000;
        early += l && i < 1000;
        g_fake_now_ns += 10'000;
    }
    CHECK(early > 0);
    CHECK(late == 0);
}

TEST_CASE("FaultInjector::corrupt flips one bit, never in the BTH's reserved byte", "[faults]") {
    std::vector<uint8_t> packet(64, 0);
    std::vector<int> hits(packet.size(), 0);
    for (uint64_t draw = 0; draw < 100000; draw += 7) {
        std::vector<uint8_t> p = packet;
        FaultInjector::corrupt(p, draw * 0x9e3779b97f4a7c15ull);
        int bits = 0;
        for (size_t i = 0; i < p.size(); ++i) {
            bits += __builtin_popcount(p[i]);
            hits[i] += p[i] != 0;
        }
        REQUIRE(bits == 1);
    }
    CHECK(hits[4] == 0);
    for (size_t i = 0; i < hits.size(); ++i)
        if (i != 4) CHECK(hits[i] > 0);
}

TEST_CASE("parse_fault_config errors say what was wrong", "[faults]") {
    std::string error;
    CHECK_FALSE(parse_fault_config("bogus=1", error));
    CHECK(error.find("bogus") != std::string::npos);
    error.clear();
    CHECK_FALSE(parse_fault_config("drop=7", error));
    CHECK(error.find("drop") != std::string::npos);
    CHECK(error.find('7') != std::string::npos);
    error.clear();
    CHECK_FALSE(parse_fault_config("seed=x", error));
    CHECK(error.find("seed") != std::string::npos);
    error.clear();
    CHECK_FALSE(parse_fault_config("until=x", error));
    CHECK(error.find("until") != std::string::npos);
    error.clear();
    CHECK_FALSE(parse_fault_config("nokey", error));
    CHECK(error.find("nokey") != std::string::npos);
}

TEST_CASE("FaultInjector with drop=0 never drops", "[faults]") {
    FaultInjector f(FaultConfig{0.0, 7});
    CHECK_FALSE(f.enabled());
    size_t dropped = 0;
    for (int i = 0; i < 100000; ++i) dropped += f.drop_next();
    CHECK(dropped == 0);
    // The default configuration is the same.
    FaultInjector d(FaultConfig{});
    CHECK_FALSE(d.enabled());
    CHECK_FALSE(d.drop_next());
}

TEST_CASE("FaultInjector with drop=1 always drops", "[faults]") {
    for (uint64_t seed : {0ull, 1ull, 7ull, 0xdeadbeefull, ~0ull}) {
        FaultInjector f(FaultConfig{1.0, seed});
        CHECK(f.enabled());
        size_t dropped = 0;
        for (int i = 0; i < 100000; ++i) dropped += f.drop_next();
        CHECK(dropped == 100000);
    }
}

TEST_CASE("FaultInjector drop rate", "[faults]") {
    constexpr size_t kDraws = 100000;
    for (uint64_t seed : {1ull, 2ull, 42ull, 0ull, ~0ull}) {
        FaultInjector f(FaultConfig{0.05, seed});
        CHECK(f.enabled());
        size_t dropped = 0;
        for (size_t i = 0; i < kDraws; ++i) dropped += f.drop_next();
        INFO("seed " << seed << " dropped " << dropped);
        // Expected 5000, standard deviation about 69: +-10% is more than 7 sigma.
        CHECK(dropped > 4500);
        CHECK(dropped < 5500);
    }
    SECTION("other probabilities") {
        for (double p : {0.001, 0.1, 0.5, 0.9}) {
            FaultInjector f(FaultConfig{p, 5});
            size_t dropped = 0;
            for (size_t i = 0; i < kDraws; ++i) dropped += f.drop_next();
            const double rate = static_cast<double>(dropped) / kDraws;
            INFO("p " << p << " rate " << rate);
            CHECK(rate == Approx(p).epsilon(0.15).margin(0.0005));
        }
    }
}

TEST_CASE("FaultInjector drops are deterministic per seed", "[faults]") {
    constexpr size_t kDraws = 10000;
    const auto a = draws(FaultConfig{0.05, 7}, kDraws);
    const auto b = draws(FaultConfig{0.05, 7}, kDraws);
    const auto c = draws(FaultConfig{0.05, 8}, kDraws);
    CHECK(a == b);
    CHECK(a != c);
    // Not merely shifted: the positions of the drops differ substantially.
    size_t same_drops = 0;
    for (size_t i = 0; i < kDraws; ++i) same_drops += a[i] && c[i];
    size_t drops_a = 0;
    for (bool d : a) drops_a += d;
    CHECK(same_drops < drops_a / 2);

    // A config parsed from UROCE_FAULTS gives the same sequence as the equivalent struct.
    std::string error;
    const auto parsed = parse_fault_config("seed=7,drop=0.05", error);
    REQUIRE(parsed);
    CHECK(draws(*parsed, kDraws) == a);

    // Drops are spread out, not clustered at the start.
    size_t first_half = 0;
    for (size_t i = 0; i < kDraws / 2; ++i) first_half += a[i];
    CHECK(first_half > drops_a / 4);
    CHECK(first_half < drops_a * 3 / 4);
}

TEST_CASE("FaultInjector until=N drops only among the first N packets", "[faults]") {
    SECTION("drop=1: exactly the first N") {
        const auto d = draws(FaultConfig{1.0, 3, 100}, 1000);
        for (size_t i = 0; i < d.size(); ++i) {
            INFO("packet " << i);
            CHECK(d[i] == (i < 100));
        }
    }
    SECTION("inside the window the draws are those of the unlimited injector") {
        const auto limited = draws(FaultConfig{0.05, 7, 5000}, 10000);
        const auto unlimited = draws(FaultConfig{0.05, 7}, 10000);
        size_t inside = 0, after = 0;
        for (size_t i = 0; i < 10000; ++i) {
            if (i < 5000) {
                CHECK(limited[i] == unlimited[i]);
                inside += limited[i];
            } else {
                after += limited[i];
            }
        }
        CHECK(inside > 150);
        CHECK(after == 0);
    }
    SECTION("until=0 is no limit") {
        const auto d = draws(FaultConfig{1.0, 3, 0}, 1000);
        for (bool b : d) CHECK(b);
    }
}
