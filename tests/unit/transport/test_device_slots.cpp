// The device's context slots: unique across contexts and processes, never 0, free again when
// their holder dies (even by kill -9), and quarantined before they are handed out again.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <set>
#include <vector>

#include "tests/unit/transport/scratch_dir.h"
#include "transport/device_counters.h"
#include "transport/device_slots.h"

using namespace uroce::transport;
using namespace std::chrono_literals;

namespace {

// Each test's table in a directory of its own (scratch_dir.h).
std::string table_path() {
    return (test::scratch_dir("uroce-slots") / "slots").string();
}

std::unique_ptr<DeviceSlot> claim(const std::string& path, std::chrono::milliseconds q = 0ms) {
    std::string error;
    int err = 0;
    auto s = DeviceSlots::claim(path, error, err, q);
    INFO(error);
    REQUIRE(s);
    return s;
}

std::unique_ptr<DeviceSlot> try_claim(const std::string& path, std::chrono::milliseconds q) {
    std::string error;
    int err = 0;
    return DeviceSlots::claim(path, error, err, q);
}

int claim_error(const std::string& path, std::chrono::milliseconds q = 0ms) {
    std::string error;
    int err = 0;
    auto s = DeviceSlots::claim(path, error, err, q);
    return s ? 0 : err;
}

// A child process that claims a slot, reports its number through a pipe and waits to be
// killed. Returns {pid, slot}.
std::pair<pid_t, int> holder_process(const std::string& path) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(p[0]);
        std::string error;
        int err = 0;
        auto s = DeviceSlots::claim(path, error, err, 0ms);
        const uint16_t n = s ? s->number() : 0;
        if (::write(p[1], &n, sizeof n) != sizeof n) ::_exit(1);
        ::pause();
        ::_exit(0);
    }
    ::close(p[1]);
    uint16_t n = 0;
    const bool got = ::read(p[0], &n, sizeof n) == sizeof n;
    ::close(p[0]);
    REQUIRE(got);
    return {pid, n};
}

void kill_and_reap(pid_t pid) {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
}

// Kills the child on every way out of the test, a failed REQUIRE included.
struct ChildGuard {
    pid_t pid;
    ~ChildGuard() {
        if (pid > 0) kill_and_reap(pid);
    }
};

// Holding every slot takes one file descriptor per slot.
void enough_fds() {
    rlimit r{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
    if (r.rlim_cur < DeviceSlots::kSlots + 512) {
        r.rlim_cur = std::min<rlim_t>(r.rlim_max, DeviceSlots::kSlots + 512);
        ::setrlimit(RLIMIT_NOFILE, &r);
    }
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &r) == 0);
    INFO("RLIMIT_NOFILE " << r.rlim_cur);
    REQUIRE(r.rlim_cur >= DeviceSlots::kSlots + 512);
}

}  // namespace

TEST_CASE("Device slots: distinct for every holder, never slot 0, 255 at most", "[device_slots]") {
    const std::string path = table_path();
    std::vector<std::unique_ptr<DeviceSlot>> held;
    std::set<int> numbers;
    for (unsigned i = 1; i < DeviceSlots::kSlots; ++i) {
        held.push_back(claim(path));
        numbers.insert(held.back()->number());
    }
    CHECK(numbers.size() == DeviceSlots::kSlots - 1);
    CHECK(!numbers.contains(0));
    CHECK(claim_error(path) == EBUSY);
    const int freed = held[17]->number();
    held[17].reset();
    auto again = claim(path);
    CHECK(again->number() == freed);
}

TEST_CASE("Device slots: a released slot rests while others are free; the oldest goes first",
          "[device_slots]") {
    enough_fds();
    const std::string path = table_path();
    const int first = claim(path)->number();  // claimed and released at once: resting
    std::vector<std::unique_ptr<DeviceSlot>> held;
    for (unsigned i = 2; i < DeviceSlots::kSlots; ++i) {
        held.push_back(claim(path, 1h));
        REQUIRE(held.back()->number() != first);
    }
    // Only the resting slot is left: it is taken all the same rather than failing.
    auto last = claim(path, 1h);
    CHECK(last->number() == first);
    CHECK(claim_error(path, 1h) == EBUSY);
    // Two released one after the other: the one released longest ago goes first.
    const int second = held[5]->number();
    const int third = held[9]->number();
    held[5].reset();
    held[9].reset();
    auto a = claim(path, 1h);
    auto b = claim(path, 1h);
    CHECK(a->number() == second);
    CHECK(b->number() == third);
}

TEST_CASE("Device slots: other processes' slots are theirs until they die, even by kill -9",
          "[device_slots]") {
    enough_fds();
    const std::string path = table_path();
    auto [pid, child_slot] = holder_process(path);
    ChildGuard guard{pid};
    REQUIRE(child_slot != 0);
    std::vector<std::unique_ptr<DeviceSlot>> held;
    for (unsigned i = 2; i < DeviceSlots::kSlots; ++i) {
        held.push_back(claim(path));
        CHECK(held.back()->number() != child_slot);
    }
    CHECK(claim_error(path) == EBUSY);  // the child's slot is not free while it lives
    kill_and_reap(pid);
    guard.pid = 0;
    // Its death freed the slot (resting from the moment a claimer noticed).
    CHECK(claim(path, 1h)->number() == child_slot);
}

TEST_CASE("Device slots: a child of fork() does not release its parent's slot", "[device_slots]") {
    const std::string path = table_path();
    auto mine = claim(path);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        mine.reset();  // the child's copy goes away
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    std::vector<std::unique_ptr<DeviceSlot>> held;
    while (auto s = try_claim(path, 0ms)) {
        CHECK(s->number() != mine->number());
        held.push_back(std::move(s));
    }
    CHECK(held.size() == DeviceSlots::kSlots - 2);
}

TEST_CASE("Device slots: the first slot of a fresh table is drawn at random", "[device_slots]") {
    // The slot is the top half of every QPN: a predictable one would make QPNs guessable.
    std::set<int> firsts;
    for (int i = 0; i < 8; ++i) firsts.insert(claim(table_path())->number());
    CHECK(firsts.size() > 1);  // eight times the same slot: 1 in 4095^7 by chance
}

TEST_CASE("Device slots: a holder knows whether another context holds a slot", "[device_slots]") {
    const std::string path = table_path();
    auto a = claim(path);
    CHECK(a->alone());
    {
        auto b = claim(path);  // another context of this process
        CHECK_FALSE(a->alone());
        CHECK_FALSE(b->alone());
    }
    CHECK(a->alone());
    auto [pid, child_slot] = holder_process(path);  // another process
    ChildGuard guard{pid};
    REQUIRE(child_slot != 0);
    CHECK_FALSE(a->alone());
    kill_and_reap(pid);
    guard.pid = 0;
    CHECK(a->alone());
}

TEST_CASE("Device slots: a shared value is read without claiming a slot", "[device_slots]") {
    const std::string path = table_path();
    SharedValueReader reader(path);
    CHECK_FALSE(reader.read(0));  // no table yet
    auto a = claim(path);
    CHECK(reader.read(5) == 0u);  // found now
    REQUIRE(a->update_shared_value(5, [](uint32_t n) { return n + 7; }) == 0);
    REQUIRE(a->update_shared_value(6, [](uint32_t n) { return n + 9; }) == 0);
    CHECK(reader.read(5) == 7u);  // through the file it keeps open
    CHECK(reader.read(6) == 9u);
    CHECK(SharedValueReader(path).read(5) == 7u);
    CHECK_FALSE(reader.read(DeviceSlot::kSharedValues));
    CHECK(a->update_shared_value(DeviceSlot::kSharedValues, [](uint32_t n) { return n; }) ==
          EINVAL);
    CHECK(a->alone());  // the readings claimed nothing
}

namespace {

// Overwrites the 8 bytes at `offset` of the file at `path`.
void overwrite_u64(const std::string& path, off_t offset, uint64_t value) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const bool ok = ::pwrite(fd, &value, sizeof value, offset) == sizeof value;
    ::close(fd);
    REQUIRE(ok);
}

}  // namespace

TEST_CASE(
    "Device counters: a file of another layout starts afresh for a context alone on the "
    "device, and only then",
    "[device_slots]") {
    const std::string slots = table_path();
    const std::string file = slots + ".counters";
    std::string error;
    CounterValues v;
    {
        auto s = claim(slots);
        auto c = DeviceCounters::open(file, s->number(), s->alone(), error);
        INFO(error);
        REQUIRE(c);
        c->block().rx_packets.fetch_add(7);
    }
    REQUIRE(DeviceCounters::read_totals(file, v, error));
    CHECK(v.rx_packets == 7);
    // As a build with another counter list would have left it: its layout hash (the
    // header's second word) differs. Nothing reads it as this layout.
    overwrite_u64(file, 8, 0x1234);
    CHECK_FALSE(DeviceCounters::read_totals(file, v, error));
    CHECK_THAT(error, Catch::Contains("other counters"));

    auto a = claim(slots);
    auto b = claim(slots);
    // Another context uses the device (perhaps that other build, counting into the file):
    // the file stays as it is, and this context counts privately.
    CHECK_FALSE(DeviceCounters::open(file, a->number(), a->alone(), error));
    CHECK_THAT(error, Catch::Contains("other counters"));
    CHECK_FALSE(DeviceCounters::read_totals(file, v, error));

    b.reset();
    auto c = DeviceCounters::open(file, a->number(), a->alone(), error);
    INFO(error);
    REQUIRE(c);
    REQUIRE(DeviceCounters::read_totals(file, v, error));
    CHECK(v.rx_packets == 0);  // the old counts went with their layout
    c->block().rx_packets.fetch_add(3);
    REQUIRE(DeviceCounters::read_totals(file, v, error));
    CHECK(v.rx_packets == 3);
    // A second context finds the file in this layout and counts into it too.
    auto d = claim(slots);
    auto e = DeviceCounters::open(file, d->number(), d->alone(), error);
    REQUIRE(e);
    e->block().rx_packets.fetch_add(2);
    REQUIRE(DeviceCounters::read_totals(file, v, error));
    CHECK(v.rx_packets == 5);
}
