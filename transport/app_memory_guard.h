// Application memory that may vanish under a registered region.
//
// A NIC reaches the pages a region pinned at registration. An application may therefore
// unmap or free a buffer that is still registered, or still named by a posted receive, and
// the NIC's late writes land in pages nobody sees any more. UCX does it at teardown: its
// receive buffers are freed before the UD QP they are posted to is destroyed, and a datagram
// that comes in between is written into them. A provider in user space has no pin: the same
// write raises SIGSEGV (SIGBUS for a truncated file) in the application's process.
//
// So every access the engine makes to application memory after its key check (a receive's
// scatter, an RDMA WRITE's or an atomic's target, a READ response into the requester's
// buffer, the ICRC over a payload it sends) runs inside guarded_access(). A fault there ends
// the access, guarded_access() returns false, and the operation completes as if the key had
// been refused (counter app_memory_faults). A fault anywhere else goes on to the handler that
// was installed before this one, or to the default action: nothing changes for it.
//
// What stays different from a NIC: a page the application has mapped again at the same
// address takes the late write, and a copy the fault stopped leaves a part written.
#pragma once

#include <cstddef>

namespace uroce::transport {

// Installs the SIGSEGV and SIGBUS handler; false if the system refused it (then faults stay
// fatal, as without this guard). Called at each engine's creation: a handler someone
// installed since (Catch2 installs its own for each test case) is kept as the one other
// faults go to, and ours goes back in front of it. The handler stays for the life of the
// process: the provider library is never unloaded (-z nodelete).
bool install_app_memory_guard() noexcept;

// Runs fn(arg) and returns true, or false if fn touched a page that is not mapped (or a
// file page past the file's end). fn must leave nothing to undo when it is cut short: no lock
// taken, no object with a destructor, no memory allocated. Calls do not nest.
bool guarded_access(void (*fn)(void*), void* arg) noexcept;

// The same around a lambda or other callable object (same rules for what it does).
template <class F>
bool guarded(F& f) noexcept {
    return guarded_access([](void* p) { (*static_cast<F*>(p))(); }, &f);
}

// memcpy(dst, src, n) inside guarded_access().
bool guarded_copy(void* dst, const void* src, size_t n) noexcept;

// Whether every page of [addr, addr + n) can be read now: one byte of each is read inside
// guarded_access(). For memory that goes to the kernel or an ICRC later, to refuse early.
bool guarded_probe(const void* addr, size_t n) noexcept;

}  // namespace uroce::transport
