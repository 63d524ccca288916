// The addresses of this network namespace, and the one its routing sends from.
//
// A uroce device is registered for the whole host, but an address belongs to one network
// namespace: `uroce add` warns when the address is not this namespace's (the provider could
// not bind it), and RDMA CM resolves a destination to the device whose address the
// namespace's routing sends from, not to a device registered with the destination address in
// another namespace (docs/rdma-cm.md). The kernel answers both without sending anything: a
// UDP socket binds to an address of its namespace only, and one connected to a destination is
// given the source address the route says.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <optional>

#include "uroce/ip_address.h"

namespace uroce::transport {

// False when `ip` is known not to be an address of the calling thread's network namespace:
// a socket cannot be bound to it (EADDRNOTAVAIL), or it is the any, broadcast or a multicast
// address, none of which a host has. All of 127.0.0.0/8 is local. True when it cannot tell
// (no socket).
bool is_local_address(const IpAddress& ip);

// The source address the calling thread's network namespace routes `dst` from; nullopt when
// it has no route (or no socket could be made). For a destination of the namespace itself the
// kernel picks its own (127.0.0.1 for all of loopback): ask is_local_address() first.
std::optional<IpAddress> route_source(const IpAddress& dst);

}  // namespace uroce::transport
