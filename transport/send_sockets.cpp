#include "transport/send_sockets.h"

#include <mutex>

namespace uroce::transport {

const UdpSocket& SendSockets::for_port(uint16_t port) {
    {
        std::shared_lock lock(mutex_);
        auto it = sockets_.find(port);
        if (it != sockets_.end()) return it->second ? *it->second : fallback_;
    }
    std::unique_lock lock(mutex_);
    auto it = sockets_.find(port);
    if (it == sockets_.end()) {
        // SO_REUSEPORT: every context of the device (in any process of the same user) whose
        // QPs hash to this port sends from it too. Nothing is read on these ports (RoCEv2
        // requests and responses go to the device port), so sharing them costs nothing, and
        // what anyone sends to them must not pile up in a large receive buffer.
        auto s = std::make_unique<UdpSocket>(ip_, port, /*reuseport=*/true);
        s->receive_nothing();
        if (ecn_ != 0) s->set_ecn(ecn_);
        // A port in use elsewhere is remembered as unusable: the QPs hashed to it send from
        // the main socket rather than retry a bind on every packet.
        it = sockets_.emplace(port, s->fd() >= 0 ? std::move(s) : nullptr).first;
    }
    return it->second ? *it->second : fallback_;
}

void SendSockets::close_fds_after_fork() noexcept {
    for (auto& [port, socket] : sockets_)
        if (socket) socket->close_fd();
}

}  // namespace uroce::transport
