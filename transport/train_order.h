// The order in which the engine takes the packets of a train it read whole (UDP_GRO).
//
// A responder's ACK goes out when the application answers (engine_held_acks.cpp). On a NIC
// the ACK of a request reaches the requester before the answer does, and applications count
// on it: `ib_send_lat -e` waits for its send completion's event, then for the answer's, with
// a send CQ of one entry. A train that carries requests and then an ACK (a SEND answer and
// its ACK) is taken ACK first when one of the requests completes a receive (a SEND, a WRITE
// with immediate): the requester's completion comes before the receive completion, whatever
// their order on the wire. Only an ACK that closes a train of requests: requests and the ACK
// belong to different PSN spaces (the peer's requests, our own requests' acknowledgement),
// so neither depends on the other; a READ response or atomic ACK ahead of an ACK carries data
// the ACK also acknowledges, and must come first. Requests that complete nothing (a WRITE
// answer and its ACK, as ib_write_lat sends them) keep wire order: the WRITE's data is in
// memory before the ACK's completion sends the requester to watch that memory.
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace uroce::transport {

// The offset of `train`'s last packet (`step` bytes each, the last possibly shorter) if it
// is an RC or XRC ACK, every packet before it a request, and one of those ends a SEND or a
// WRITE with immediate; 0 otherwise (also for a train of one packet).
size_t closing_ack_at(std::span<const uint8_t> train, size_t step);

}  // namespace uroce::transport
