#include "transport/multicast_groups.h"

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "transport/ud_qp.h"

namespace uroce::transport {

struct MulticastGroups::Group {
    Group(MulticastGroups& o, const IpAddress& group, const IpAddress& if_ip, uint16_t port)
        : owner(o), ip(group), socket(JoinGroup{group, if_ip}, port) {}
    // libevent's event_free waits for a callback running on another thread, so the socket
    // (closed after this body) is never read once freed.
    ~Group() {
        if (ev) event_free(ev);
    }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

    MulticastGroups& owner;
    const IpAddress ip;
    UdpSocket socket;
    event* ev = nullptr;
    std::vector<std::shared_ptr<UdQp>> members;
};

MulticastGroups::MulticastGroups(const IpAddress& if_ip, uint16_t port, OnReadable on_readable,
                                 void* arg)
    : if_ip_(if_ip), port_(port), on_readable_(on_readable), arg_(arg) {}

MulticastGroups::~MulticastGroups() {
    clear();
}

void MulticastGroups::on_event(evutil_socket_t, short, void* arg) {
    auto* g = static_cast<Group*>(arg);
    g->owner.on_readable_(g->socket, g->ip, g->owner.arg_);
}

int MulticastGroups::attach(event_base* base, const IpAddress& group,
                            const std::shared_ptr<UdQp>& qp) {
    std::unique_lock lock(mutex_);
    auto it = groups_.find(group);
    if (it == groups_.end()) {
        if (groups_.size() >= kMaxGroups) return ENOMEM;
        auto g = std::make_unique<Group>(*this, group, if_ip_, port_);
        if (g->socket.fd() < 0) return g->socket.error();
        g->ev = event_new(base, g->socket.fd(), EV_READ | EV_PERSIST, &on_event, g.get());
        if (!g->ev || event_add(g->ev, nullptr) != 0) return ENOMEM;
        it = groups_.emplace(group, std::move(g)).first;
    }
    auto& members = it->second->members;
    if (std::find(members.begin(), members.end(), qp) != members.end()) return 0;
    if (members.size() >= kMaxQpsPerGroup) return ENOMEM;
    members.push_back(qp);
    return 0;
}

int MulticastGroups::detach(const IpAddress& group, uint32_t qpn) {
    std::unique_ptr<Group> gone;  // closed outside the lock: it may wait for its event
    std::unique_lock lock(mutex_);
    auto it = groups_.find(group);
    if (it == groups_.end()) return EINVAL;
    auto& members = it->second->members;
    auto m = std::find_if(members.begin(), members.end(),
                          [qpn](const auto& qp) { return qp->qpn() == qpn; });
    if (m == members.end()) return EINVAL;
    members.erase(m);
    if (members.empty()) {
        gone = std::move(it->second);
        groups_.erase(it);
    }
    lock.unlock();
    return 0;
}

void MulticastGroups::detach_all(uint32_t qpn) {
    std::vector<std::unique_ptr<Group>> gone;
    std::unique_lock lock(mutex_);
    for (auto it = groups_.begin(); it != groups_.end();) {
        auto& members = it->second->members;
        std::erase_if(members, [qpn](const auto& qp) { return qp->qpn() == qpn; });
        if (members.empty()) {
            gone.push_back(std::move(it->second));
            it = groups_.erase(it);
        } else {
            ++it;
        }
    }
    lock.unlock();
}

void MulticastGroups::members(const IpAddress& group, std::vector<std::shared_ptr<UdQp>>& out) {
    out.clear();
    std::shared_lock lock(mutex_);
    auto it = groups_.find(group);
    if (it != groups_.end()) out = it->second->members;
}

void MulticastGroups::clear() {
    decltype(groups_) gone;
    {
        std::unique_lock lock(mutex_);
        gone.swap(groups_);
    }
}

void MulticastGroups::close_fds_after_fork() noexcept {
    for (auto& [ip, g] : groups_) g->socket.close_fd();
}

}  // namespace uroce::transport
