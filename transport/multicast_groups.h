// The IPv4 multicast groups an engine's UD QPs are attached to (ibv_attach_mcast).
//
// The device's sockets are bound to its unicast address and never receive a datagram sent
// to a group, so each group gets a socket of its own, bound to group:port and joined on the
// device's interface, while at least one QP of this engine is attached to it. Its read event
// runs on the engine thread's loop; the engine hands every datagram to each attached QP.
#pragma once

#include <event2/event.h>

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "transport/udp_socket.h"

namespace uroce::transport {

class UdQp;

// The destination QPN of every multicast packet (IBA 9.6.1.2.1); never a QP's number.
inline constexpr uint32_t kMulticastQpn = 0xffffff;

class MulticastGroups {
  public:
    // What an engine may hold: groups (each costs a socket) and QPs per group. ENOMEM beyond.
    static constexpr size_t kMaxGroups = 256;
    static constexpr size_t kMaxQpsPerGroup = 64;

    // Runs on the engine thread when the socket of `group` has datagrams.
    using OnReadable = void (*)(const UdpSocket& socket, const IpAddress& group, void* arg);

    // Sockets join on the interface of `if_ip` and bind `port`.
    MulticastGroups(const IpAddress& if_ip, uint16_t port, OnReadable on_readable, void* arg);
    ~MulticastGroups();
    MulticastGroups(const MulticastGroups&) = delete;
    MulticastGroups& operator=(const MulticastGroups&) = delete;

    // Attaches `qp` to `group` (a second time changes nothing). The group's first QP opens
    // its socket and adds the read event to `base`. 0, ENOMEM past the limits, or the
    // errno of the socket's bind or join.
    int attach(event_base* base, const IpAddress& group, const std::shared_ptr<UdQp>& qp);
    // Detaches QP `qpn` from `group`: EINVAL if it is not attached. The last QP to leave
    // closes the socket, which leaves the group. Waits for a read event in progress.
    int detach(const IpAddress& group, uint32_t qpn);
    // Detaches QP `qpn` from every group (it is being destroyed).
    void detach_all(uint32_t qpn);
    // The QPs attached to `group` now (out is replaced).
    void members(const IpAddress& group, std::vector<std::shared_ptr<UdQp>>& out);
    // Closes every group; for the engine's destruction, after its loop has stopped.
    void clear();
    // Closes this process's descriptors without the lock: only for a child of fork().
    void close_fds_after_fork() noexcept;

  private:
    struct Group;
    static void on_event(evutil_socket_t, short, void* arg);

    const IpAddress if_ip_;
    const uint16_t port_;
    const OnReadable on_readable_;
    void* const arg_;
    std::shared_mutex mutex_;
    std::unordered_map<IpAddress, std::unique_ptr<Group>, IpAddressHash> groups_;
};

}  // namespace uroce::transport
