// Helpers shared by the counter files (device_counters.h, qp_counters.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>

namespace uroce::transport {

// FNV-1a over a list of counter names in order: a file written by a build whose list differs
// (a counter added, removed or moved) has another hash, so it is not misread.
constexpr uint64_t counter_layout_hash(std::initializer_list<std::string_view> names) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (std::string_view name : names) {
        for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
        h = (h ^ ',') * 0x100000001b3ull;
    }
    return h;
}

// "what: <strerror of err>".
inline std::string errno_text(const std::string& what, int err) {
    return what + ": " + std::error_code(err, std::generic_category()).message();
}

// The first `bytes` of a counter file, mapped read-only for a reader (uroce stats); unmapped
// when it goes.
class CounterFileView {
  public:
    // False with `error` set if `path` cannot be opened or mapped, or is shorter than `bytes`
    // (then "PATH is not a KIND file").
    bool open(const std::string& path, size_t bytes, const char* kind, std::string& error);
    ~CounterFileView();
    CounterFileView() = default;
    CounterFileView(const CounterFileView&) = delete;
    CounterFileView& operator=(const CounterFileView&) = delete;
    const char* data() const { return static_cast<const char*>(map_); }

  private:
    void* map_ = nullptr;
    size_t length_ = 0;
};

}  // namespace uroce::transport
