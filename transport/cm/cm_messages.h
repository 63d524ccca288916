// IBA Communication Management messages (IBA 12.6): the MADs two CMs exchange on QP1 to set
// up and tear down a connection (REQ, MRA, REJ, REP, RTU, DREQ, DREP) or to resolve a UD
// service (SIDR REQ/REP).
//
// Every CM message is a 256-byte MAD: a 24-byte common MAD header, then the message itself
// in the 232 bytes of MAD data. Each struct below holds the fields of one message as the spec
// names them, host order; encode_cm_mad() lays one out byte for byte as the Linux kernel's CM
// does and decode_cm_mad() reads one back, refusing anything that is not a CM MAD uroce can
// act on. Private data always travels at its full size (zero-filled): how much of it the
// consumer meant is the consumer's business (RDMA CM puts its own header in front, see
// ip_cm_header.h).
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

namespace uroce::transport::cm {

inline constexpr size_t kMadBytes = 256;
inline constexpr size_t kMadHeaderBytes = 24;
inline constexpr size_t kMadDataBytes = kMadBytes - kMadHeaderBytes;

inline constexpr uint8_t kMadBaseVersion = 1;
inline constexpr uint8_t kCmManagementClass = 0x07;
inline constexpr uint8_t kCmClassVersion = 2;
inline constexpr uint8_t kMadMethodSend = 0x03;  // CM messages are all unsolicited Sends

// QP1, the General Services Interface, and its well-known Q_Key (IBA 9.6.1.1).
inline constexpr uint32_t kGsiQpn = 1;
inline constexpr uint32_t kGsiQkey = 0x80010000;

// MAD attribute IDs of the CM class (IBA 12.6.1).
enum class CmAttribute : uint16_t {
    Req = 0x0010,
    Mra = 0x0011,
    Rej = 0x0012,
    Rep = 0x0013,
    Rtu = 0x0014,
    Dreq = 0x0015,
    Drep = 0x0016,
    SidrReq = 0x0017,
    SidrRep = 0x0018,
    Lap = 0x0019,  // alternate paths: not supported, a LAP is answered by nothing
    Apr = 0x001a,
};

// Private data sizes (IBA 12.6.5 ff.).
inline constexpr size_t kReqPrivateBytes = 92;
inline constexpr size_t kMraPrivateBytes = 222;
inline constexpr size_t kRejPrivateBytes = 148;
inline constexpr size_t kRejAriBytes = 72;
inline constexpr size_t kRepPrivateBytes = 196;
inline constexpr size_t kRtuPrivateBytes = 224;
inline constexpr size_t kDreqPrivateBytes = 220;
inline constexpr size_t kDrepPrivateBytes = 224;
inline constexpr size_t kSidrReqPrivateBytes = 216;
inline constexpr size_t kSidrRepPrivateBytes = 136;
inline constexpr size_t kClassPortInfoBytes = 72;

using Gid = std::array<uint8_t, 16>;

// The common MAD header, as a CM fills it.
struct MadHeader {
    uint8_t base_version = kMadBaseVersion;
    uint8_t management_class = kCmManagementClass;
    uint8_t class_version = kCmClassVersion;
    uint8_t method = kMadMethodSend;
    uint16_t status = 0;
    uint16_t class_specific = 0;
    uint64_t transaction_id = 0;
    uint16_t attribute_id = 0;
    uint32_t attribute_modifier = 0;

    bool operator==(const MadHeader&) const = default;
};

// Transport service types a REQ can ask for (REQ "Transport Service Type").
enum class CmTransport : uint8_t { Rc = 0, Uc = 1, Rd = 2, Extended = 3 };
// REQ "Extended Transport Type" when the service type is Extended.
inline constexpr uint8_t kCmExtendedTransportXrc = 1;

// One path of a REQ (primary or alternate). RoCE has no LIDs: the kernel writes the
// permissive LID 0xffff into a RoCE path and addresses the peer by GID.
struct CmPath {
    uint16_t local_lid = 0;
    uint16_t remote_lid = 0;
    Gid local_gid{};
    Gid remote_gid{};
    uint32_t flow_label = 0;  // 20 bits
    uint8_t packet_rate = 0;  // 6 bits
    uint8_t traffic_class = 0;
    uint8_t hop_limit = 0;
    uint8_t sl = 0;  // 4 bits
    bool subnet_local = false;
    uint8_t local_ack_timeout = 0;  // 5 bits, 4.096 us * 2^value

    bool operator==(const CmPath&) const = default;
};

struct CmReq {
    uint32_t local_comm_id = 0;
    uint64_t service_id = 0;
    uint64_t local_ca_guid = 0;
    uint32_t local_qkey = 0;
    uint32_t local_qpn = 0;  // 24 bits
    uint8_t responder_resources = 0;
    uint32_t local_eecn = 0;  // 24 bits
    uint8_t initiator_depth = 0;
    uint32_t remote_eecn = 0;                // 24 bits
    uint8_t remote_cm_response_timeout = 0;  // 5 bits
    CmTransport transport = CmTransport::Rc;
    bool end_to_end_flow_control = false;
    uint32_t starting_psn = 0;              // 24 bits
    uint8_t local_cm_response_timeout = 0;  // 5 bits
    uint8_t retry_count = 0;                // 3 bits
    uint16_t pkey = 0xffff;
    uint8_t path_mtu = 0;  // 4 bits, IBV_MTU_* numbering (3 = 1024)
    bool rdc_exists = false;
    uint8_t rnr_retry_count = 0;  // 3 bits
    uint8_t max_cm_retries = 0;   // 4 bits
    bool srq = false;
    uint8_t extended_transport = 0;  // 3 bits
    CmPath primary;
    CmPath alternate;
    std::array<uint8_t, kReqPrivateBytes> private_data{};

    bool operator==(const CmReq&) const = default;
};

// Which message an MRA or a REJ answers. Code 2 is a LAP in an MRA, "no message" in a REJ
// (the kernel's CM_MSG_RESPONSE_OTHER); 3 is reserved in both.
enum class CmMessageKind : uint8_t { Req = 0, Rep = 1, Lap = 2, Other = 2 };

struct CmMra {
    uint32_t local_comm_id = 0;
    uint32_t remote_comm_id = 0;
    CmMessageKind message_mraed = CmMessageKind::Req;
    uint8_t service_timeout = 0;  // 5 bits
    std::array<uint8_t, kMraPrivateBytes> private_data{};

    bool operator==(const CmMra&) const = default;
};

// REJ reasons uroce sends or acts on (IBA Table 103).
enum class CmRejectReason : uint16_t {
    NoQp = 1,
    NoEec = 2,
    NoResources = 3,
    Timeout = 4,
    UnsupportedRequest = 5,
    InvalidCommId = 6,
    InvalidCommInstance = 7,
    InvalidServiceId = 8,
    InvalidTransportType = 9,
    StaleConnection = 10,
    RdcNotExist = 11,
    InvalidGid = 12,
    InvalidLid = 13,
    InvalidSl = 14,
    InvalidTrafficClass = 15,
    InvalidHopLimit = 16,
    InvalidPacketRate = 17,
    InvalidAltGid = 18,
    InvalidAltLid = 19,
    InvalidAltSl = 20,
    InvalidAltTrafficClass = 21,
    InvalidAltHopLimit = 22,
    InvalidAltPacketRate = 23,
    PortRedirect = 24,
    InvalidMtu = 26,
    InsufficientRespResources = 27,
    ConsumerReject = 28,
    InvalidRnrRetry = 29,
    DuplicateLocalCommId = 30,
    InvalidClassVersion = 31,
    InvalidFlowLabel = 32,
    InvalidAltFlowLabel = 33,
};

struct CmRej {
    uint32_t local_comm_id = 0;
    uint32_t remote_comm_id = 0;
    CmMessageKind message_rejected = CmMessageKind::Req;
    uint8_t reject_info_length = 0;  // 7 bits: bytes of `additional_reject_info` that count
    uint16_t reason = 0;             // a CmRejectReason, or a value uroce does not know
    std::array<uint8_t, kRejAriBytes> additional_reject_info{};
    std::array<uint8_t, kRejPrivateBytes> private_data{};

    bool operator==(const CmRej&) const = default;
};

struct CmRep {
    uint32_t local_comm_id = 0;
    uint32_t remote_comm_id = 0;
    uint32_t local_qkey = 0;
    uint32_t local_qpn = 0;  // 24 bits
    uint32_t local_eecn = 0;
    uint32_t starting_psn = 0;  // 24 bits
    uint8_t responder_resources = 0;
    uint8_t initiator_depth = 0;
    uint8_t target_ack_delay = 0;   // 5 bits
    uint8_t failover_accepted = 0;  // 2 bits
    bool end_to_end_flow_control = false;
    uint8_t rnr_retry_count = 0;  // 3 bits
    bool srq = false;
    uint64_t local_ca_guid = 0;
    std::array<uint8_t, kRepPrivateBytes> private_data{};

    bool operator==(const CmRep&) const = default;
};

struct CmRtu {
    uint32_t local_comm_id = 0;
    uint32_t remote_comm_id = 0;
    std::array<uint8_t, kRtuPrivateBytes> private_data{};

    bool operator==(const CmRtu&) const = default;
};

struct CmDreq {
    uint32_t local_comm_id = 0;
    uint32_t remote_comm_id = 0;
    uint32_t remote_qpn = 0;  // 24 bits: the QP (or EEC) being disconnected, the receiver's own
    std::array<uint8_t, kDreqPrivateBytes> private_data{};

    bool operator==(const CmDreq&) const = default;
};

struct CmDrep {
    uint32_t local_comm_id = 0;
    uint32_t remote_comm_id = 0;
    std::array<uint8_t, kDrepPrivateBytes> private_data{};

    bool operator==(const CmDrep&) const = default;
};

struct CmSidrReq {
    uint32_t request_id = 0;
    uint16_t pkey = 0xffff;
    uint64_t service_id = 0;
    std::array<uint8_t, kSidrReqPrivateBytes> private_data{};

    bool operator==(const CmSidrReq&) const = default;
};

// SIDR REP status (IBA Table 110).
enum class SidrStatus : uint8_t {
    Ok = 0,
    ServiceIdNotSupported = 1,
    Rejected = 2,
    NoQp = 3,
    Redirect = 4,
    UnsupportedVersion = 5,
};

struct CmSidrRep {
    uint32_t request_id = 0;
    uint8_t status = 0;  // a SidrStatus
    uint8_t additional_info_length = 0;
    uint32_t qpn = 0;  // 24 bits
    uint64_t service_id = 0;
    uint32_t qkey = 0;
    std::array<uint8_t, kClassPortInfoBytes> class_port_info{};
    std::array<uint8_t, kSidrRepPrivateBytes> private_data{};

    bool operator==(const CmSidrRep&) const = default;
};

using CmBody =
    std::variant<CmReq, CmMra, CmRej, CmRep, CmRtu, CmDreq, CmDrep, CmSidrReq, CmSidrRep>;

struct CmMad {
    MadHeader header;  // attribute_id follows the body: encode_cm_mad() writes it
    CmBody body;

    bool operator==(const CmMad&) const = default;
};

// The attribute ID of a body.
CmAttribute attribute_of(const CmBody& body);

// The 256 bytes of a CM MAD. The header's attribute ID is taken from the body.
std::array<uint8_t, kMadBytes> encode_cm_mad(const CmMad& mad);

enum class CmDecodeError {
    None = 0,
    TooShort,              // fewer than 256 bytes
    BadBaseVersion,        // MAD base version != 1
    NotCm,                 // another management class
    BadClassVersion,       // CM class version != 2
    BadMethod,             // not a Send
    UnsupportedAttribute,  // LAP, APR, ClassPortInfo or an unknown attribute
};
const char* to_string(CmDecodeError e);

// Reads a CM MAD from the payload of a QP1 UD SEND. Bytes past the 256th are ignored.
CmDecodeError decode_cm_mad(std::span<const uint8_t> bytes, CmMad& out);

}  // namespace uroce::transport::cm
