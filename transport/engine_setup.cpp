// An engine's creation (its device slot, sockets, event loop, thread and receive buffers)
// and its destruction (the thread stopped, the QPs still attached closed before the loop's
// timers go).
#include <event2/thread.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <latch>
#include <mutex>
#include <new>

#include "transport/app_memory_guard.h"
#include "transport/congestion.h"
#include "transport/engine.h"
#include "transport/random_source.h"

namespace uroce::transport {

namespace {

constexpr size_t kRxBatch = 32;
constexpr size_t kRxBufferBytes = 4096 + 256;  // a multiple of 64: every buffer on a cache line
// With GRO a read may return a train of up to 64 KiB; fewer buffers, each that large (they
// are touched only as far as reads fill them).
constexpr size_t kRxBatchGro = 16;
constexpr size_t kRxBufferBytesGro = 65536;
static_assert(kRxBufferBytes % 64 == 0 && kRxBufferBytesGro % 64 == 0);
std::once_flag g_libevent_threads;

// The shared QP counters of slot `number` beside the device's counters file, else private
// ones.
std::unique_ptr<QpCounterTable> make_qp_counters(const EngineConfig& config, uint16_t number,
                                                 bool device_counters) {
    if (number != 0 && device_counters) {
        std::string why;  // unusable: counted privately, as for the device's counters
        if (auto t = QpCounterTable::open_shared(
                QpCounterTable::path_for_slot(config.counters_file, number), why))
            return t;
    }
    return QpCounterTable::make_private();
}

}  // namespace

std::unique_ptr<Engine> Engine::create(const EngineConfig& config, std::string& error, int& err) {
    // libevent needs its locking on before any base exists; it is process-wide and
    // idempotent, so every engine asks for it once.
    std::call_once(g_libevent_threads, [] { evthread_use_pthreads(); });
    std::unique_ptr<DeviceSlot> slot;
    std::unique_ptr<QpnSteering> steering;
    std::string no_sharing;  // why this context cannot share ip:port, if it cannot
    if (!config.slot_table.empty()) {
        slot = DeviceSlots::claim(config.slot_table, error, err);
        if (!slot) return nullptr;
        int steering_err = 0;
        steering = QpnSteering::open(*slot, no_sharing, steering_err);
    }
    std::unique_ptr<DeviceCounters> counters;
    if (slot && !config.counters_file.empty()) {
        std::string why;  // unusable: this context counts privately (device_counters.h)
        counters = DeviceCounters::open(config.counters_file, slot->number(), slot->alone(), why);
    }
    const bool shared = steering != nullptr;
    std::unique_ptr<Engine> e(
        new Engine(config, std::move(slot), std::move(steering), std::move(counters)));
    if (e->socket_.fd() < 0) {
        err = e->socket_.error();
        error = std::string("cannot bind UDP: ") + std::strerror(err);
        if (err == EADDRINUSE && !config.slot_table.empty())
            error += shared ? " (something other than a uroce context holds the address)"
                            : " (another context uses the device, and it cannot be shared "
                              "here: " +
                                  no_sharing + ")";
        return nullptr;
    }
    if (!config.pcap_path.empty()) {
        std::string why;
        e->capture_ = PacketCapture::open(config.pcap_path, why, err);
        if (!e->capture_) {
            error = "cannot write the capture " + why;
            return nullptr;
        }
    }
    if (shared) {
        if (const int rc = e->steering_->add(e->socket_.fd(), error); rc != 0) {
            err = rc;
            return nullptr;
        }
    }
    // No libevent timers (its precise ones set a timerfd before every epoll_wait): the
    // engine's timers have a timerfd of their own (timer_queue.h).
    e->base_ = event_base_new();
    if (e->base_) e->timers_ = std::make_unique<TimerQueue>(e->base_, e->counters_);
    if (!e->base_ || !e->timers_->ok()) {
        err = ENOMEM;
        error = "cannot create the event loop";
        return nullptr;
    }
    e->rx_event_ =
        event_new(e->base_, e->socket_.fd(), EV_READ | EV_PERSIST, &Engine::on_readable, e.get());
    if (!e->rx_event_ || event_add(e->rx_event_, nullptr) != 0) {
        err = ENOMEM;
        error = "cannot register the socket with the event loop";
        return nullptr;
    }
    e->handoff_ = std::make_unique<PollHandoff>(*e->timers_, e->rx_event_, e->fork_gate_,
                                                *e->counters_, config.inline_progress,
                                                [eng = e.get()] { eng->on_handed_back(); });
    e->stop_event_ = event_new(
        e->base_, -1, 0,
        [](evutil_socket_t, short, void* b) { event_base_loopbreak(static_cast<event_base*>(b)); },
        e->base_);
    e->flight_turn_event_ = event_new(e->base_, -1, 0, &Engine::on_flight_turns, e.get());
    e->delay_timer_ =
        std::make_unique<TimerQueue::Timer>(*e->timers_, &Engine::on_delay_due, e.get());
    e->held_acks_timer_ =
        std::make_unique<TimerQueue::Timer>(*e->timers_, &Engine::on_held_acks_due, e.get());
    e->capture_timer_ =
        std::make_unique<TimerQueue::Timer>(*e->timers_, &Engine::on_capture_due, e.get());
    if (!e->stop_event_ || !e->flight_turn_event_) {
        err = ENOMEM;
        error = "cannot create the event loop";
        return nullptr;
    }
    // Returns once the thread runs: its start (the C library's and a sanitizer's set-up of a
    // thread allocate) must not overlap a fork() of the application that follows, or the
    // child inherits the allocator's lock held (fork_gate.h).
    std::latch running(1);
    e->thread_ = std::thread([eng = e.get(), &running] {
        // Named so that top -H, perf and gdb tell it from the application's threads.
        pthread_setname_np(pthread_self(), "uroce-engine");
        running.count_down();
        eng->run();
    });
    running.wait();
    return e;
}

Engine::Engine(const EngineConfig& config, std::unique_ptr<DeviceSlot> slot,
               std::unique_ptr<QpnSteering> steering, std::unique_ptr<DeviceCounters> counters)
    : config_(config),
      qpn_space_(std::move(slot), qpn_space_hooks(counters != nullptr)),
      steering_(std::move(steering)),
      device_counters_(std::move(counters)),
      counters_(device_counters_ ? &device_counters_->block() : &own_counters_),
      counters_at_start_(snapshot(*counters_)),
      socket_(config.ip, config.port, steering_ != nullptr),
      send_sockets_(config.ip, socket_, tx_ecn()),
      faults_(config.faults),
      multicast_(config.ip, config.port, &Engine::on_group_readable, this),
      gso_(config.gso) {
    // Application memory may vanish under a registered region: the engine's accesses to it
    // survive that (app_memory_guard.h), and count it.
    install_app_memory_guard();
    memory_.count_faults_in(&counters_->app_memory_faults);
    const bool gro = config.gro && socket_.enable_gro();
    reads_whole_ = gro;
    host_peers_.reserve(config.host_devices.size());
    for (const auto& d : config.host_devices)
        host_peers_.push_back({d.ip, d.port, std::nullopt, SharedValueReader(d.slot_table)});
    // Peers of this device must not send us an answer before its ACK (answer_may_lead_ack).
    // A context that dies without this decrement leaves the count high: its device's peers
    // then only keep the ACK first.
    if (const DeviceSlot* own = qpn_space_.primary_slot(); own && !gro)
        counted_split_ =
            own->update_shared_value(kSplitReadersValue, [](uint32_t n) { return n + 1; }) == 0;
    if (config.ecn_capable) {
        // Best effort: without the reports no packet is seen CE-marked (congestion.h). Only
        // then: a report is a control message on every read, 0.1-0.2 us per ib_read_lat
        // round trip (2026-11-30, 3 pairs).
        socket_.enable_ecn_reports();
        socket_.set_ecn(tx_ecn());
    }
    // Made here, in the device's network namespace: a poller's thread may be in another.
    if (steering_) {
        resteer_ = std::make_unique<KernelResteer>(config.ip);
        if (!resteer_->usable()) resteer_.reset();
    }
    rx_ = gro ? std::make_unique<ReceiveBatch>(kRxBatchGro, kRxBufferBytesGro)
              : std::make_unique<ReceiveBatch>(kRxBatch, kRxBufferBytes);
}

Engine::~Engine() {
    if (thread_.joinable()) {
        event_active(stop_event_, 0, 0);
        thread_.join();
    }
    if (const DeviceSlot* slot = qpn_space_.primary_slot(); slot && counted_split_)
        slot->update_shared_value(kSplitReadersValue, [](uint32_t n) { return n > 0 ? n - 1 : 0; });
    {
        // QPs still attached (an application that did not destroy them) go first: their
        // timers belong to the base.
        std::unique_lock lock(qps_mutex_);
        for (auto& [qpn, qp] : qps_)
            if (qp) qp->close();
        qps_.clear();
    }
    touched_.clear();
    members_.clear();
    multicast_.clear();
    handoff_.reset();
    if (rx_event_) event_free(rx_event_);
    if (stop_event_) event_free(stop_event_);
    if (flight_turn_event_) event_free(flight_turn_event_);
    delay_timer_.reset();  // held packets are lost with the engine
    held_acks_timer_.reset();
    capture_timer_.reset();
    // Another engine of this process may keep the file open: this one's frames go now.
    if (capture_) capture_->flush();
    timers_.reset();
    if (base_) event_base_free(base_);
}

void Engine::close_sockets_after_fork() noexcept {
    send_sockets_.close_fds_after_fork();
    multicast_.close_fds_after_fork();
    socket_.close_fd();
}

QpnSpace::Hooks Engine::qpn_space_hooks(bool device_counters) {
    QpnSpace::Hooks h;
    h.claim_slot = [this](std::string& error, int& err) {
        return DeviceSlots::claim(config_.slot_table, error, err);
    };
    h.route_slot = [this](uint16_t number) { return steering_ ? steering_->route(number) : 0; };
    h.counter_table = [this, device_counters](uint16_t number) {
        return make_qp_counters(config_, number, device_counters);
    };
    return h;
}

}  // namespace uroce::transport
