#include "transport/delay_line.h"

namespace uroce::transport {

bool DelayLine::push(uint64_t due_ns, Packet p, bool& earliest) {
    std::lock_guard lock(mutex_);
    earliest = false;
    if (packets_.size() >= kMaxPackets) return false;
    auto it = packets_.emplace(due_ns, std::move(p));  // after every equal key
    earliest = it == packets_.begin();
    return true;
}

void DelayLine::take_due(uint64_t now_ns, std::vector<Packet>& out) {
    std::lock_guard lock(mutex_);
    auto end = packets_.upper_bound(now_ns);
    for (auto it = packets_.begin(); it != end; ++it) out.push_back(std::move(it->second));
    packets_.erase(packets_.begin(), end);
}

std::optional<uint64_t> DelayLine::next_due() const {
    std::lock_guard lock(mutex_);
    if (packets_.empty()) return std::nullopt;
    return packets_.begin()->first;
}

size_t DelayLine::size() const {
    std::lock_guard lock(mutex_);
    return packets_.size();
}

}  // namespace uroce::transport
