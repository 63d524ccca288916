/* The kernel half of QPN steering (see qpn_steering.h), compiled for the BPF target.
 *
 * Runs for every datagram that reaches the device's SO_REUSEPORT group on IP:4791 and
 * picks the socket of the context whose slot is the top 12 bits of the destination QPN in
 * the packet's BTH. A packet too short to hold a BTH, or for a slot no context holds, goes
 * where the kernel's own reuseport choice sends it: one context gets it, refuses it and
 * counts it (rx_malformed, rx_unknown_qp), as a device of one context would. */
#include <linux/bpf.h>
/* bpf_helpers.h needs the types linux/bpf.h brings */
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, __u64);
} uroce_slots SEC(".maps");

enum {
    kUdpHeader = 8,
    kBthBytes = 12,
    kDestQpAt = 5, /* BTH bytes 5..7: destination QP, most significant byte first */
};

SEC("sk_reuseport")
int uroce_steer_by_qpn(struct sk_reuseport_md* md) {
    const __u8* udp = md->data; /* the reuseport context starts at the UDP header */
    const __u8* end = md->data_end;
    if (udp + kUdpHeader + kBthBytes > end) return SK_PASS;
    __u32 slot = (__u32)udp[kUdpHeader + kDestQpAt] << 4 | udp[kUdpHeader + kDestQpAt + 1] >> 4;
    bpf_sk_select_reuseport(md, &uroce_slots, &slot, 0);
    return SK_PASS; /* selected, or left to the kernel's choice if the slot has no socket */
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
