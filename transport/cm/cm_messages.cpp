#include "transport/cm/cm_messages.h"

#include <algorithm>
#include <cstring>

#include "transport/cm/bit_field.h"

namespace uroce::transport::cm {

namespace {

// One description of each message serves both directions: a FieldWriter copies the struct's
// fields into the bytes, a FieldReader copies them back, so encode and decode cannot disagree
// on a layout.
class FieldWriter {
  public:
    explicit FieldWriter(std::span<uint8_t> body) : body_(body) {}
    template <class T>
    void field(BitField f, const T& v) {
        set_field(body_, f, static_cast<uint64_t>(v));
    }
    template <size_t N>
    void bytes(size_t offset, const std::array<uint8_t, N>& v) {
        std::memcpy(body_.data() + offset, v.data(), N);
    }

  private:
    std::span<uint8_t> body_;
};

class FieldReader {
  public:
    explicit FieldReader(std::span<const uint8_t> body) : body_(body) {}
    template <class T>
    void field(BitField f, T& v) {
        v = static_cast<T>(get_field(body_, f));
    }
    template <size_t N>
    void bytes(size_t offset, std::array<uint8_t, N>& v) {
        std::memcpy(v.data(), body_.data() + offset, N);
    }

  private:
    std::span<const uint8_t> body_;
};

// Bit offsets below count from the first byte of the MAD data (after the MAD header), as the
// IBA tables do; reserved bits are left zero.

// A REQ path (IBA Table 99, primary at byte 52, alternate at byte 96), relative to its start.
template <class P, class Io>
void path_fields(P& p, Io& io, uint16_t base_bit) {
    const auto at = [base_bit](uint16_t bit, uint8_t width) {
        return BitField{static_cast<uint16_t>(base_bit + bit), width};
    };
    const size_t base_byte = base_bit / 8u;
    io.field(at(0, 16), p.local_lid);
    io.field(at(16, 16), p.remote_lid);
    io.bytes(base_byte + 4, p.local_gid);
    io.bytes(base_byte + 20, p.remote_gid);
    io.field(at(288, 20), p.flow_label);
    io.field(at(314, 6), p.packet_rate);
    io.field(at(320, 8), p.traffic_class);
    io.field(at(328, 8), p.hop_limit);
    io.field(at(336, 4), p.sl);
    io.field(at(340, 1), p.subnet_local);
    io.field(at(344, 5), p.local_ack_timeout);
}

template <class M, class Io>
void fields(M& m, Io& io, CmReq*) {
    io.field(BitField{0, 32}, m.local_comm_id);
    io.field(BitField{64, 64}, m.service_id);
    io.field(BitField{128, 64}, m.local_ca_guid);
    io.field(BitField{224, 32}, m.local_qkey);
    io.field(BitField{256, 24}, m.local_qpn);
    io.field(BitField{280, 8}, m.responder_resources);
    io.field(BitField{288, 24}, m.local_eecn);
    io.field(BitField{312, 8}, m.initiator_depth);
    io.field(BitField{320, 24}, m.remote_eecn);
    io.field(BitField{344, 5}, m.remote_cm_response_timeout);
    io.field(BitField{349, 2}, m.transport);
    io.field(BitField{351, 1}, m.end_to_end_flow_control);
    io.field(BitField{352, 24}, m.starting_psn);
    io.field(BitField{376, 5}, m.local_cm_response_timeout);
    io.field(BitField{381, 3}, m.retry_count);
    io.field(BitField{384, 16}, m.pkey);
    io.field(BitField{400, 4}, m.path_mtu);
    io.field(BitField{404, 1}, m.rdc_exists);
    io.field(BitField{405, 3}, m.rnr_retry_count);
    io.field(BitField{408, 4}, m.max_cm_retries);
    io.field(BitField{412, 1}, m.srq);
    io.field(BitField{413, 3}, m.extended_transport);
    path_fields(m.primary, io, 416);
    path_fields(m.alternate, io, 768);
    io.bytes(140, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmMra*) {
    io.field(BitField{0, 32}, m.local_comm_id);
    io.field(BitField{32, 32}, m.remote_comm_id);
    io.field(BitField{64, 2}, m.message_mraed);
    io.field(BitField{72, 5}, m.service_timeout);
    io.bytes(10, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmRej*) {
    io.field(BitField{0, 32}, m.local_comm_id);
    io.field(BitField{32, 32}, m.remote_comm_id);
    io.field(BitField{64, 2}, m.message_rejected);
    io.field(BitField{72, 7}, m.reject_info_length);
    io.field(BitField{80, 16}, m.reason);
    io.bytes(12, m.additional_reject_info);
    io.bytes(84, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmRep*) {
    io.field(BitField{0, 32}, m.local_comm_id);
    io.field(BitField{32, 32}, m.remote_comm_id);
    io.field(BitField{64, 32}, m.local_qkey);
    io.field(BitField{96, 24}, m.local_qpn);
    io.field(BitField{128, 24}, m.local_eecn);
    io.field(BitField{160, 24}, m.starting_psn);
    io.field(BitField{192, 8}, m.responder_resources);
    io.field(BitField{200, 8}, m.initiator_depth);
    io.field(BitField{208, 5}, m.target_ack_delay);
    io.field(BitField{213, 2}, m.failover_accepted);
    io.field(BitField{215, 1}, m.end_to_end_flow_control);
    io.field(BitField{216, 3}, m.rnr_retry_count);
    io.field(BitField{219, 1}, m.srq);
    io.field(BitField{224, 64}, m.local_ca_guid);
    io.bytes(36, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmRtu*) {
    io.field(BitField{0, 32}, m.local_comm_id);
    io.field(BitField{32, 32}, m.remote_comm_id);
    io.bytes(8, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmDreq*) {
    io.field(BitField{0, 32}, m.local_comm_id);
    io.field(BitField{32, 32}, m.remote_comm_id);
    io.field(BitField{64, 24}, m.remote_qpn);
    io.bytes(12, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmDrep*) {
    io.field(BitField{0, 32}, m.local_comm_id);
    io.field(BitField{32, 32}, m.remote_comm_id);
    io.bytes(8, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmSidrReq*) {
    io.field(BitField{0, 32}, m.request_id);
    io.field(BitField{32, 16}, m.pkey);
    io.field(BitField{64, 64}, m.service_id);
    io.bytes(16, m.private_data);
}

template <class M, class Io>
void fields(M& m, Io& io, CmSidrRep*) {
    io.field(BitField{0, 32}, m.request_id);
    io.field(BitField{32, 8}, m.status);
    io.field(BitField{40, 8}, m.additional_info_length);
    io.field(BitField{64, 24}, m.qpn);
    io.field(BitField{96, 64}, m.service_id);
    io.field(BitField{160, 32}, m.qkey);
    io.bytes(24, m.class_port_info);
    io.bytes(96, m.private_data);
}

// The common MAD header (IBA 13.4.2), relative to the MAD's first byte.
template <class H, class Io>
void header_fields(H& h, Io& io) {
    io.field(BitField{0, 8}, h.base_version);
    io.field(BitField{8, 8}, h.management_class);
    io.field(BitField{16, 8}, h.class_version);
    io.field(BitField{24, 8}, h.method);
    io.field(BitField{32, 16}, h.status);
    io.field(BitField{48, 16}, h.class_specific);
    io.field(BitField{64, 64}, h.transaction_id);
    io.field(BitField{128, 16}, h.attribute_id);
    io.field(BitField{160, 32}, h.attribute_modifier);
}

template <class Body>
void decode_body(std::span<const uint8_t> data, CmBody& out) {
    Body b{};
    FieldReader r(data);
    fields(b, r, static_cast<Body*>(nullptr));
    out = b;
}

}  // namespace

CmAttribute attribute_of(const CmBody& body) {
    static constexpr CmAttribute kByIndex[] = {
        CmAttribute::Req,  CmAttribute::Mra,     CmAttribute::Rej,
        CmAttribute::Rep,  CmAttribute::Rtu,     CmAttribute::Dreq,
        CmAttribute::Drep, CmAttribute::SidrReq, CmAttribute::SidrRep,
    };
    static_assert(std::size(kByIndex) == std::variant_size_v<CmBody>);
    return kByIndex[body.index()];
}

std::array<uint8_t, kMadBytes> encode_cm_mad(const CmMad& mad) {
    std::array<uint8_t, kMadBytes> out{};
    MadHeader h = mad.header;
    h.attribute_id = static_cast<uint16_t>(attribute_of(mad.body));
    FieldWriter hw(out);
    header_fields(h, hw);
    FieldWriter bw(std::span<uint8_t>(out).subspan(kMadHeaderBytes));
    std::visit(
        [&bw](const auto& b) {
            using Body = std::decay_t<decltype(b)>;
            fields(b, bw, static_cast<Body*>(nullptr));
        },
        mad.body);
    return out;
}

const char* to_string(CmDecodeError e) {
    switch (e) {
        case CmDecodeError::None:
            return "none";
        case CmDecodeError::TooShort:
            return "shorter than a MAD";
        case CmDecodeError::BadBaseVersion:
            return "MAD base version is not 1";
        case CmDecodeError::NotCm:
            return "not the CM management class";
        case CmDecodeError::BadClassVersion:
            return "CM class version is not 2";
        case CmDecodeError::BadMethod:
            return "method is not Send";
        case CmDecodeError::UnsupportedAttribute:
            return "unsupported CM attribute";
    }
    return "?";
}

CmDecodeError decode_cm_mad(std::span<const uint8_t> bytes, CmMad& out) {
    if (bytes.size() < kMadBytes) return CmDecodeError::TooShort;
    MadHeader h;
    FieldReader hr(bytes);
    header_fields(h, hr);
    if (h.base_version != kMadBaseVersion) return CmDecodeError::BadBaseVersion;
    if (h.management_class != kCmManagementClass) return CmDecodeError::NotCm;
    if (h.class_version != kCmClassVersion) return CmDecodeError::BadClassVersion;
    if (h.method != kMadMethodSend) return CmDecodeError::BadMethod;
    const auto data = bytes.subspan(kMadHeaderBytes, kMadDataBytes);
    switch (static_cast<CmAttribute>(h.attribute_id)) {
        case CmAttribute::Req:
            decode_body<CmReq>(data, out.body);
            break;
        case CmAttribute::Mra:
            decode_body<CmMra>(data, out.body);
            break;
        case CmAttribute::Rej:
            decode_body<CmRej>(data, out.body);
            break;
        case CmAttribute::Rep:
            decode_body<CmRep>(data, out.body);
            break;
        case CmAttribute::Rtu:
            decode_body<CmRtu>(data, out.body);
            break;
        case CmAttribute::Dreq:
            decode_body<CmDreq>(data, out.body);
            break;
        case CmAttribute::Drep:
            decode_body<CmDrep>(data, out.body);
            break;
        case CmAttribute::SidrReq:
            decode_body<CmSidrReq>(data, out.body);
            break;
        case CmAttribute::SidrRep:
            decode_body<CmSidrRep>(data, out.body);
            break;
        default:
            return CmDecodeError::UnsupportedAttribute;
    }
    out.header = h;
    return CmDecodeError::None;
}

}  // namespace uroce::transport::cm
