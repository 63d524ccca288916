#include "transport/send_window.h"

#include <algorithm>

#include "transport/psn.h"

namespace uroce::transport {

void SendWindow::set_ceiling(uint32_t packets) {
    ceiling_ = std::max(packets, kMinPackets);
    if (!opened_) {
        opened_ = true;
        packets_ = ceiling_;
        credit_ = 0;
    }
    packets_ = std::min(packets_, ceiling_);
}

void SendWindow::on_acknowledged(uint32_t packets, uint32_t una_psn) {
    if (recovering_) {
        // The flight that lost a packet is not all acknowledged: it says nothing yet about
        // the smaller window.
        if (psn_before(una_psn, recovery_psn_)) return;
        recovering_ = false;
    }
    if (packets_ >= ceiling_) {
        credit_ = 0;
        return;
    }
    credit_ += packets;
    while (credit_ >= packets_ && packets_ < ceiling_) {
        credit_ -= packets_;
        packets_ = std::min(ceiling_, packets_ + kGrowthPackets);
    }
}

uint32_t SendWindow::floor() const {
    return peer_keeps_ ? std::min(kKeepingMinPackets, ceiling_) : kMinPackets;
}

void SendWindow::set_peer_keeps() {
    // Once: every later proof would undo the cuts of CNPs below the floor.
    if (peer_keeps_) return;
    peer_keeps_ = true;
    packets_ = std::max(packets_, floor());
}

bool SendWindow::on_loss(uint32_t lost_psn, uint32_t sent_high) {
    return cut(lost_psn, sent_high, floor());
}

bool SendWindow::on_congestion(uint32_t oldest_psn, uint32_t sent_high) {
    return cut(oldest_psn, sent_high, kMinPackets);
}

bool SendWindow::cut(uint32_t psn, uint32_t sent_high, uint32_t floor_packets) {
    if (recovering_ && psn_before(psn, recovery_psn_)) return false;
    // Never a rise: a window a CNP cut below a loss's floor stays.
    packets_ = std::min(packets_, std::max(floor_packets, packets_ / 2));
    credit_ = 0;
    recovering_ = true;
    recovery_psn_ = sent_high;
    return true;
}

void SendWindow::undo_cut(uint32_t packets_before) {
    packets_ = std::max(packets_, std::min(packets_before, ceiling_));
    credit_ = 0;
    recovering_ = false;
}

void SendWindow::reset() {
    *this = SendWindow{};
}

}  // namespace uroce::transport
