// One RDMA CM event channel (librdmacm's rdma_event_channel): the fd librdmacm opened as
// /dev/infiniband/rdma_cm, and the events waiting on it.
//
// The fd is an eventfd, so applications can poll it as they poll the kernel's: it is
// readable exactly while events wait. GET_EVENT takes the oldest event, waiting for one
// unless the fd is non-blocking (then EAGAIN), as the kernel's rdma_cm file does.
#pragma once

#include <rdma/rdma_user_cm.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace uroce::provider::ucma {

class Channel {
  public:
    // nullptr with errno set when no eventfd can be made.
    static std::shared_ptr<Channel> create();
    ~Channel();
    Channel(const Channel&) = delete;
    Channel& operator=(const Channel&) = delete;

    int fd() const { return fd_; }

    // Queues an event. `counted_for`: the identifier whose rdma_destroy_id must wait for
    // its acknowledgement (the listener, for a connection request).
    void push(const rdma_ucm_event_resp& ev, uint32_t counted_for);
    // Takes the oldest event: 0, EAGAIN (none and `nonblocking`) or EBADF (closed before).
    int pop(rdma_ucm_event_resp& out, bool nonblocking);

    struct Purged {
        uint32_t reported = 0;                  // events of the identifier handed out so far
        std::vector<uint32_t> orphan_requests;  // new identifiers of dropped CONNECT_REQUESTs
    };
    // Forgets an identifier: its waiting events are dropped (connection requests for it
    // listed), and how many were handed out is returned.
    Purged purge(uint32_t id);
    struct Moved {
        uint32_t reported = 0;           // events of the identifier handed out from here
        std::vector<uint32_t> requests;  // new identifiers of the CONNECT_REQUESTs moved
    };
    // Moves an identifier's waiting events and count to `to` (rdma_migrate_id).
    Moved move_to(Channel& to, uint32_t id);
    // Drops the waiting events; further pops fail with EBADF, and a pop already waiting
    // waits for ever (see pop()).
    void close();

  private:
    Channel() = default;
    struct Pending {
        rdma_ucm_event_resp ev;
        uint32_t counted_for;
    };
    void update_readable_locked();

    int fd_ = -1;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<Pending> queue_;
    std::unordered_map<uint32_t, uint32_t> reported_;
    bool readable_ = false;  // the eventfd's counter is non-zero
    bool closed_ = false;
};

}  // namespace uroce::provider::ucma
