// Which packet of a train the engine takes first: see train_order.h.
#include "transport/train_order.h"

#include "uroce/wire.h"

namespace uroce::transport {

namespace {

bool is_ack(uint8_t opcode) {
    constexpr auto kAck = static_cast<uint8_t>(wire::Opcode::RcAcknowledge);
    return opcode == kAck || opcode == (wire::kXrcOpcodeBase | kAck);
}

bool is_request(uint8_t opcode) {
    const wire::OpcodeInfo* info = wire::opcode_info(opcode);
    return info != nullptr && (info->flags & wire::kRequest) != 0;
}

// The packet that ends a message which takes a receive WQE: a SEND, or a WRITE with
// immediate.
bool completes_receive(uint8_t opcode) {
    const wire::OpcodeInfo* info = wire::opcode_info(opcode);
    if (info == nullptr || (info->flags & (wire::kLast | wire::kOnly)) == 0) return false;
    return (info->flags & wire::kSend) != 0 ||
           ((info->flags & wire::kWrite) != 0 && (info->headers & wire::kHasImm) != 0);
}

}  // namespace

size_t closing_ack_at(std::span<const uint8_t> train, size_t step) {
    if (step == 0 || train.size() <= step) return 0;
    const size_t last = (train.size() - 1) / step * step;
    if (!is_ack(train[last])) return 0;
    bool completes = false;
    for (size_t off = 0; off < last; off += step) {
        if (!is_request(train[off])) return 0;
        completes = completes || completes_receive(train[off]);
    }
    return completes ? last : 0;
}

}  // namespace uroce::transport
