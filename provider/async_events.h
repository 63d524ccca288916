// The context's asynchronous event queue, as libibverbs reads it.
//
// ibv_get_async_event() reads fixed-size records (element, event type) from
// context->async_fd and then calls the provider's async_event op; ibv_ack_async_event()
// counts acknowledged events in the QP or CQ. A kernel provider's destroy waits until the
// application has acknowledged every event it was given for the object, and the kernel never
// hands out an event for an object already destroyed. This class gives uroce the same
// guarantees: records go through a socket pair (so queued records can be taken back when their
// object is destroyed) and each object keeps a tally of its events, which destroy waits on.
#pragma once

#include <infiniband/verbs.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace uroce::provider {

// Affiliated events of one QP or CQ, counted by the queue.
struct AsyncEventTally {
    uint32_t queued = 0;     // records written to the socket
    uint32_t purged = 0;     // taken back unread because the object is being destroyed
    uint32_t delivered = 0;  // read by the application (counted in the async_event op)
};

class AsyncEventQueue {
  public:
    AsyncEventQueue() = default;
    ~AsyncEventQueue();
    AsyncEventQueue(const AsyncEventQueue&) = delete;
    AsyncEventQueue& operator=(const AsyncEventQueue&) = delete;

    // Creates the socket pair; returns the fd for context->async_fd, or -1 with errno set.
    int open();

    // Queues one event for `element` (an ibv_qp* or ibv_cq*, or a port number); `tally` is the
    // object's, or nullptr for unaffiliated events. A full queue drops the event, as a
    // kernel's bounded event queue does.
    void post(ibv_event_type type, uint64_t element, AsyncEventTally* tally) noexcept;

    // The async_event op: the application has just read `tally`'s event.
    void delivered(AsyncEventTally* tally) noexcept;

    // Takes back every queued record for `element` and waits until no record of it is between
    // the socket and the async_event op (read by a thread inside ibv_get_async_event).
    // Afterwards tally->delivered is final. Call once no new event can be posted for it.
    void retract(uint64_t element, AsyncEventTally* tally) noexcept;

  private:
    std::mutex mutex_;
    std::condition_variable settled_;
    int read_fd_ = -1;  // handed to libibverbs, which closes it
    int write_fd_ = -1;
};

// Waits until the application has acknowledged (ibv_ack_async_event) every event delivered
// for the object whose libibverbs mutex/cond/counter are given.
void wait_for_acks(pthread_mutex_t* mutex, pthread_cond_t* cond, const uint32_t* completed,
                   uint32_t delivered) noexcept;

}  // namespace uroce::provider
