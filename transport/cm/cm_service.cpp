#include "transport/cm/cm_service.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <new>

#include "transport/engine.h"

namespace uroce::transport::cm {

CmService::CmService(Engine& engine, uint64_t ca_guid, CmTimers timers,
                     CmAgent::EventHandler on_event)
    : engine_(engine),
      gsi_(std::make_shared<GsiQp>(
          engine,
          [this](uint32_t src_ip, std::span<const uint8_t> mad) { agent_.on_mad(src_ip, mad); })),
      forwarder_(*gsi_),
      agent_(forwarder_, engine.slot_number(), ca_guid, timers, std::move(on_event)) {
    timer_ = std::make_unique<TimerQueue::Timer>(engine_.timers(), &CmService::on_timer, this);
    agent_.set_deadline_observer([this] { arm(); });
    agent_.set_listened_elsewhere(
        [this](uint64_t service_id) { return engine_.cm_service_held_elsewhere(service_id); });
    engine_.attach(gsi_);
    claim_any();
}

void CmService::claim_any() {
    // Service ID 0 (no RDMA CM service has it): "a context with a CM", which the steering
    // uses for CM MADs nobody else takes. One holder per device; a dead one is replaced.
    if (engine_.claim_cm_service(kAnyCmService) == 0) holds_any_ = true;
}

int CmService::listen(uint64_t service_id, uint64_t listener) {
    std::lock_guard lock(listen_mutex_);
    if (service_id == kAnyCmService) return EINVAL;
    if (!holds_any_) claim_any();
    if (const int rc = engine_.claim_cm_service(service_id); rc != 0) return rc;
    if (const int rc = agent_.listen(service_id, listener); rc != 0) return rc;
    services_.push_back(service_id);
    return 0;
}

void CmService::stop_listening(uint64_t service_id) {
    std::lock_guard lock(listen_mutex_);
    auto it = std::find(services_.begin(), services_.end(), service_id);
    if (it == services_.end()) return;
    services_.erase(it);
    agent_.stop_listening(service_id);
    engine_.release_cm_service(service_id);
}

CmService::~CmService() {
    {
        std::lock_guard lock(listen_mutex_);
        closing_ = true;
        for (uint64_t s : services_) engine_.release_cm_service(s);
        services_.clear();
        if (holds_any_) engine_.release_cm_service(kAnyCmService);
    }
    // QP1 first: once detach() returns no MAD is being handled, so nothing re-arms the timer
    // from the receive side; then the timer, waiting for a callback in flight.
    engine_.detach(kGsiQpn);
    {
        std::lock_guard lock(timer_mutex_);
        stopped_ = true;
    }
    timer_.reset();  // waits for a running callback
}

void CmService::arm() {
    // Reading the deadline and setting the timer under one lock: two threads re-arming at
    // once could otherwise leave the timer at the later of two deadlines they read.
    std::lock_guard lock(timer_mutex_);
    if (stopped_) return;
    const auto next = agent_.next_deadline();
    if (!next) return;
    const auto wait = std::max(CmClock::duration::zero(), *next - CmClock::now());
    timer_->arm_in(std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count());
}

void CmService::on_timer(void* arg) {
    auto* self = static_cast<CmService*>(arg);
    const auto pass = self->engine_.fork_gate().pass();
    {
        std::lock_guard lock(self->timer_mutex_);
        if (self->stopped_) return;
    }
    {
        // The context that answered for the device's forgotten connections may have died
        // (killed, or crashed): while this agent waits for an answer, it offers to be that
        // context, so that its resend, if meant for a dead one, is answered (DREP, REJ)
        // rather than dropped until the retries run out.
        std::lock_guard lock(self->listen_mutex_);
        if (!self->closing_ && !self->holds_any_) self->claim_any();
    }
    self->agent_.expire();  // re-arms through the deadline observer
}

}  // namespace uroce::transport::cm
