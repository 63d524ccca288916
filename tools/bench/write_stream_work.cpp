#include "write_stream_work.h"

#include <algorithm>
#include <cstring>

#include "uroce/crc32.h"

namespace uroce::bench {
namespace {

// The staged packets start so that the first payload sits on a cache line, as uroce's
// staging area puts a train's first payload.
constexpr std::size_t kStageOffset =
    64 - WriteStreamWork::kHeaderBytes - WriteStreamWork::kRethBytes;
// Where a packet's header carries its index in the message (a PSN's place in a BTH).
constexpr std::size_t kIndexOffset = 8;

std::size_t header_of(std::size_t index) {
    return WriteStreamWork::kHeaderBytes + (index == 0 ? WriteStreamWork::kRethBytes : 0);
}

}  // namespace

WriteStreamWork::WriteStreamWork(std::size_t msg_bytes, std::size_t seg_bytes)
    : msg_(msg_bytes),
      payload_(seg_bytes - kHeaderBytes - kCrcBytes),
      packets_(std::max<std::size_t>(2, (msg_bytes + payload_ - 1) / payload_)),
      wire_bytes_(msg_bytes + packets_ * (kHeaderBytes + kCrcBytes) + kRethBytes),
      staged_(kStageOffset + wire_bytes_),
      region_(std::max<std::size_t>(msg_bytes, 1)) {
    std::memset(staged_.data(), 0, kStageOffset + wire_bytes_);
    std::memset(region_.data(), 0, std::max<std::size_t>(msg_bytes, 1));
}

std::span<const std::uint8_t> WriteStreamWork::stage(std::span<const std::uint8_t> app) {
    std::uint8_t* out = staged_.data() + kStageOffset;
    std::size_t from = 0;
    for (std::size_t i = 0; i < packets_; ++i) {
        const std::size_t header = header_of(i);
        const std::size_t len = std::min(payload_, msg_ - from);
        const auto index = static_cast<std::uint32_t>(i);
        std::memcpy(out + kIndexOffset, &index, sizeof index);
        std::memcpy(out + header, app.data() + from, len);
        const std::uint32_t crc = wire::crc32(0, std::span<const std::uint8_t>(out, header + len));
        std::memcpy(out + header + len, &crc, kCrcBytes);
        out += header + len + kCrcBytes;
        from += len;
    }
    return {staged_.data() + kStageOffset, wire_bytes_};
}

std::optional<std::size_t> WriteStreamWork::take(std::span<const std::uint8_t> packet) {
    if (packet.size() < kHeaderBytes + kCrcBytes) return std::nullopt;
    std::uint32_t index = 0;
    std::memcpy(&index, packet.data() + kIndexOffset, sizeof index);
    if (index >= packets_) return std::nullopt;
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
