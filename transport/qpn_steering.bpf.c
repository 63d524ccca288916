/* The kernel half of QPN steering (see qpn_steering.h), compiled for the BPF target.
 *
 * Runs for every datagram that reaches the device's SO_REUSEPORT group on IP:4791 and
 * picks the socket of the context whose slot is the top 12 bits of the destination QPN in
 * the packet's BTH. A packet too short to hold a BTH, or for a slot no context holds, goes
 * where the kernel's own reuseport choice sends it: one context gets it, refuses it and
 * counts it (rx_malformed, rx_unknown_qp), as a device of one context would.
 *
 * A context with more QPs than one slot numbers holds further slots: uroce_routes maps each of
 * those to the slot whose socket takes their packets (0: the slot's own socket).
 *
 * QP1 belongs to no context: a CM MAD for it goes to the context its content names. A REQ or
 * SIDR REQ names a service, which the listening context entered in uroce_cm_svc; every
 * other CM message names the receiver's comm ID (SIDR REP: its request ID), whose top 12 bits
 * are the slot of the context that handed it out. */
#include <linux/bpf.h>
/* bpf_helpers.h needs the types linux/bpf.h brings */
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, __u64);
} uroce_slots SEC(".maps");

/* Further slot of a context -> the slot its packets go to (0: none, the slot's own). */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, __u32);
} uroce_routes SEC(".maps");

/* Listened CM services: service ID as on the wire (8 bytes, big-endian) -> slot. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, __u64);
    __type(value, __u32);
} uroce_cm_svc SEC(".maps");

enum {
    kUdpHeader = 8,
    kBthBytes = 12,
    kDestQpAt = 5, /* BTH bytes 5..7: destination QP, most significant byte first */
    kUdSendOnly = 0x64,
    kMadAt = kUdpHeader + kBthBytes + 8, /* after the DETH */
    kMadClassAt = 1,
    kCmClass = 0x07,
    kMadAttrAt = 16,      /* attribute ID, 2 bytes */
    kCmFirstFieldAt = 24, /* the message: comm ID, or SIDR request ID */
    kCmSecondFieldAt = 28,
    kCmServiceIdAt = 32, /* REQ and SIDR REQ */
    kMadNeeded = 40,     /* bytes of the MAD read below */
    kCmIdSlotShift = 20, /* a comm ID's top 12 bits are its context's slot */
};

static __u32 be32_at(const __u8* p) {
    return (__u32)p[0] << 24 | (__u32)p[1] << 16 | (__u32)p[2] << 8 | p[3];
}

/* A CM MAD no listener or live context claims: to the context registered under service ID
 * 0 (any context that runs a CM), which answers what IBA says (a REJ for an unknown service,
 * a DREP for a forgotten connection) or drops and counts; without one, the kernel's choice. */
static int to_any_cm(struct sk_reuseport_md* md) {
    __u64 any = 0;
    const __u32* cm = bpf_map_lookup_elem(&uroce_cm_svc, &any);
    if (cm) {
        __u32 slot = *cm;
        bpf_sk_select_reuseport(md, &uroce_slots, &slot, 0);
    }
    return SK_PASS;
}

SEC("sk_reuseport")
int uroce_steer_by_qpn(struct sk_reuseport_md* md) {
    const __u8* udp = md->data; /* the reuseport context starts at the UDP header */
    const __u8* end = md->data_end;
    /* Copied out, not read in place: a train of GSO segments (transmit_batch.h) may hold
     * no more than its headers in the linear part the context points at. */
    __u8 bth[kBthBytes];
    if (bpf_skb_load_bytes(md, kUdpHeader, bth, kBthBytes) != 0) return SK_PASS;
    __u32 slot = (__u32)bth[kDestQpAt] << 4 | bth[kDestQpAt + 1] >> 4;
    if (slot == 0) {
        /* QP1 only, UD SEND Only carrying a CM MAD; anything else: the kernel's choice. */
        if (bth[kDestQpAt + 1] != 0 || bth[kDestQpAt + 2] != 1 || bth[0] != kUdSendOnly)
            return SK_PASS;
        /* CM MADs are single UD datagrams, never GSO trains: read in place. */
        const __u8* mad = udp + kMadAt;
        if (mad + kMadNeeded > end || mad[kMadClassAt] != kCmClass) return SK_PASS;
        const __u16 attr = (__u16)(mad[kMadAttrAt] << 8 | mad[kMadAttrAt + 1]);
        if (attr == 0x10 || attr == 0x17) { /* REQ, SIDR REQ */
            __u64 key;
            __builtin_memcpy(&key, mad + kCmServiceIdAt, sizeof key);
            const __u32* listener = bpf_map_lookup_elem(&uroce_cm_svc, &key);
            if (!listener) return to_any_cm(md);
            slot = *listener;
        } else if (attr == 0x18) { /* SIDR REP */
            slot = be32_at(mad + kCmFirstFieldAt) >> kCmIdSlotShift;
        } else if (attr >= 0x11 && attr <= 0x16) { /* MRA, REJ, REP, RTU, DREQ, DREP */
            slot = be32_at(mad + kCmSecondFieldAt) >> kCmIdSlotShift;
        } else {
            return to_any_cm(md);
        }
        /* The context a CM MAD names may be gone (its process died): another CM answers
         * for it, as the protocol says (REJ, DREP), instead of a context without QP1. */
        if (bpf_sk_select_reuseport(md, &uroce_slots, &slot, 0) != 0) return to_any_cm(md);
        return SK_PASS;
    }
    const __u32* to = bpf_map_lookup_elem(&uroce_routes, &slot);
    if (to && *to) slot = *to;
    bpf_sk_select_reuseport(md, &uroce_slots, &slot, 0);
    return SK_PASS; /* selected, or left to the kernel's choice if the slot has no socket */
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
