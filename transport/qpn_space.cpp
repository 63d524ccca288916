// The numbers of one context's QPs and XRC SRQs: see qpn_space.h.
#include "transport/qpn_space.h"

#include <new>

#include "transport/multicast_groups.h"
#include "transport/random_source.h"

namespace uroce::transport {

namespace {

// Numbers of a slot that may be handed out: the last slot's last number is the multicast QPN.
uint32_t capacity_of(uint16_t slot) {
    const uint32_t last = uint32_t{slot} << DeviceSlots::kQpnBits | (QpnSpace::kPerSlot - 1);
    return QpnSpace::kPerSlot - (last == kMulticastQpn ? 1 : 0);
}

size_t kind_index(QpnSpace::Kind kind) {
    return kind == QpnSpace::Kind::Qp ? 0 : 1;
}

}  // namespace

QpnSpace::QpnSpace(std::unique_ptr<DeviceSlot> primary, Hooks hooks)
    : hooks_(std::move(hooks)), slotted_(primary != nullptr) {
    Held& first = slots_[0];
    first.number = primary ? primary->number() : 0;
    first.slot = std::move(primary);
    first.counters = hooks_.counter_table(first.number);
    slot_count_.store(1, std::memory_order_release);
}

QpnSpace::~QpnSpace() = default;

int QpnSpace::index_of(uint16_t number) const {
    const unsigned n = slot_count_.load(std::memory_order_acquire);
    for (unsigned i = 0; i < n; ++i)
        if (slots_[i].number == number) return static_cast<int>(i);
    return -1;
}

QpCounters& QpnSpace::counters(uint32_t qpn) {
    const int i = slotted_ ? index_of(static_cast<uint16_t>(DeviceSlots::slot_of(qpn))) : 0;
    return slots_[i < 0 ? 0 : i].counters->for_qpn(qpn);
}

bool QpnSpace::add_slot() {
    const unsigned n = slot_count_.load(std::memory_order_relaxed);
    if (n >= kMaxSlots || !hooks_.claim_slot) return false;
    std::string error;
    int err = 0;
    std::unique_ptr<DeviceSlot> slot = hooks_.claim_slot(error, err);
    // Routed before any number of it is handed out: a peer's first packet must find us.
    if (!slot || (hooks_.route_slot && hooks_.route_slot(slot->number()) != 0)) return false;
    Held& h = slots_[n];
    h.number = slot->number();
    h.counters = hooks_.counter_table(h.number);
    h.slot = std::move(slot);
    h.used[0] = h.used[1] = 0;
    slot_count_.store(n + 1, std::memory_order_release);
    return true;
}

uint32_t QpnSpace::draw_unslotted(const std::function<bool(uint32_t)>& taken) {
    // QPs 0 and 1 are the IBA's special QPs, 0xFFFFFF the multicast QPN.
    constexpr uint32_t kFirst = 2;
    constexpr uint32_t kLast = kMulticastQpn - 1;
    constexpr uint32_t kNumbers = kLast + 1 - kFirst;
    uint32_t n = kFirst + static_cast<uint32_t>(random_u64() % kNumbers);
    // Taken: the next free one after it (the space is far from full in practice).
    while (taken(n)) n = n >= kLast ? kFirst : n + 1;
    return n;
}

uint32_t QpnSpace::allocate(Kind kind, const std::function<bool(uint32_t)>& taken) {
    const size_t k = kind_index(kind);
    if (used_[k] >= kMaxNumbers) throw std::bad_alloc();
    if (!slotted_) {
        const uint32_t n = draw_unslotted(taken);
        ++used_[k];
        return n;
    }
    unsigned i = 0;
    const unsigned held = slot_count_.load(std::memory_order_relaxed);
    while (i < held && slots_[i].used[k] >= capacity_of(slots_[i].number)) ++i;
    if (i == held && !add_slot()) throw std::bad_alloc();
    Held& h = slots_[i];
    const uint32_t base = uint32_t{h.number} << DeviceSlots::kQpnBits;
    uint32_t low = static_cast<uint32_t>(random_u64() % kPerSlot);
    while (taken(base | low) || (base | low) == kMulticastQpn) low = (low + 1) % kPerSlot;
    ++h.used[k];
    ++used_[k];
    return base | low;
}

void QpnSpace::release(Kind kind, uint32_t number) {
    const size_t k = kind_index(kind);
    if (!slotted_) {
        if (used_[k] > 0) --used_[k];
        return;
    }
    const int i = index_of(static_cast<uint16_t>(DeviceSlots::slot_of(number)));
    if (i >= 0 && slots_[i].used[k] > 0) {
        --slots_[i].used[k];
        --used_[k];
    }
}

}  // namespace uroce::transport
