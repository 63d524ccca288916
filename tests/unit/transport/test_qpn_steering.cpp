// QPN steering through real sockets: several sockets bound to one address and port, each
// receiving exactly the datagrams whose destination QPN carries its slot, in one process
// or across processes; a datagram for a slot no one holds reaches exactly one of them. Needs root
// (CAP_BPF), as device sharing does.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "tests/unit/transport/scratch_dir.h"
#include "transport/device_slots.h"
#include "transport/qpn_steering.h"

using namespace uroce::transport;
using uroce::transport::test::scratch_dir;
using namespace std::chrono_literals;

namespace {

struct Where {
    uint32_t ip;
    uint16_t port;
};

Where test_address() {
    static int n = 0;
    const auto pid = static_cast<uint32_t>(::getpid());
    return {0x7f000000u | (1 + pid % 254) << 8 | static_cast<uint32_t>(200 + (n++ % 50)),
            static_cast<uint16_t>(30000 + pid % 20000)};
}

// In a directory removed when the test process ends (every run left eight behind in /tmp).
std::string table_path() {
    return (scratch_dir("uroce-steer") / "slots").string();
}

sockaddr_in sockaddr_of(Where w) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(w.ip);
    sa.sin_port = htons(w.port);
    return sa;
}

// One context's share of the device: a slot, a socket in the group, its map entry.
struct Member {
    std::unique_ptr<DeviceSlot> slot;
    int fd = -1;
    std::unique_ptr<QpnSteering> steering;

    // `given`: the slot to hold (else one is claimed).
    Member(const std::string& table, Where w, std::unique_ptr<DeviceSlot> given = nullptr) {
        std::string error;
        int err = 0;
        slot = given ? std::move(given) : DeviceSlots::claim(table, error, err, 0ms);
        INFO(error);
        REQUIRE(slot);
        fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        const int one = 1;
        REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) == 0);
        const sockaddr_in sa = sockaddr_of(w);
        REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0);
        steering = QpnSteering::open(*slot, error, err);
        INFO(error);
        REQUIRE(steering);
        REQUIRE(steering->add(fd, error) == 0);
    }
    ~Member() {
        steering.reset();
        if (fd >= 0) ::close(fd);
    }
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;

    // The tags (byte 7 of the BTH, the QPN's low byte) of every datagram waiting on the socket.
    std::vector<int> received() const {
        std::vector<int> tags;
        uint8_t buf[256];
        for (int i = 0; i < 10000; ++i) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) break;
            tags.push_back(n >= 12 ? buf[7] : -1);
        }
        return tags;
    }
};

// Sends a BTH-like datagram to `w` for QPN slot<<12 | tag.
void send_to_slot(Where w, int slot, int tag, size_t length = 28) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    std::vector<uint8_t> pkt(length, 0);
    if (length >= 8) {
        pkt[0] = 0x04;  // SEND only: anything will do, the program reads only the QPN
        pkt[5] = static_cast<uint8_t>(slot >> 4);
        pkt[6] = static_cast<uint8_t>((slot & 15) << 4);
        pkt[7] = static_cast<uint8_t>(tag);
    }
    const sockaddr_in sa = sockaddr_of(w);
    const bool sent =
        ::sendto(fd, pkt.data(), pkt.size(), 0, reinterpret_cast<const sockaddr*>(&sa),
                 sizeof sa) == static_cast<ssize_t>(pkt.size());
    ::close(fd);
    REQUIRE(sent);
}

void settle() {
    std::this_thread::sleep_for(20ms);
}  // loopback delivery is synchronous; margin

}  // namespace

TEST_CASE("QPN steering: each socket of the group gets its slot's datagrams only",
          "[qpn_steering]") {
    const std::string table = table_path();
    const Where w = test_address();
    Member a(table, w), b(table, w), c(table, w);
    REQUIRE(a.slot->number() != b.slot->number());
    for (int tag = 0; tag < 30; ++tag) {
        const Member& m = tag % 3 == 0 ? a : tag % 3 == 1 ? b : c;
        send_to_slot(w, m.slot->number(), tag);
    }
    // Nobody holds slot 0 (QP0/QP1) or slot 4000 here, and a datagram shorter than a BTH has
    // no QPN (its tag reads as -1): each reaches exactly one member, which will refuse it.
    send_to_slot(w, 0, 100);
    send_to_slot(w, 4000, 101);
    send_to_slot(w, a.slot->number(), 102, 8);
    settle();
    std::vector<int> expect_a, expect_b, expect_c;
    for (int tag = 0; tag < 30; ++tag)
        (tag % 3 == 0 ? expect_a : tag % 3 == 1 ? expect_b : expect_c).push_back(tag);
    std::multiset<int> strays;
    auto steered = [&strays](std::vector<int> tags) {
        std::vector<int> kept;
        for (int t : tags) {
            if (t >= 100 || t < 0)
                strays.insert(t);
            else
                kept.push_back(t);
        }
        return kept;
    };
    CHECK(steered(a.received()) == expect_a);
    CHECK(steered(b.received()) == expect_b);
    CHECK(steered(c.received()) == expect_c);
    CHECK(strays == std::multiset<int>{-1, 100, 101});
}

TEST_CASE("QPN steering: when a member leaves, its slot's datagrams reach one that remains",
          "[qpn_steering]") {
    const std::string table = table_path();
    const Where w = test_address();
    auto a = std::make_unique<Member>(table, w);
    Member b(table, w);
    const int a_slot = a->slot->number();
    a.reset();
    send_to_slot(w, a_slot, 1);
    send_to_slot(w, b.slot->number(), 2);
    settle();
    CHECK(b.received() == std::vector<int>{1, 2});
}

TEST_CASE(
    "QPN steering: a further slot routed to a member reaches that member, until the slot "
    "is another member's own",
    "[qpn_steering]") {
    const std::string table = table_path();
    const Where w = test_address();
    Member a(table, w), b(table, w);
    std::string error;
    int err = 0;
    auto further = DeviceSlots::claim(table, error, err, 0ms);
    REQUIRE(further);
    const int n = further->number();
    CHECK(a.steering->route(static_cast<uint16_t>(n)) == 0);
    CHECK(a.steering->route(a.slot->number()) == EINVAL);  // its own slot needs no route
    for (int tag = 0; tag < 20; ++tag) send_to_slot(w, n, tag);
    settle();
    std::vector<int> all(20);
    for (int tag = 0; tag < 20; ++tag) all[tag] = tag;
    CHECK(a.received() == all);
    CHECK(b.received().empty());
    // The route is stale once the slot is somebody's first slot (as when the context that
    // routed it died): the new holder gets the packets.
    Member c(table, w, std::move(further));
    for (int tag = 0; tag < 20; ++tag) send_to_slot(w, n, tag);
    settle();
    CHECK(c.received() == all);
    CHECK(a.received().empty());
    CHECK(b.received().empty());
}

TEST_CASE("QPN steering: members in different processes, one killed", "[qpn_steering]") {
    const std::string table = table_path();
    const Where w = test_address();
    Member parent(table, w);
    int to_parent[2], to_child[2];
    REQUIRE(::pipe(to_parent) == 0);
    REQUIRE(::pipe(to_child) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        // The child: join, report the slot, wait for "count", report how many datagrams
        // carried its slot and nothing else, then wait to be killed.
        std::string error;
        int err = 0;
        auto slot = DeviceSlots::claim(table, error, err, 0ms);
        const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        const sockaddr_in sa = sockaddr_of(w);
        const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0;
        auto steering = slot && bound ? QpnSteering::open(*slot, error, err) : nullptr;
        const bool added = steering && steering->add(fd, error) == 0;
        const uint16_t n = added ? slot->number() : 0;
        if (::write(to_parent[1], &n, sizeof n) != sizeof n) ::_exit(1);
        uint8_t go = 0;
        if (::read(to_child[0], &go, 1) != 1) ::_exit(1);
        uint8_t buf[64];
        uint8_t mine = 0;
        while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) >= 12)
            mine += (buf[5] << 4 | buf[6] >> 4) == n ? 1 : 100;
        if (::write(to_parent[1], &mine, 1) != 1) ::_exit(1);
        ::pause();
        ::_exit(0);
    }
    struct Reaper {
        pid_t pid;
        ~Reaper() {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    } reaper{pid};
    uint16_t child_slot = 0;
    REQUIRE(::read(to_parent[0], &child_slot, sizeof child_slot) == sizeof child_slot);
    REQUIRE(child_slot != 0);
    REQUIRE(child_slot != parent.slot->number());
    for (int tag = 0; tag < 10; ++tag)
        send_to_slot(w, tag % 2 ? child_slot : parent.slot->number(), tag);
    settle();
    const uint8_t go = 1;
    REQUIRE(::write(to_child[1], &go, 1) == 1);
    uint8_t child_got = 0;
    REQUIRE(::read(to_parent[0], &child_got, 1) == 1);
    CHECK(child_got == 5);
    CHECK(parent.received() == std::vector<int>{0, 2, 4, 6, 8});

    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    send_to_slot(w, child_slot, 20);
    send_to_slot(w, parent.slot->number(), 21);
    settle();
    CHECK(parent.received() == std::vector<int>{20, 21});  // 20 to be refused as unknown
}

TEST_CASE("QPN steering: a child of fork() that drops its copy leaves the parent's entry",
          "[qpn_steering]") {
    const std::string table = table_path();
    const Where w = test_address();
    auto a = std::make_unique<Member>(table, w);
    Member b(table, w);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        a.reset();  // the child's copy of a's steering and slot go away
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    for (int tag = 0; tag < 20; ++tag)
        send_to_slot(w, tag % 2 ? b.slot->number() : a->slot->number(), tag);
    settle();
    std::vector<int> even, odd;
    for (int tag = 0; tag < 20; ++tag) (tag % 2 ? odd : even).push_back(tag);
    CHECK(a->received() == even);  // a stray would land in a or b at the kernel's choice
    CHECK(b.received() == odd);
}

namespace {

// A CM MAD to QP1 (UD SEND Only, DETH, MAD): `attr` at MAD bytes 16..17, `tag` in the last
// byte of the transaction ID, `field_at` bytes of the MAD set to `field` (big-endian).
void send_cm(Where w, uint16_t attr, int tag, size_t field_at, uint64_t field, size_t field_bytes,
             uint8_t mgmt_class = 0x07, size_t length = 12 + 8 + 256 + 4) {
    std::vector<uint8_t> pkt(length, 0);
    pkt[0] = 0x64;
    pkt[7] = 1;  // destination QP 1
    uint8_t* mad = pkt.data() + 20;
    if (length >= 20 + 40) {
        mad[0] = 1;
        mad[1] = mgmt_class;
        mad[2] = 2;
        mad[3] = 3;
        mad[15] = static_cast<uint8_t>(tag);
        mad[16] = static_cast<uint8_t>(attr >> 8);
        mad[17] = static_cast<uint8_t>(attr);
        for (size_t i = 0; i < field_bytes; ++i)
            mad[field_at + i] = static_cast<uint8_t>(field >> (8 * (field_bytes - 1 - i)));
    }
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    const sockaddr_in sa = sockaddr_of(w);
    const bool sent =
        ::sendto(fd, pkt.data(), pkt.size(), 0, reinterpret_cast<const sockaddr*>(&sa),
                 sizeof sa) == static_cast<ssize_t>(pkt.size());
    ::close(fd);
    REQUIRE(sent);
}

// The tags of the CM MADs waiting on a member's socket (-1 for a datagram too short to be one).
std::vector<int> cm_tags(const Member& m) {
    std::vector<int> tags;
    uint8_t buf[512];
    for (int i = 0; i < 10000; ++i) {
        const ssize_t n = ::recv(m.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0) break;
        tags.push_back(n >= 20 + 40 ? buf[20 + 15] : -1);
    }
    return tags;
}

constexpr size_t kServiceAt = 32;
constexpr size_t kRemoteCommIdAt = 28;
constexpr size_t kRequestIdAt = 24;

}  // namespace

TEST_CASE("QPN steering: QP1's CM MADs reach the context their content names",
          "[qpn_steering][cm]") {
    const std::string table = table_path();
    const Where w = test_address();
    Member a(table, w), b(table, w), c(table, w);
    const uint64_t s1 = 0x0000000001060001ull, s2 = 0x0000000001110002ull;
    REQUIRE(a.steering->claim_cm_service(s1) == 0);
    REQUIRE(b.steering->claim_cm_service(s2) == 0);
    const auto id_of = [](const Member& m) { return uint64_t{m.slot->number()} << 20 | 0x1234; };

    send_cm(w, 0x10, 1, kServiceAt, s1, 8);           // REQ for s1: a
    send_cm(w, 0x10, 2, kServiceAt, s2, 8);           // REQ for s2: b
    send_cm(w, 0x17, 3, kServiceAt, s2, 8);           // SIDR REQ for s2: b
    for (uint16_t attr = 0x11; attr <= 0x16; ++attr)  // MRA .. DREP naming c's comm ID
        send_cm(w, attr, 10 + attr - 0x11, kRemoteCommIdAt, id_of(c), 4);
    send_cm(w, 0x18, 20, kRequestIdAt, id_of(a), 4);  // SIDR REP naming a's request ID
    // Strays: each reaches exactly one member, which refuses it.
    send_cm(w, 0x10, 100, kServiceAt, 0x0000000001060099ull, 8);         // nobody listens
    send_cm(w, 0x19, 101, kRemoteCommIdAt, id_of(c), 4);                 // LAP: not steered
    send_cm(w, 0x13, 102, kRemoteCommIdAt, id_of(c), 4, 0x04);           // not the CM class
    send_cm(w, 0x13, 103, kRemoteCommIdAt, uint64_t{4000} << 20, 4);     // nobody's slot
    send_cm(w, 0x13, 104, kRemoteCommIdAt, id_of(c), 4, 0x07, 20 + 39);  // too short to read
    settle();

    std::multiset<int> strays;
    auto steered = [&strays](std::vector<int> tags) {
        std::vector<int> kept;
        for (int t : tags) (t >= 100 || t < 0 ? (void)strays.insert(t) : kept.push_back(t));
        return kept;
    };
    CHECK(steered(cm_tags(a)) == std::vector<int>{1, 20});
    CHECK(steered(cm_tags(b)) == std::vector<int>{2, 3});
    CHECK(steered(cm_tags(c)) == std::vector<int>{10, 11, 12, 13, 14, 15});
    CHECK(strays.size() == 5);
    CHECK(strays.count(-1) == 1);  // the short one carries no readable tag
}

TEST_CASE("QPN steering: one listener per CM service and device", "[qpn_steering][cm]") {
    const std::string table = table_path();
    const Where w = test_address();
    auto a = std::make_unique<Member>(table, w);
    Member b(table, w);
    const uint64_t s = 0x0000000001060042ull;
    CHECK_FALSE(b.steering->cm_service_held_elsewhere(s));
    REQUIRE(a->steering->claim_cm_service(s) == 0);
    CHECK(a->steering->claim_cm_service(s) == 0);  // again: still a's
    CHECK(b.steering->claim_cm_service(s) == EADDRINUSE);
    // Whether another live context listens: a held REQ is left for it (cm_agent.h).
    CHECK(b.steering->cm_service_held_elsewhere(s));
    CHECK_FALSE(a->steering->cm_service_held_elsewhere(s));
    CHECK_FALSE(b.steering->cm_service_held_elsewhere(s + 1));
    SECTION("released, it can be taken") {
        a->steering->release_cm_service(s);
        CHECK_FALSE(b.steering->cm_service_held_elsewhere(s));
        b.steering->release_cm_service(s);  // not b's: nothing happens
        CHECK(b.steering->claim_cm_service(s) == 0);
        CHECK(a->steering->claim_cm_service(s) == EADDRINUSE);
        send_cm(w, 0x10, 7, kServiceAt, s, 8);
        settle();
        CHECK(cm_tags(b) == std::vector<int>{7});
    }
    SECTION("a holder that left without releasing it loses it") {
        // Leaving takes a's socket out of the group; its service entry stays behind.
        a.reset();
        CHECK_FALSE(b.steering->cm_service_held_elsewhere(s));  // its holder is dead
        CHECK(b.steering->claim_cm_service(s) == 0);
        send_cm(w, 0x10, 8, kServiceAt, s, 8);
        settle();
        CHECK(cm_tags(b) == std::vector<int>{8});
    }
}
