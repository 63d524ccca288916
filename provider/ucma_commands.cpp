// The ucma commands librdmacm writes to its rdma_cm fd, answered by the process's RDMA CM
// (transport/cm/rdma_cm.h), and the events it reads back. The layouts are the kernel's
// (rdma/rdma_user_cm.h); each command is checked as the kernel checks it (the header's sizes
// fit the write, the identifier belongs to the channel written to). This file: the hooks'
// bodies (ucma.h) and the dispatch of each command to its handler (ucma_handler.h).
#include <rdma/rdma_user_cm.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "provider/ucma.h"
#include "provider/ucma_handler.h"

namespace uroce::provider::ucma {

int Handler::run(uint32_t op, const Command& c) {
    switch (op) {
        case RDMA_USER_CM_CMD_CREATE_ID:
            return create_id(c);
        case RDMA_USER_CM_CMD_DESTROY_ID:
            return destroy_id(c);
        case RDMA_USER_CM_CMD_BIND_IP:
            return bind_ip(c);
        case RDMA_USER_CM_CMD_BIND:
            return bind(c);
        case RDMA_USER_CM_CMD_RESOLVE_IP:
            return resolve_ip(c);
        case RDMA_USER_CM_CMD_RESOLVE_ADDR:
            return resolve_addr(c);
        case RDMA_USER_CM_CMD_RESOLVE_ROUTE:
            return resolve_route(c);
        case RDMA_USER_CM_CMD_QUERY_ROUTE:
            return query_route(c);
        case RDMA_USER_CM_CMD_QUERY:
            return query(c);
        case RDMA_USER_CM_CMD_CONNECT:
            return connect(c);
        case RDMA_USER_CM_CMD_LISTEN:
            return listen(c);
        case RDMA_USER_CM_CMD_ACCEPT:
            return accept(c);
        case RDMA_USER_CM_CMD_REJECT:
            return reject(c);
        case RDMA_USER_CM_CMD_DISCONNECT:
            return disconnect(c);
        case RDMA_USER_CM_CMD_INIT_QP_ATTR:
            return init_qp_attr(c);
        case RDMA_USER_CM_CMD_GET_EVENT:
            return get_event(c);
        case RDMA_USER_CM_CMD_SET_OPTION:
            return set_option(c);
        case RDMA_USER_CM_CMD_NOTIFY:
            return notify(c);
        case RDMA_USER_CM_CMD_MIGRATE_ID:
            return migrate_id(c);
        case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
            return join_ip_mcast(c);
        case RDMA_USER_CM_CMD_JOIN_MCAST:
            return join_mcast(c);
        case RDMA_USER_CM_CMD_LEAVE_MCAST:
            return leave_mcast(c);
        // GET_OPTION (no librdmacm call issues it), and anything newer.
        default:
            return ENOSYS;
    }
}

namespace detail {

int open_channel() noexcept {
    Ucma* u = ucma();
    if (!u) {
        errno = ENOMEM;
        return -1;
    }
    auto channel = Channel::create();
    if (!channel) return -1;
    FileId id;
    if (!file_id(channel->fd(), &id)) return -1;
    try {
        std::lock_guard lock(u->mutex);
        u->channels[channel->fd()] = ChannelEntry{channel, id};
        u->channel_count.store(u->channels.size(), std::memory_order_release);
    } catch (...) {
        ::close(channel->fd());
        errno = ENOMEM;
        return -1;
    }
    return channel->fd();
}

bool is_channel(int fd) noexcept {
    Ucma* u = ucma();
    if (!u || u->channel_count.load(std::memory_order_acquire) == 0) return false;
    FileId registered;
    {
        std::lock_guard lock(u->mutex);
        const auto it = u->channels.find(fd);
        if (it == u->channels.end()) return false;
        registered = it->second.file;
    }
    FileId now;
    return file_id(fd, &now) && now == registered;
}

ssize_t handle_write(int fd, const void* buf, size_t len) noexcept {
    Ucma* u = ucma();
    rdma_ucm_cmd_hdr hdr{};
    if (!u || buf == nullptr || len < sizeof hdr) {
        errno = EINVAL;
        return -1;
    }
    std::memcpy(&hdr, buf, sizeof hdr);
    if (size_t{hdr.in} + sizeof hdr > len) {
        errno = EINVAL;
        return -1;
    }
    std::shared_ptr<Channel> channel;
    {
        std::lock_guard lock(u->mutex);
        const auto it = u->channels.find(fd);
        if (it == u->channels.end()) {
            errno = EBADF;
            return -1;
        }
        channel = it->second.channel;
    }
    int rc = 0;
    try {
        Handler h(*u, channel);
        rc =
            h.run(hdr.cmd, Command{static_cast<const uint8_t*>(buf) + sizeof hdr, hdr.in, hdr.out});
    } catch (const std::bad_alloc&) {
        rc = ENOMEM;
    } catch (...) {
        rc = EIO;
    }
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return static_cast<ssize_t>(len);
}

void on_close(int fd) noexcept {
    Ucma* u = ucma();
    if (!u) return;
    std::shared_ptr<Channel> channel;
    try {
        std::lock_guard lock(u->mutex);
        const auto it = u->channels.find(fd);
        if (it == u->channels.end()) return;
        channel = it->second.channel;
        u->channels.erase(it);
        u->channel_count.store(u->channels.size(), std::memory_order_release);
        for (auto m = u->mcs.begin(); m != u->mcs.end();) {
            if (m->second.channel == channel)
                m = u->mcs.erase(m);
            else
                ++m;
        }
    } catch (...) {
        return;
    }
    channel->close();
    // As closing the kernel's file: the identifiers left on the channel are destroyed, in
    // the RDMA CM before they are forgotten here, so that a request a listener takes
    // meanwhile files its new identifier on this channel, found by the next pass (at most
    // two: once the listeners are gone, no identifier joins the channel).
    for (;;) {
        std::vector<uint32_t> ids;
        try {
            std::lock_guard lock(u->mutex);
            for (const auto& [id, entry] : u->ids)
                if (entry.channel == channel) ids.push_back(id);
        } catch (...) {
            return;
        }
        if (ids.empty()) return;
        for (uint32_t id : ids) u->cm()->destroy_id(id);
        std::lock_guard lock(u->mutex);
        for (uint32_t id : ids) u->ids.erase(id);
    }
}

}  // namespace detail
}  // namespace uroce::provider::ucma
