/* SPDX-License-Identifier: Apache-2.0 */
/* verbs.h (internal) - the few verbs operations the ibv transport uses, as
 * a table of function pointers, so that the protocol and connection logic
 * (proto.c, conn.c, setup.c) never call libibverbs directly:
 *
 *   verbs_real.c    the table over libibverbs (the only file that includes
 *                   <infiniband/verbs.h>)
 *   tests/harness/ibv_fake.c
 *                   an in-memory fake with RC semantics, linked only into
 *                   tp_testing and installed by the test harness
 *
 * Types are our own (no struct ibv_*), opaque per implementation. Every
 * call runs on the transport's loop thread, except probe and dev_open.
 * Errors: a tp_status and, where it can fail because of the environment,
 * an error naming the operation and the reason. */
#ifndef TP_TRANSPORT_IBV_VERBS_H
#define TP_TRANSPORT_IBV_VERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/error.h"
#include "core/tunables.h"

// ---- tunables (tunables.c; docs/transport-ibv.md) ----
// The ibv transport's own tunables (TP_TUNABLES_OWN), inside every
// tp_config: read them with tp__ibv_tunables_of(cfg). The verbs table reads
// the device, port, GID and link rows in dev_open; the transport reads the
// ring and pool rows when its context starts.
#define TP_IBV_NAME_LEN 64
#define TP_IBV_POOL_CAP 64 // TP_IBV_POOL_MAX's bound
typedef struct tp_ibv_tunables {
    char it_device[TP_IBV_NAME_LEN]; // TP_IBV_DEVICE: "" | name | name:port
    int64_t it_port;                 // TP_IBV_PORT, 0 = first active
    int64_t it_gid_index;            // TP_IBV_GID_INDEX, -1 = choose
    int64_t it_mtu;                  // TP_IBV_MTU: cap on the path MTU
    int64_t it_ring_size;            // TP_IBV_RING_SIZE: each side's inbox
    int64_t it_pool_max;             // TP_IBV_POOL_MAX: ring pairs kept
    int64_t it_timeout;              // TP_IBV_TIMEOUT: 4.096 us * 2^n
    int64_t it_retry_cnt;            // TP_IBV_RETRY_CNT
    int64_t it_sl;                   // TP_IBV_SL: service level
    int64_t it_tc;                   // TP_IBV_TC: traffic class (RoCE)
} tp_ibv_tunables;

extern const tp_tunables tp__ibv_tunables;

static inline const tp_ibv_tunables *
tp__ibv_tunables_of(const tp_config *cfg)
{
    return tp__config_own_const(cfg, &tp__ibv_tunables);
}

// The device and port asked for: TP_IBV_DEVICE is "" (any), "mlx5_0" or
// "mlx5_0:1"; a port in it wins over TP_IBV_PORT. *port_p = 0: the first
// active port. TP_EINVAL naming TP_IBV_DEVICE when the port part is not a
// number in 1..255.
tp_status tp__ibv_want_device(const tp_config *cfg, char *name, size_t name_len,
                              unsigned *port_p, tp_error **err_p);

typedef struct tp_ibv_dev tp_ibv_dev; // device + protection domain
typedef struct tp_ibv_cq tp_ibv_cq;   // completion queue + its channel
typedef struct tp_ibv_qp tp_ibv_qp;   // a reliable-connected queue pair

// A registered memory region.
typedef struct tp_ibv_mr {
    void *mr_addr;
    size_t mr_len;
    uint32_t mr_lkey;
    uint32_t mr_rkey;
    void *mr_impl;
} tp_ibv_mr;

// What the peer needs to connect its queue pair to ours (exchanged over
// the tcp bootstrap). Opaque bytes filled by the implementation: LID, GID,
// QP number, PSN and MTU for real verbs.
#define TP_IBV_QP_ADDR_LEN 48u
typedef struct tp_ibv_qp_addr {
    uint8_t qa_bytes[TP_IBV_QP_ADDR_LEN];
} tp_ibv_qp_addr;

enum {
    TP_IBV_WC_SEND = 1, // a posted RDMA write (with immediate) finished
    TP_IBV_WC_RECV = 2, // a write with immediate from the peer landed
};

enum {
    TP_IBV_WC_OK = 0,
    TP_IBV_WC_FLUSH = 1, // the QP went to the error state; not executed
    TP_IBV_WC_ERROR = 2, // transport error (retries exceeded, access)
};

// A work completion.
typedef struct tp_ibv_wc {
    uint64_t wc_wr_id;
    int wc_opcode; // TP_IBV_WC_SEND / RECV
    int wc_status; // TP_IBV_WC_OK / FLUSH / ERROR
    uint32_t wc_imm;
    char wc_why[64]; // status text for errors ("retry exceeded")
} tp_ibv_wc;

typedef struct tp_ibv_verbs {
    const char *v_name; // "libibverbs", "fake"
    // Any thread: true if a device can be opened here; else @why says why.
    bool (*probe)(const tp_config *cfg, char *why, size_t why_len);
    // Any thread: open the first usable device (or TP_IBV_DEVICE's), its
    // protection domain, and write a descriptor of its fabric to @domain
    // ("ibv:mlx5_0:fe80000000000000" - ends on one subnet match).
    tp_status (*dev_open)(const tp_config *cfg, tp_ibv_dev **dev_p,
                          char *domain, size_t domain_len, tp_error **err_p);
    void (*dev_close)(tp_ibv_dev *dev);
    // Memory the peer may write to with RDMA (the rings). Page-aligned,
    // zeroed.
    tp_status (*buf_alloc)(tp_ibv_dev *dev, size_t len, void **p_p,
                           tp_error **err_p);
    void (*buf_free)(tp_ibv_dev *dev, void *p, size_t len);
    tp_status (*reg_mr)(tp_ibv_dev *dev, void *addr, size_t len,
                        bool remote_write, tp_ibv_mr **mr_p, tp_error **err_p);
    void (*dereg_mr)(tp_ibv_mr *mr);
    // A CQ with @depth entries and a completion channel whose fd (*fd_p,
    // non-blocking) becomes readable when an armed CQ gets a completion.
    tp_status (*cq_create)(tp_ibv_dev *dev, int depth, tp_ibv_cq **cq_p,
                           int *fd_p, tp_error **err_p);
    void (*cq_destroy)(tp_ibv_cq *cq);
    // Takes and acknowledges the channel's pending events (non-blocking);
    // returns how many.
    int (*cq_get_events)(tp_ibv_cq *cq);
    // Arms the CQ: the next completion makes the channel fd readable.
    tp_status (*cq_req_notify)(tp_ibv_cq *cq);
    // Up to @n completions, in order; returns the count, < 0 on error.
    int (*cq_poll)(tp_ibv_cq *cq, int n, tp_ibv_wc *wc);
    // A QP (INIT) on @cq; *addr_p says how to reach it.
    tp_status (*qp_create)(tp_ibv_dev *dev, tp_ibv_cq *cq, int send_depth,
                           int recv_depth, tp_ibv_qp **qp_p,
                           tp_ibv_qp_addr *addr_p, tp_error **err_p);
    // INIT -> RTR -> RTS towards the peer's QP at @remote.
    tp_status (*qp_connect)(tp_ibv_qp *qp, const tp_ibv_qp_addr *remote,
                            tp_error **err_p);
    // To the error state: posted work requests complete with FLUSH.
    void (*qp_set_error)(tp_ibv_qp *qp);
    void (*qp_destroy)(tp_ibv_qp *qp);
    // A receive for one write with immediate (no data: it lands in memory).
    tp_status (*post_recv)(tp_ibv_qp *qp, uint64_t wr_id, tp_error **err_p);
    // RDMA_WRITE_WITH_IMM of @len bytes (0 allowed) from @laddr (in @lmr)
    // to @raddr (under @rkey) on the peer; signaled.
    tp_status (*post_write_imm)(tp_ibv_qp *qp, uint64_t wr_id,
                                const void *laddr, const tp_ibv_mr *lmr,
                                uint32_t len, uint64_t raddr, uint32_t rkey,
                                uint32_t imm, tp_error **err_p);
} tp_ibv_verbs;

// The libibverbs table (verbs_real.c).
extern const tp_ibv_verbs tp__ibv_verbs_real;

// Testing hook: the table the ibv transport uses from now on (NULL: the
// real one). Set by the test harness before any transport exists; never
// from the environment by the library itself.
void tp__ibv_verbs_override(const tp_ibv_verbs *v);
const tp_ibv_verbs *tp__ibv_verbs(void);

// ---- memory registration cache (mr_cache.c) ----
// Registrations keyed by range: a lookup of a range inside one already
// registered (with the same access) takes a reference instead of
// registering again; the last put deregisters. Loop thread only.
typedef struct tp_ibv_mr_cache {
    const tp_ibv_verbs *mc_v;
    tp_ibv_dev *mc_dev;
    struct tp_ibv_mr_ent *mc_ents;
    uint64_t mc_hits;
    uint64_t mc_misses;
} tp_ibv_mr_cache;

void tp__ibv_mr_cache_init(tp_ibv_mr_cache *mc, const tp_ibv_verbs *v,
                           tp_ibv_dev *dev);
// Deregisters what is left (a leak in the caller, logged).
void tp__ibv_mr_cache_fini(tp_ibv_mr_cache *mc);
tp_status tp__ibv_mr_get(tp_ibv_mr_cache *mc, void *addr, size_t len,
                         bool remote_write, const tp_ibv_mr **mr_p,
                         tp_error **err_p);
void tp__ibv_mr_put(tp_ibv_mr_cache *mc, const tp_ibv_mr *mr);

#endif
