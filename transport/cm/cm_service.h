// The connection manager of one engine: QP1 attached to it (gsi_qp.h), the agent that keeps
// the connections (cm_agent.h), and the agent's timer on the engine's event loop.
//
// Whoever sets up connections over a device context (the provider's RDMA CM emulation; the
// unit tests) creates one CmService on that context's engine and talks to agent(). Events
// come on the engine thread (for received MADs and timeouts) or on the caller's thread (for
// what its own call caused).
//
// This header is part of the transport and knows nothing of libibverbs.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/cm/cm_agent.h"
#include "transport/cm/gsi_qp.h"
#include "transport/timer_queue.h"

namespace uroce::transport {
class Engine;
}

namespace uroce::transport::cm {

class CmService {
  public:
    // `engine` must outlive the service. Its comm IDs carry the engine's device slot.
    CmService(Engine& engine, uint64_t ca_guid, CmTimers timers, CmAgent::EventHandler on_event);
    // Detaches QP1 and stops the timer: no event is delivered once it returns. Not from
    // inside an event handler.
    ~CmService();
    CmService(const CmService&) = delete;
    CmService& operator=(const CmService&) = delete;

    // Listening goes through the service, not the agent: the device's other contexts must
    // learn that this one takes the service's REQs (Engine::claim_cm_service). 0, or
    // EADDRINUSE when this or another context of the device already listens.
    int listen(uint64_t service_id, uint64_t listener);
    void stop_listening(uint64_t service_id);

    // Everything else: connect, answer, disconnect.
    CmAgent& agent() { return agent_; }
    const GsiCounters& gsi_counters() const { return gsi_->counters(); }

  private:
    class Forwarder : public MadSender {
      public:
        explicit Forwarder(GsiQp& gsi) : gsi_(gsi) {}
        void send_mad(uint32_t dst_ip, std::span<const uint8_t, kMadBytes> mad) override {
            gsi_.send_mad(dst_ip, mad);
        }

      private:
        GsiQp& gsi_;
    };

    static constexpr uint64_t kAnyCmService = 0;
    void claim_any();  // under listen_mutex_, or in the constructor
    void arm();
    static void on_timer(void* arg);

    Engine& engine_;
    std::mutex listen_mutex_;
    std::vector<uint64_t> services_;  // claimed, released on destruction
    bool holds_any_ = false;          // this context answers CM MADs nobody else takes
    bool closing_ = false;            // destroyed: claims nothing more
    std::shared_ptr<GsiQp> gsi_;
    Forwarder forwarder_;
    CmAgent agent_;
    std::mutex timer_mutex_;  // taken before the agent's lock, never after
    bool stopped_ = false;
    std::unique_ptr<TimerQueue::Timer> timer_;
};

}  // namespace uroce::transport::cm
