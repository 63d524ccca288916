// One ucma command written to an event channel, answered as the kernel's RDMA CM answers it:
// the command is taken from the write (its header's sizes checked), the identifier it names
// must belong to the channel written to (EINVAL otherwise), and the response goes where the
// command says, if there is room for it (EFAULT, ENOSPC otherwise). Each handler returns 0
// or the errno the write fails with.
//
// Identifiers' commands (create, destroy, bind, resolve, query, options, migration) are in
// ucma_id_commands.cpp; connections, events and multicast in ucma_connection_commands.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "provider/ucma_channel.h"
#include "provider/ucma_registry.h"

namespace uroce::provider::ucma {

// A command's body and the room for its response, as the header gave them.
struct Command {
    const uint8_t* body;
    size_t in;
    size_t out;
};

// The command's structure, if the write carries all of it.
template <typename T>
bool take(const Command& c, T& cmd) {
    if (c.in < sizeof(T)) return false;
    std::memcpy(&cmd, c.body, sizeof(T));
    return true;
}

// Writes a response to the application's `where`, if it has `room` for `size` bytes.
template <typename R>
int respond(uint64_t where, size_t room, const R& resp, size_t size = sizeof(R)) {
    if (where == 0) return EFAULT;
    if (room < size) return ENOSPC;
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(where)), &resp, size);
    return 0;
}

class Handler {
  public:
    Handler(Ucma& u, std::shared_ptr<Channel> channel) : u_(u), channel_(std::move(channel)) {}

    // Command `op` (RDMA_USER_CM_CMD_*); ENOSYS for one uroce does not answer.
    int run(uint32_t op, const Command& c);

    // Destroys identifier `id` with its joins and the connection requests it never took;
    // `reported`: how many of its events were handed out.
    int destroy(uint32_t id, uint32_t* reported);

  private:
    // The identifier, if it is on this channel; its entry copied to `copy`.
    bool mine(uint32_t id, IdEntry* copy = nullptr);

    // ucma_id_commands.cpp
    int create_id(const Command& c);
    int destroy_id(const Command& c);
    int do_bind(uint32_t id, const void* addr, size_t size);
    int bind_ip(const Command& c);
    int bind(const Command& c);
    int do_resolve(uint32_t id, const void* src, size_t src_size, const void* dst, size_t dst_size);
    int resolve_ip(const Command& c);
    int resolve_addr(const Command& c);
    int resolve_route(const Command& c);
    int query_route(const Command& c);
    int query(const Command& c);
    int set_option(const Command& c);
    int migrate_id(const Command& c);

    // ucma_connection_commands.cpp
    int connect(const Command& c);
    int listen(const Command& c);
    int accept(const Command& c);
    int reject(const Command& c);
    int disconnect(const Command& c);
    int init_qp_attr(const Command& c);
    int notify(const Command& c);
    int get_event(const Command& c);
    int join(uint32_t id, const void* addr, size_t size, uint64_t uid, uint64_t response,
             size_t out);
    int join_ip_mcast(const Command& c);
    int join_mcast(const Command& c);
    int leave_mcast(const Command& c);

    Ucma& u_;
    std::shared_ptr<Channel> channel_;
};

}  // namespace uroce::provider::ucma
