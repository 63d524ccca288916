// Which of this host's addresses its routing sends from to reach a destination.
//
// RDMA CM resolves a destination to the device that will carry the connection. A device is
// registered for the whole host, but an address belongs to one network namespace: in the
// namespace of a client whose source address is not given, the device to use is the one
// whose address the namespace's routing picks for the destination, not a device that has the
// destination address itself in another namespace (docs/rdma-cm.md). The kernel answers
// without sending anything: a UDP socket is bound to an address of its namespace only, and
// one connected to a destination is given the source address the route says.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <cstdint>
#include <optional>

namespace uroce::transport::cm {

// Whether `ip` (IPv4, host order) is an address of the calling thread's network namespace
// (a socket can be bound to it; all of 127.0.0.0/8 is). Never 0.0.0.0, broadcast or
// multicast.
bool is_local_address(uint32_t ip);

// The source address (IPv4, host order) the calling thread's network namespace routes
// `dst` from; nullopt when it has no route to `dst` (or no socket could be made). For a
// destination of the namespace itself the kernel picks its own (127.0.0.1 for all of
// loopback): ask is_local_address() first.
std::optional<uint32_t> route_source(uint32_t dst);

}  // namespace uroce::transport::cm
