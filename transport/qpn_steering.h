// QPN steering: many contexts, in one process or many, receive on one device's IP:4791.
//
// Every context binds its own UDP socket to the device's address with SO_REUSEPORT; the
// sockets form one reuseport group. A small BPF program (qpn_steering.bpf.c), attached to
// the group, reads the destination QPN of each datagram and hands it to the socket of the
// context whose slot (device_slots.h) is the QPN's top 12 bits, through a socket map indexed
// by slot. A context holding further slots for more QPs (qpn_space.h) routes each of them to
// its own slot in a second map, which the program consults first. The kernel does the
// demultiplexing: no extra copy, no process hop, no lock shared between processes on the data path.
// When a context closes its socket or its process dies, the kernel takes the socket out of the map.
// A datagram with no BTH or for a slot nobody holds goes to one member of the group (the kernel's
// choice), which refuses and counts it.
//
// The map is shared by every context of the device: its id is kept in the device's slot
// table, and a context that finds none (or a stale one) creates it. Loading the program and
// opening a map by id need CAP_BPF and CAP_SYS_ADMIN (root): without them join() fails with
// EPERM and says so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/device_slots.h"

namespace uroce::transport {

class QpnSteering {
  public:
    // Opens the device's socket map (creating it if it does not exist yet) and loads the
    // program, for the context holding `slot`. Returns nullptr with `error` and `err` set if
    // steering is unavailable here (EPERM without privileges, ENOSYS without BPF): the caller
    // must then not share the address (no SO_REUSEPORT), or packets would go astray.
    static std::unique_ptr<QpnSteering> open(const DeviceSlot& slot, std::string& error, int& err);

    // Makes `socket_fd` (SO_REUSEPORT set before it was bound to the device's address) the
    // socket of the slot. Returns 0, or an errno with `error` set.
    int add(int socket_fd, std::string& error);

    // Packets for the QPNs of `further_slot` (a slot this context claimed beyond its first,
    // qpn_space.h) reach this context's socket from now on, until the steering ends. 0 or
    // an errno.
    int route(uint16_t further_slot);

    // QP1's CM MADs (REQ, SIDR REQ) for `service_id` go to this context's socket from now
    // on (qpn_steering.bpf.c). 0; EADDRINUSE while another live context of the device has
    // the service (one whose process died without releasing it loses it here); or an errno.
    int claim_cm_service(uint64_t service_id);
    // Ends claim_cm_service(), if this context still holds the service.
    void release_cm_service(uint64_t service_id);
    // Whether another live context of the device has claimed `service_id`.
    bool cm_service_held_elsewhere(uint64_t service_id) const;

    // Takes the socket out of the map (closing the socket would, too).
    ~QpnSteering();
    QpnSteering(const QpnSteering&) = delete;
    QpnSteering& operator=(const QpnSteering&) = delete;

  private:
    QpnSteering(int map_fd, int services_fd, int routes_fd, int prog_fd, uint32_t slot,
                int owner_pid)
        : map_fd_(map_fd),
          services_fd_(services_fd),
          routes_fd_(routes_fd),
          prog_fd_(prog_fd),
          slot_(slot),
          owner_pid_(owner_pid) {}
    int map_fd_;
    int services_fd_;
    int routes_fd_;
    int prog_fd_;
    uint32_t slot_;
    int owner_pid_;  // a child of fork() must not take its parent's socket out of the map
    std::vector<uint16_t> routed_;  // further slots route() sent here
};

}  // namespace uroce::transport
