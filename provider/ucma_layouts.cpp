// Conversions between the RDMA CM's values and the kernel's ucma layouts (ucma_layouts.h).
#include "provider/ucma_layouts.h"

#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/ib.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace uroce::provider::ucma {

namespace tcm = transport::cm;

int parse_address(const void* data, size_t size, tcm::CmAddress& out, IbService* ib) {
    sa_family_t family = 0;
    if (size < sizeof family) return EINVAL;
    std::memcpy(&family, data, sizeof family);
    if (family == AF_INET && size >= sizeof(sockaddr_in)) {
        sockaddr_in sin;
        std::memcpy(&sin, data, sizeof sin);
        out = {ntohl(sin.sin_addr.s_addr), ntohs(sin.sin_port)};
        return 0;
    }
    if (family == AF_INET6 && size >= sizeof(sockaddr_in6)) {
        sockaddr_in6 sin6;
        std::memcpy(&sin6, data, sizeof sin6);
        out.port = ntohs(sin6.sin6_port);
        if (IN6_IS_ADDR_UNSPECIFIED(&sin6.sin6_addr)) {
            out.ip = 0;
            return 0;
        }
        if (IN6_IS_ADDR_V4MAPPED(&sin6.sin6_addr)) {
            uint32_t be = 0;
            std::memcpy(&be, sin6.sin6_addr.s6_addr + 12, 4);
            out.ip = ntohl(be);
            return 0;
        }
        return EAFNOSUPPORT;
    }
    if (family == AF_IB && size >= sizeof(sockaddr_ib) && ib != nullptr) {
        sockaddr_ib sib;
        std::memcpy(&sib, data, sizeof sib);
        out = {0, static_cast<uint16_t>(be64toh(sib.sib_sid) & 0xffff)};
        ib->af_ib = true;
        ib->sid = sib.sib_sid;
        return 0;
    }
    return family == AF_INET || family == AF_INET6 || family == AF_IB ? EINVAL : EAFNOSUPPORT;
}

uint16_t put_address(const tcm::CmAddress& a, void* out, size_t room) {
    std::memset(out, 0, room);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(a.port);
    sin.sin_addr.s_addr = htonl(a.ip);
    std::memcpy(out, &sin, std::min(room, sizeof sin));
    return sizeof sin;
}

uint16_t put_ib_address(const IbService& service, const tcm::Gid& gid, void* out, size_t room) {
    std::memset(out, 0, room);
    sockaddr_ib sib{};
    sib.sib_family = AF_IB;
    sib.sib_pkey = htons(0xffff);
    std::memcpy(&sib.sib_addr, gid.data(), 16);
    sib.sib_sid = service.sid;
    sib.sib_sid_mask = service.af_ib ? htobe64(~0ull) : 0;
    std::memcpy(out, &sib, std::min(room, sizeof sib));
    return sizeof sib;
}

void fill_path_rec(ib_user_path_rec& p, const tcm::CmIdInfo& info) {
    std::memcpy(p.dgid, info.dgid.data(), 16);
    std::memcpy(p.sgid, info.sgid.data(), 16);
    p.dlid = htons(0xffff);  // permissive: RoCE has no LIDs
    p.slid = htons(0xffff);
    p.flow_label = htonl(info.flow_label);
    p.reversible = 1;
    p.mtu = info.path_mtu;
    p.pkey = htons(0xffff);
    p.hop_limit = info.hop_limit;
    p.numb_path = 1;
    p.mtu_selector = 2;  // exactly
    p.rate_selector = 2;
    p.rate = 3;  // 10 Gb/s, as rxe reports
    p.packet_life_time_selector = 2;
    p.packet_life_time = info.packet_life_time;
}

void fill_path_record(ibv_path_record& p, const tcm::CmIdInfo& info) {
    std::memset(&p, 0, sizeof p);
    std::memcpy(p.dgid.raw, info.dgid.data(), 16);
    std::memcpy(p.sgid.raw, info.sgid.data(), 16);
    p.dlid = htons(0xffff);
    p.slid = htons(0xffff);
    p.flowlabel_hoplimit = htonl((info.flow_label << 8) | info.hop_limit);
    p.reversible_numpath = 0x80 | 1;
    p.pkey = htons(0xffff);
    p.mtu = static_cast<uint8_t>((2u << 6) | info.path_mtu);
    p.rate = static_cast<uint8_t>((2u << 6) | 3u);
    p.packetlifetime = static_cast<uint8_t>((2u << 6) | info.packet_life_time);
}

void fill_conn(rdma_ucm_conn_param& out, const tcm::CmConnParam& in) {
    out.qp_num = in.qp_num;
    out.srq = in.srq;
    out.responder_resources = in.responder_resources;
    out.initiator_depth = in.initiator_depth;
    out.flow_control = in.flow_control;
    out.retry_count = in.retry_count;
    out.rnr_retry_count = in.rnr_retry_count;
    const size_t n = std::min(in.private_data.size(), sizeof out.private_data);
    if (n != 0) std::memcpy(out.private_data, in.private_data.data(), n);  // data() may be null
    out.private_data_len = static_cast<uint8_t>(n);
    out.valid = 1;
}

void fill_ud(rdma_ucm_ud_param& out, const tcm::CmIdEvent& ev) {
    out.qp_num = ev.param.qp_num;
    out.qkey = ev.param.qkey;
    std::memcpy(out.ah_attr.grh.dgid, ev.dgid.data(), 16);
    out.ah_attr.grh.flow_label = ev.flow_label;
    out.ah_attr.grh.hop_limit = ev.hop_limit;
    out.ah_attr.grh.sgid_index = 0;
    out.ah_attr.is_global = 1;
    out.ah_attr.port_num = 1;
    const size_t n = std::min(ev.param.private_data.size(), sizeof out.private_data);
    if (n != 0) std::memcpy(out.private_data, ev.param.private_data.data(), n);
    out.private_data_len = static_cast<uint8_t>(n);
}

tcm::CmConnParam conn_param(const rdma_ucm_conn_param& p) {
    tcm::CmConnParam out;
    out.qp_num = p.qp_num;
    out.srq = p.srq != 0;
    out.responder_resources = p.responder_resources;
    out.initiator_depth = p.initiator_depth;
    out.flow_control = p.flow_control;
    out.retry_count = p.retry_count;
    out.rnr_retry_count = p.rnr_retry_count;
    out.private_data.assign(
        p.private_data,
        p.private_data + std::min<size_t>(p.private_data_len, sizeof p.private_data));
    return out;
}

}  // namespace uroce::provider::ucma
