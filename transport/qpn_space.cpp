// The numbers of one context's QPs and XRC SRQs: see qpn_space.h.
#include "transport/qpn_space.h"

#include <new>
#include <utility>
#include <vector>

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

void QpnSpace::FreeOrder::fill(uint16_t slot) {
    low = std::make_unique<uint16_t[]>(kPerSlot);
    stamp = std::make_unique<uint64_t[]>(kPerSlot);  // zeroed: never handed out
    head = 0;
    count = capacity_of(slot);  // slot 4095's last number, the multicast QPN, left out
    for (uint32_t i = 0; i < count; ++i) low[i] = static_cast<uint16_t>(i);
    if (count < 2) return;
    // Fisher-Yates: every order equally likely (a 64-bit value modulo at most 4,096: no bias
    // worth the name), its values from one read of the kernel's pool.
    std::vector<uint64_t> r(count - 1);
    random_fill(r);
    for (uint32_t i = count - 1; i > 0; --i) std::swap(low[i], low[r[i - 1] % (i + 1)]);
}

uint16_t QpnSpace::FreeOrder::pop() {
    const uint16_t n = low[head];
    head = (head + 1) % kPerSlot;
    --count;
    return n;
}

void QpnSpace::FreeOrder::push(uint16_t number, uint64_t when) {
    const uint32_t at = (head + count) % kPerSlot;
    low[at] = number;
    stamp[at] = when;
    ++count;
}

uint32_t QpnSpace::allocate(Kind kind, const std::function<bool(uint32_t)>& taken) {
    const size_t k = kind_index(kind);
    if (used_[k] >= kMaxNumbers) throw std::bad_alloc();
    if (!slotted_) {
        const uint32_t n = draw_unslotted(taken);
        ++used_[k];
        return n;
    }
    // The slot whose next free number has rested longest: one never handed out (stamp 0)
    // before any given back, and of those given back the oldest.
    const unsigned held = slot_count_.load(std::memory_order_relaxed);
    int best = -1;
    uint64_t best_stamp = 0;
    for (unsigned i = 0; i < held; ++i) {
        Held& h = slots_[i];
        if (h.used[k] >= capacity_of(h.number)) continue;
        const uint64_t s = h.free[k].low ? h.free[k].front_stamp() : 0;
        if (best < 0 || s < best_stamp) {
            best = static_cast<int>(i);
            best_stamp = s;
        }
    }
    if (best < 0) {
        if (!add_slot()) throw std::bad_alloc();
        best = static_cast<int>(held);
    }
    Held& h = slots_[best];
    FreeOrder& order = h.free[k];
    if (!order.low) order.fill(h.number);
    const uint32_t base = uint32_t{h.number} << DeviceSlots::kQpnBits;
    // Every free number is in the order once; `taken` only guards against a caller that
    // holds one it was not handed (then it goes to the back, as if given back now).
    uint32_t qpn = base | order.pop();
    for (uint32_t tries = order.count; taken(qpn) && tries > 0; --tries) {
        order.push(static_cast<uint16_t>(qpn & (kPerSlot - 1)), ++released_);
        qpn = base | order.pop();
    }
    if (taken(qpn)) {
        order.push(static_cast<uint16_t>(qpn & (kPerSlot - 1)), ++released_);
        throw std::bad_alloc();
    }
    ++h.used[k];
    ++used_[k];
    return qpn;
}

void QpnSpace::release(Kind kind, uint32_t number) {
    const size_t k = kind_index(kind);
    if (!slotted_) {
        if (used_[k] > 0) --used_[k];
        return;
    }
    const int i = index_of(static_cast<uint16_t>(DeviceSlots::slot_of(number)));
    if (i >= 0 && slots_[i].used[k] > 0 && slots_[i].free[k].low) {
        --slots_[i].used[k];
        --used_[k];
        // Behind every free number: handed out again after all of them.
        slots_[i].free[k].push(static_cast<uint16_t>(number & (kPerSlot - 1)), ++released_);
    }
}

}  // namespace uroce::transport
