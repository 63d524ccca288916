// Responder resources (IBA ch. 9.7): the RDMA READ and atomic requests a responder has
// accepted and may still have to answer, at most max_dest_rd_atomic of them.
//
// An atomic's resource is its replay cache: the original value it returned. A duplicate of
// the atomic (its acknowledgement was lost) is answered from there, never executed again.
//
// A resource is the queue entry of its READ's responses too: the responder sends them from
// here a few packets at a time (RcQp::send_responses), and a duplicate request is answered
// only from the resource it matches, by moving that resource's cursor back to the PSN asked
// for, never by adding a second copy of the responses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace uroce::transport {

// Responder resources a QP can be given (rxe advertises 128).
inline constexpr uint32_t kMaxDestRdAtomic = 128;

// The response packets (PSNs) a READ of `dma_len` bytes takes at path MTU `mtu`: one at least.
inline uint32_t read_response_packets(uint32_t dma_len, uint32_t mtu) {
    const uint64_t n = (uint64_t{dma_len} + mtu - 1) / mtu;
    return static_cast<uint32_t>(n == 0 ? 1 : n);
}

struct ReadResource {
    static constexpr uint32_t kToTheEnd = UINT32_MAX;  // run_end: the READ's last response

    uint32_t psn = 0;    // PSN of the request = PSN of its first response
    uint32_t npkts = 1;  // response packets (PSNs) the READ consumes
    uint64_t va = 0;     // RETH as accepted
    uint32_t rkey = 0;
    uint32_t length = 0;
    uint32_t mtu = 0;        // the MTU the responses are cut with
    uint32_t pd = 0;         // the PD its rkey is checked in (an XRC target's comes per request)
    uint32_t msn = 0;        // MSN its responses carry, the one the request got
    uint32_t next = 0;       // index of the next response packet to send
    uint32_t run_start = 0;  // index where the current run of responses started (First/Only)
    // Index the current run stops before (its last response a Last/Only): a duplicate that
    // asked for part of what follows run_start; kToTheEnd (npkts) otherwise.
    uint32_t run_end = kToTheEnd;
    uint32_t sent_once = 0;     // packets [0, sent_once) have each gone out at least once
    bool atomic = false;        // an atomic: one PSN, answered at once with `original`
    bool atomic_write = false;  // an ATOMIC WRITE: one PSN, answered by an ACK
    uint64_t original = 0;      // the value the atomic found (its AtomicAckETH)
    // The atomic's operands: a duplicate is answered from here only if they match.
    bool cmp_swap = false;
    uint64_t swap_add = 0;
    uint64_t compare = 0;

    uint32_t run_stop() const { return run_end < npkts ? run_end : npkts; }
    bool sending() const { return next < run_stop(); }
    // Every response has gone out once: a conforming requester may have finished the READ.
    bool finished_once() const { return sent_once >= npkts; }
    // Index of `p` among the READ's response PSNs, or -1.
    int64_t index_of(uint32_t p) const;
    // Bytes of response packet `i` and its offset in the READ.
    uint64_t offset_of(uint32_t i) const { return uint64_t{i} * mtu; }
    uint32_t length_of(uint32_t i) const;
};

class ReadResources {
  public:
    void clear() {
        entries_.clear();
        sending_from_ = 0;
    }
    // max_dest_rd_atomic of the QP (clamped to kMaxDestRdAtomic).
    void set_capacity(uint32_t n);
    uint32_t capacity() const { return capacity_; }

    // Takes a new READ. Drops any resource whose PSNs overlap the new one's (a request of
    // an earlier lap of the PSN space). Recycles the oldest resource whose responses have
    // all gone out once if all are in use; returns nullptr when none can be recycled: the
    // requester has more READs outstanding than max_dest_rd_atomic (every resource holds a
    // READ it cannot have finished).
    ReadResource* admit(const ReadResource& r);
    // The resource whose response PSNs include `psn`, or nullptr. The caller may move its
    // cursor back (a duplicate READ): it then has responses to send again.
    ReadResource* find(uint32_t psn);
    // The oldest resource with responses left to send, or nullptr. Called for every response
    // packet: it starts where the last call found one, not at the oldest resource.
    ReadResource* next_to_send();
    bool busy() { return next_to_send() != nullptr; }
    size_t size() const { return entries_.size(); }

  private:
    std::vector<ReadResource> entries_;  // in PSN (= arrival) order
    uint32_t capacity_ = 1;
    // No resource before this index has responses left to send. A resource sends only
    // forward once returned by next_to_send() or admit(); only one find() returned can
    // start sending again, and find() moves this index back to it.
    size_t sending_from_ = 0;
};

}  // namespace uroce::transport
