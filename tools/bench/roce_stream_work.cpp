#include "roce_stream_work.h"

#include <algorithm>
#include <cstring>

#include "uroce/crc32.h"

namespace uroce::bench {
namespace {

// Where a packet's header carries its index in the message (a PSN's place in a BTH).
constexpr std::size_t kIndexOffset = 8;
// The staged buffer's slack before the first packet (stage_offset() is below it).
constexpr std::size_t kStageSlack = 64;

}  // namespace

RoceStreamWork::RoceStreamWork(std::size_t msg_bytes, std::size_t seg_bytes,
                               std::size_t first_extra)
    : msg_(msg_bytes),
      first_extra_(first_extra),
      payload_(seg_bytes - kHeaderBytes - kCrcBytes),
      packets_(std::max<std::size_t>(2, (msg_bytes + payload_ - 1) / payload_)),
      wire_bytes_(msg_bytes + packets_ * (kHeaderBytes + kCrcBytes) + first_extra),
      staged_(kStageSlack + wire_bytes_),
      region_(std::max<std::size_t>(msg_bytes, 1)) {
    std::memset(staged_.data(), 0, kStageSlack + wire_bytes_);
    std::memset(region_.data(), 0, std::max<std::size_t>(msg_bytes, 1));
}

void RoceStreamWork::stage_into(std::span<const std::uint8_t> app, std::uint8_t* out) const {
    std::size_t from = 0;
    for (std::size_t i = 0; i < packets_; ++i) {
        const std::size_t header = header_of(i);
        const std::size_t len = std::min(payload_, msg_ - from);
        const auto index = static_cast<std::uint32_t>(i);
        std::memset(out, 0, header);
        std::memcpy(out + kIndexOffset, &index, sizeof index);
        std::memcpy(out + header, app.data() + from, len);
        const std::uint32_t crc = wire::crc32(0, std::span<const std::uint8_t>(out, header + len));
        std::memcpy(out + header + len, &crc, kCrcBytes);
        out += header + len + kCrcBytes;
        from += len;
    }
}

std::span<const std::uint8_t> RoceStreamWork::stage(std::span<const std::uint8_t> app) {
    std::uint8_t* out = staged_.data() + stage_offset();
    stage_into(app, out);
    return {out, wire_bytes_};
}

std::optional<std::size_t> RoceStreamWork::take(std::span<const std::uint8_t> packet) {
    if (packet.size() < kHeaderBytes + kCrcBytes) return std::nullopt;
    std::uint32_t index = 0;
    std::memcpy(&index, packet.data() + kIndexOffset, sizeof index);
    const std::size_t header = header_of(index);
    if (packet.size() < header + kCrcBytes) return std::nullopt;
    const std::size_t len = packet.size() - header - kCrcBytes;
    const std::size_t at = index * payload_;
    if (at + len > msg_) return std::nullopt;
    std::uint32_t want = 0;
    std::memcpy(&want, packet.data() + header + len, kCrcBytes);
    if (wire::crc32(0, packet.first(header + len)) != want) return std::nullopt;
    std::memcpy(region_.data() + at, packet.data() + header, len);
    return len;
}

}  // namespace uroce::bench
