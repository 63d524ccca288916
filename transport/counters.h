// What an engine has seen and done, for tests, benchmarks and users chasing a problem.
#pragma once

#include <atomic>
#include <cstdint>

namespace uroce::transport {

#define UROCE_COUNTERS(X)                                                                        \
    X(tx_packets)                /* RoCEv2 packets handed to the socket */                       \
    X(tx_dropped_fault)          /* dropped on purpose by UROCE_FAULTS */                        \
    X(tx_corrupted_fault)        /* sent with one bit flipped by UROCE_FAULTS */                 \
    X(tx_duplicated_fault)       /* sent twice by UROCE_FAULTS */                                \
    X(tx_delayed_fault)          /* held back by UROCE_FAULTS' delay (and jitter) */             \
    X(tx_reordered_fault)        /* held back by UROCE_FAULTS' reorder: later ones overtake */   \
    X(rx_dropped_fault)          /* received, then lost on purpose by UROCE_FAULTS (dir=rx) */   \
    X(rx_corrupted_fault)        /* received, one bit flipped by UROCE_FAULTS (dir=rx) */        \
    X(rx_duplicated_fault)       /* received, handled twice by UROCE_FAULTS (dir=rx) */          \
    X(rx_delayed_fault)          /* received, held back by UROCE_FAULTS' delay (dir=rx) */       \
    X(rx_reordered_fault)        /* received, held back by UROCE_FAULTS' reorder (dir=rx) */     \
    X(tx_dropped_filter)         /* dropped by a test's transmit filter */                       \
    X(tx_errors)                 /* sendmsg failures */                                          \
    X(rx_packets)                /* datagrams read from the socket */                            \
    X(rx_malformed)              /* failed to parse as RoCEv2 */                                 \
    X(rx_bad_icrc)               /* ICRC explained by no header value: corrupted */              \
    X(rx_icrc_unseen_fields)     /* ICRC valid with a non-zero IP id (e.g. kernel rxe) */        \
    X(rx_unknown_qp)             /* destination QP does not exist */                             \
    X(rx_wrong_peer)             /* source is not the QP's connected peer */                     \
    X(rx_bad_pkey)               /* P_Key other than the default partition */                    \
    X(rx_wrong_state)            /* QP in a state that takes no packets */                       \
    X(rx_unsupported)            /* opcode of a transport the QP does not run */                 \
    X(rx_duplicate)              /* duplicate requests answered again */                         \
    X(rx_out_of_sequence)        /* requests ahead of the expected PSN */                        \
    X(tx_seq_naks)               /* PSN sequence error NAKs sent */                              \
    X(tx_seq_nak_repeats)        /* of them, sent again: the newest early packet came again */   \
    X(tx_rnr_naks)               /* receiver-not-ready NAKs sent */                              \
    X(tx_access_naks)            /* remote access error NAKs sent */                             \
    X(tx_invalid_naks)           /* invalid request NAKs sent */                                 \
    X(tx_acks)                   /* ACKs sent */                                                 \
    X(tx_last_ack_repeats)       /* last ACKs sent again as their QP stopped answering */        \
    X(retransmit_timeouts)       /* retransmission timer expiries */                             \
    X(retransmitted_packets)     /* request packets sent again */                                \
    X(selective_resends)         /* sequence NAKs answered with the lost packet alone */         \
    X(rx_naks)                   /* NAKs received */                                             \
    X(rx_response_out_of_window) /* responses for PSNs not sent or already acknowledged */       \
    X(rx_cnp)                    /* RoCEv2 congestion notification packets */                    \
    X(rx_duplicate_dropped)      /* duplicate READs matching no READ executed */                 \
    X(rx_held_overflow)          /* requests refused: too many waiting behind a READ */          \
    X(rx_early_kept)             /* early requests kept for later (early_requests.h) */          \
    X(rx_early_run)              /* kept requests run once the missing one came */               \
    X(rx_early_dropped)          /* early requests not kept: no budget, or a 2nd copy differs */ \
    X(tx_dropped_full)           /* socket buffer full: dropped, recovered as a loss */          \
    X(tx_too_big)                /* EMSGSIZE: packet larger than the path's IP MTU */            \
    X(tx_sport_fallback)         /* QPs sending from the main port: source port not bound */     \
    X(cq_overruns)               /* completions that found their CQ full */                      \
    X(rx_bad_qkey)               /* UD packets whose Q_Key is not the QP's */                    \
    X(rx_no_recv_wqe)            /* UD/UC messages dropped: no receive WQE posted */             \
    X(rx_uc_dropped)             /* UC messages given up: a lost packet, a bad key or length */  \
    X(rx_bad_xrc_srq)            /* XRC requests for no XRC SRQ of the target's domain */        \
    X(rx_bad_mcast_qpn)          /* multicast not for QP 0xFFFFFF, or unicast for it */          \
    X(rx_mcast_no_qp)            /* multicast datagrams for a group no QP here is attached to */ \
    X(early_retransmits) /* adaptive timeouts before the local ACK timeout (not retries) */      \
    X(tail_probes)       /* probes when no ACK came within ~2 round trips (rc_qp.h) */           \
    X(resends_held_back) /* early resends and probes skipped: the engine's budget was spent */   \
    X(tx_gso_sends)      /* sendmsg calls that carried several packets (UDP GSO) */              \
    X(tx_gso_fallbacks)  /* GSO sends refused: resent one by one (GSO off if those went out) */  \
    X(rx_gro_datagrams)  /* reads that returned several packets (UDP GRO) */                     \
    X(rx_polled_packets) /* packets read by application threads polling a CQ */                  \
    X(socket_parks)      /* times polling threads took the socket from the engine thread */      \
    X(socket_handbacks)  /* times the engine thread took it back: the polls had stopped */       \
    X(watch_wakeups)     /* engine-thread wake-ups to check that the polls go on */              \
    X(rx_spin_packets)   /* packets the engine thread read spinning after a batch, not woken */  \
    X(tx_held_posts)     /* posts that waited for the next CQ poll (held_posts.h) */             \
    X(deferred_timers)   /* RC timers a poller armed, kept off the loop until the hand-back */   \
    X(tx_held_acks)      /* RC ACKs that waited for their application's answer */                \
    X(held_ack_timeouts) /* ACKs held for an answer that went out after ack_hold_micros  */      \
    X(app_memory_faults) /* accesses to registered memory whose pages were gone */               \
    X(tx_multi_sends)    /* sendmmsg calls that carried several trains (TransmitBatch) */        \
    X(timerfd_sets)      /* times the engine's timerfd was set (TimerQueue) */                   \
    X(timer_early_wakes) /* timerfd expiries that found no timer due (a deadline moved) */       \
    X(rx_duplicate_ack_pending) /* duplicates whose ACK was pending: not sent at once */         \
    X(send_window_cuts)         /* RC send windows halved by a loss (send_window.h) */           \
    X(rx_ce_marked)             /* packets for a QP marked ECN CE (congestion.h) */              \
    X(tx_cnps)                  /* CNPs sent to peers whose packets came CE-marked */            \
    X(cnps_paced)               /* CE-marked packets answered by no CNP: one had just gone */    \
    X(cnp_window_cuts)          /* RC send windows halved by a CNP (congestion.h) */             \
    X(tx_ce_fault)              /* sent marked ECN CE by UROCE_FAULTS' ce */                     \
    X(rx_ce_fault)              /* received, taken as ECN CE by UROCE_FAULTS' ce (dir=rx) */     \
    X(rx_resteered)             /* other contexts' datagrams of a merged read, steered again */  \
    X(spurious_retransmits)     /* timer resends a duplicate's ACK proved needless (undone) */   \
    X(rx_read_kept)             /* READ responses kept after a missing one (not asked again) */  \
    X(flight_waits)             /* RC QPs that waited for room in the engine's flight budget */

struct EngineCounters {
#define UROCE_COUNTER_FIELD(name) std::atomic<uint64_t> name{0};
    UROCE_COUNTERS(UROCE_COUNTER_FIELD)
#undef UROCE_COUNTER_FIELD
};

inline void bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace uroce::transport
