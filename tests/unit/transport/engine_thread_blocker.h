// A test's hold on an engine's thread (EngineThreadBlocker): what the engine would do next
// on that thread waits until the test lets it go.
#pragma once

#include <event2/event.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>

#include "tests/unit/transport/engine_pair.h"

namespace uroce::transport::test {

// Keeps an engine's thread inside a callback until released (or 20 s have passed), so that
// whatever the engine would continue on that thread (receiving, timers, paced READ
// responses) waits, and the test sees the state between two steps.
class EngineThreadBlocker {
  public:
    explicit EngineThreadBlocker(Engine& engine) {
        timeval now{0, 0};
        REQUIRE(event_base_once(engine.base(), -1, EV_TIMEOUT, &EngineThreadBlocker::run, this,
                                &now) == 0);
        std::unique_lock lock(mutex_);
        REQUIRE(cv_.wait_for(lock, kWait, [this] { return entered_; }));
    }
    ~EngineThreadBlocker() {
        release();
        std::unique_lock lock(mutex_);
        cv_.wait_for(lock, kWait, [this] { return done_; });
    }
    EngineThreadBlocker(const EngineThreadBlocker&) = delete;
    EngineThreadBlocker& operator=(const EngineThreadBlocker&) = delete;

    void release() {
        std::lock_guard lock(mutex_);
        released_ = true;
        cv_.notify_all();
    }

  private:
    static void run(evutil_socket_t, short, void* arg) {
        auto* self = static_cast<EngineThreadBlocker*>(arg);
        std::unique_lock lock(self->mutex_);
        self->entered_ = true;
        self->cv_.notify_all();
        self->cv_.wait_for(lock, kWait, [self] { return self->released_; });
        self->done_ = true;
        self->cv_.notify_all();
    }

    std::mutex mutex_;
    std::condition_variable cv_;
    bool entered_ = false;
    bool released_ = false;
    bool done_ = false;
};

}  // namespace uroce::transport::test
