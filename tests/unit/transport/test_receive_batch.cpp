// ReceiveBatch: the headers built once keep working read after read. The kernel shortens a
// header's name and control lengths to what it wrote; a header not reset before the next
// read would lose the GRO segment size (a train taken for one datagram) or the sender's
// address.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "tests/unit/transport/udp_send.h"
#include "transport/receive_batch.h"

using namespace uroce::transport;
using uroce::IpAddress;
using uroce::transport::test::send_udp;

namespace {

// A UDP socket bound to 127.0.0.1 on a port of the kernel's choosing.
class Socket {
  public:
    explicit Socket(bool gro = false, int family = AF_INET) : family_(family) {
        fd_ = ::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_storage a = loopback(0);
        socklen_t len = address_length();
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0);
        REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
        port_ = ntohs(reinterpret_cast<sockaddr_in&>(a).sin_port);  // same offset in both
        const int one = 1;
        if (gro) REQUIRE(::setsockopt(fd_, IPPROTO_UDP, UDP_GRO, &one, sizeof one) == 0);
    }
    ~Socket() { ::close(fd_); }
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;

    int fd() const { return fd_; }
    uint16_t port() const { return port_; }

    // 127.0.0.1 or ::1, and its address length.
    sockaddr_storage loopback(uint16_t port) const {
        sockaddr_storage a{};
        if (family_ == AF_INET) {
            auto& v4 = reinterpret_cast<sockaddr_in&>(a);
            v4.sin_family = AF_INET;
            v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            v4.sin_port = htons(port);
        } else {
            auto& v6 = reinterpret_cast<sockaddr_in6&>(a);
            v6.sin6_family = AF_INET6;
            v6.sin6_addr = in6addr_loopback;
            v6.sin6_port = htons(port);
        }
        return a;
    }
    socklen_t address_length() const {
        return family_ == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    }

    // `bytes` to the loopback address of this socket's family, at `port`; a non-zero
    // `segment` makes it a GSO train of such segments.
    void send_to(uint16_t port, const std::vector<uint8_t>& bytes, uint16_t segment = 0) const {
        sockaddr_storage a = loopback(port);
        send_udp(fd_, a, address_length(), bytes, segment);
    }

  private:
    int family_;
    int fd_ = -1;
    uint16_t port_ = 0;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
    return v;
}

// Waits (at most 2 s) until `fd` is readable, then reads.
size_t read_when_ready(ReceiveBatch& batch, int fd) {
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 2000) == 1);
    return batch.read(fd);
}

void check_datagram(const ReceiveBatch::Datagram& d, const std::vector<uint8_t>& sent,
                    uint16_t segment, uint16_t from_port,
                    const IpAddress& from = IpAddress::v4(INADDR_LOOPBACK)) {
    REQUIRE(d.length == sent.size());
    CHECK(std::memcmp(d.data, sent.data(), sent.size()) == 0);
    CHECK(d.segment_size == segment);
    CHECK(d.src_ip == from);
    CHECK(d.src_port == from_port);
}

}  // namespace

TEST_CASE("ReceiveBatch: single datagrams and GRO trains, read after read", "[receive_batch]") {
    Socket rx(true), tx;
    ReceiveBatch batch(4, 8192);
    CHECK(batch.read(rx.fd()) == 0);  // nothing there: no datagram, no wait
    // Alternating, so that each read follows one whose control data (none for a single
    // datagram) was shorter than the GRO segment size's.
    for (int round = 0; round < 3; ++round) {
        INFO("round " << round);
        const auto single = pattern(100, static_cast<uint8_t>(round));
        tx.send_to(rx.port(), single);
        REQUIRE(read_when_ready(batch, rx.fd()) == 1);
        check_datagram(batch[0], single, 0, tx.port());

        const auto train = pattern(3 * 1000 + 500, static_cast<uint8_t>(round + 100));
        tx.send_to(rx.port(), train, 1000);
        REQUIRE(read_when_ready(batch, rx.fd()) == 1);
        check_datagram(batch[0], train, 1000, tx.port());
    }
}

TEST_CASE("ReceiveBatch: several datagrams in one read, each in its own buffer",
          "[receive_batch]") {
    Socket rx, tx;
    ReceiveBatch batch(4, 4096);
    CHECK(reinterpret_cast<uintptr_t>(batch.buffer(0)) % 4096 == 0);
    std::vector<std::vector<uint8_t>> sent;
    for (int i = 0; i < 6; ++i) {
        sent.push_back(pattern(64 + static_cast<size_t>(i), static_cast<uint8_t>(i)));
        tx.send_to(rx.port(), sent.back());
    }
    // Loopback queues all six before send returns: four fit the batch, two wait.
    REQUIRE(read_when_ready(batch, rx.fd()) == 4);
    for (size_t i = 0; i < 4; ++i) {
        CHECK(batch[i].data == batch.buffer(i));
        check_datagram(batch[i], sent[i], 0, tx.port());
    }
    REQUIRE(batch.read(rx.fd()) == 2);
    for (size_t i = 0; i < 2; ++i) check_datagram(batch[i], sent[4 + i], 0, tx.port());
    CHECK(batch.read(rx.fd()) == 0);
}

TEST_CASE("ReceiveBatch: a datagram larger than its buffer is reported with length 0",
          "[receive_batch]") {
    Socket rx, tx;
    ReceiveBatch batch(2, 128);
    tx.send_to(rx.port(), pattern(129, 1));
    tx.send_to(rx.port(), pattern(128, 2));
    REQUIRE(read_when_ready(batch, rx.fd()) == 2);
    CHECK(batch[0].length == 0);
    check_datagram(batch[1], pattern(128, 2), 0, tx.port());
}

TEST_CASE("ReceiveBatch: one batch reads sockets of both families in turn", "[receive_batch]") {
    // The engine reads its device socket and its multicast group sockets into one batch:
    // an IPv6 sender's address must not be cut to the length of the IPv4 one read before.
    Socket rx4, tx4, rx6(false, AF_INET6), tx6(false, AF_INET6);
    const IpAddress v6_loopback = *IpAddress::parse("::1");
    ReceiveBatch batch(2, 2048);
    for (int round = 0; round < 2; ++round) {
        INFO("round " << round);
        tx4.send_to(rx4.port(), pattern(40, 4));
        REQUIRE(read_when_ready(batch, rx4.fd()) == 1);
        check_datagram(batch[0], pattern(40, 4), 0, tx4.port());
        tx6.send_to(rx6.port(), pattern(60, 6));
        REQUIRE(read_when_ready(batch, rx6.fd()) == 1);
        check_datagram(batch[0], pattern(60, 6), 0, tx6.port(), v6_loopback);
    }
}

TEST_CASE("ReceiveBatch: one datagram found makes the next read ask for one, a backlog for all",
          "[receive_batch]") {
    Socket rx, tx, other;
    ReceiveBatch batch(4, 2048);
    CHECK(batch.read_width(rx.fd()) == 4);
    // A ping-pong's read: one datagram waits, and is all a read finds.
    tx.send_to(rx.port(), pattern(50, 1));
    REQUIRE(read_when_ready(batch, rx.fd()) == 1);
    check_datagram(batch[0], pattern(50, 1), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 1);
    CHECK(batch.read(rx.fd()) == 0);  // an empty read changes nothing
    CHECK(batch.read_width(rx.fd()) == 1);

    // Three arrive at once: the narrow read takes the first, and leaves the others waiting,
    // in order; finding data again right away, the reads widen and take both.
    for (uint8_t i = 2; i <= 4; ++i) tx.send_to(rx.port(), pattern(50 + i, i));
    REQUIRE(read_when_ready(batch, rx.fd()) == 1);
    check_datagram(batch[0], pattern(52, 2), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 1);  // one found after an empty read: still narrow
    REQUIRE(batch.read(rx.fd()) == 1);      // found again at once: a backlog
    check_datagram(batch[0], pattern(53, 3), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 4);
    REQUIRE(batch.read(rx.fd()) == 1);
    check_datagram(batch[0], pattern(54, 4), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 1);  // a wide read that found one
    CHECK(batch.read(rx.fd()) == 0);

    // Several found by one read keep it wide.
    CHECK(batch.read_width(rx.fd()) == 1);
    tx.send_to(rx.port(), pattern(60, 5));
    REQUIRE(read_when_ready(batch, rx.fd()) == 1);
    tx.send_to(rx.port(), pattern(61, 6));
    tx.send_to(rx.port(), pattern(62, 7));
    REQUIRE(batch.read(rx.fd()) == 1);  // data right after data: the next read is wide
    check_datagram(batch[0], pattern(61, 6), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 4);
    tx.send_to(rx.port(), pattern(63, 8));
    REQUIRE(batch.read(rx.fd()) == 2);
    check_datagram(batch[0], pattern(62, 7), 0, tx.port());
    check_datagram(batch[1], pattern(63, 8), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 4);

    // A long datagram found alone keeps reads wide: a stream's, or the first train of a long
    // message whose next one is on its way. One of kNarrowBytes is still short.
    tx.send_to(rx.port(), pattern(ReceiveBatch::kNarrowBytes + 1, 12));
    REQUIRE(read_when_ready(batch, rx.fd()) == 1);
    CHECK(batch.read_width(rx.fd()) == 4);
    CHECK(batch.read(rx.fd()) == 0);
    tx.send_to(rx.port(), pattern(ReceiveBatch::kNarrowBytes, 13));
    REQUIRE(read_when_ready(batch, rx.fd()) == 1);
    check_datagram(batch[0], pattern(ReceiveBatch::kNarrowBytes, 13), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 1);
    CHECK(batch.read(rx.fd()) == 0);

    // Another socket starts wide (both its datagrams in one read while this one is
    // narrow), and so does this one after it.
    tx.send_to(rx.port(), pattern(70, 9));
    REQUIRE(read_when_ready(batch, rx.fd()) == 1);
    CHECK(batch.read_width(rx.fd()) == 1);
    CHECK(batch.read_width(other.fd()) == 4);
    tx.send_to(other.port(), pattern(71, 10));
    tx.send_to(other.port(), pattern(72, 11));
    REQUIRE(read_when_ready(batch, other.fd()) == 2);
    check_datagram(batch[1], pattern(72, 11), 0, tx.port());
    CHECK(batch.read_width(rx.fd()) == 4);
}
