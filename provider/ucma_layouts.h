// Conversions between the RDMA CM's values (transport/cm/rdma_cm.h) and the kernel's ucma
// layouts (<rdma/rdma_user_cm.h>): socket addresses in and out, path records, and the
// parameters of connection and UD events.
#pragma once

#include <infiniband/sa.h>
#include <netinet/in.h>  // before the kernel headers, whose in6.h defers to it
#include <rdma/ib_user_sa.h>
#include <rdma/rdma_user_cm.h>

#include <cstddef>
#include <cstdint>

#include "transport/cm/rdma_cm.h"

namespace uroce::provider::ucma {

// An AF_IB address's service ID (network order), kept for the identifier that bound it.
struct IbService {
    bool af_ib = false;  // bound with an AF_IB address (librdmacm's probe for AF_IB support)
    uint64_t sid = 0;
};

// An address librdmacm passes: AF_INET, AF_INET6 (the unspecified address, or IPv4-mapped),
// or AF_IB (service ID only; only where `ib` is given, which then records it). 0, EINVAL
// (too short for its family) or EAFNOSUPPORT (what uroce does not route: IPv6 proper).
int parse_address(const void* data, size_t size, transport::cm::CmAddress& out, IbService* ib);

// Writes an IPv4 address as a sockaddr_in (the rest of `out` zero); returns its size.
uint16_t put_address(const transport::cm::CmAddress& a, void* out, size_t room);
// Writes a GID as a sockaddr_ib with the identifier's service ID; returns its size.
uint16_t put_ib_address(const IbService& service, const transport::cm::Gid& gid, void* out,
                        size_t room);

// The RoCE path between the identifier's two addresses, in QUERY_ROUTE's and QUERY(PATH)'s
// layouts.
void fill_path_rec(ib_user_path_rec& p, const transport::cm::CmIdInfo& info);
void fill_path_record(ibv_path_record& p, const transport::cm::CmIdInfo& info);

// A connection event's parameters, and a UD identifier's (the peer's QP, Q_Key and address
// vector: on RoCE a GRH to its GID).
void fill_conn(rdma_ucm_conn_param& out, const transport::cm::CmConnParam& in);
void fill_ud(rdma_ucm_ud_param& out, const transport::cm::CmIdEvent& ev);
// The parameters CONNECT and ACCEPT carry.
transport::cm::CmConnParam conn_param(const rdma_ucm_conn_param& p);

}  // namespace uroce::provider::ucma
