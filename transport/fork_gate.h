// Engine threads stand still while the process forks.
//
// fork() copies every lock in the state it is in at that instant, and the child gets none of
// the threads that held them. An engine thread caught in the middle of a callback may hold
// the allocator's lock (glibc's malloc takes care of its own, but ASan's allocator of GCC 12
// does not), one of libevent's, or one of ours: a thread of the child (the engine of a
// context the child opens for itself) would then wait forever on a copy nobody releases.
//
// So every engine thread holds its gate while it runs a callback (Pass), never while it
// waits for events, and fork()'s prepare handler takes every gate of the process, waiting
// for running callbacks to end, and hands them back once the fork is done, in the parent
// and in the child. The application thread that forks holds no engine lock at that point
// (it is in fork(), not in a verb), so nothing the callbacks wait for is held by it.
#pragma once

#include <mutex>

namespace uroce::transport {

class ForkGate {
  public:
    ForkGate();   // registered with the process's fork handler
    ~ForkGate();  // unregistered; no callback may run through the gate any more
    ForkGate(const ForkGate&) = delete;
    ForkGate& operator=(const ForkGate&) = delete;

    // Work for fork()'s prepare handler once every gate is held (no engine callback runs),
    // and for its parent and child handlers before the gates are handed back: e.g.
    // PacketCapture flushes its buffers and holds its writers still. Hooks run in the order
    // added; each pair is added once per process.
    static void add_hooks(void (*prepare)(), void (*after)());

    // Held by the engine thread for the duration of one callback.
    [[nodiscard]] std::lock_guard<std::mutex> pass() { return std::lock_guard<std::mutex>(mutex_); }

  private:
    friend struct ForkGateRegistry;
    std::mutex mutex_;
};

}  // namespace uroce::transport
