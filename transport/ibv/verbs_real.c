// SPDX-License-Identifier: Apache-2.0
// verbs_real.c - the verbs table (verbs.h) over libibverbs: the only file
// of the ibv transport that includes <infiniband/verbs.h>. Reliable-
// connected QPs on TP_IBV_DEVICE (or the first device with an ACTIVE
// port), its TP_IBV_PORT (or first ACTIVE port), on RoCE the GID at
// TP_IBV_GID_INDEX (or a RoCE v2 IPv4-mapped one, as NCCL picks), the
// path MTU capped by TP_IBV_MTU; ACK timeout, retries, SL and traffic
// class from TP_IBV_TIMEOUT, _RETRY_CNT, _SL, _TC; RNR retries at 7
// (infinite).
//
// Untested here: this machine has no RDMA device (docs/transport-ibv.md).

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "transport/ibv/verbs.h"

struct tp_ibv_dev {
    struct ibv_context *d_ctx;
    struct ibv_pd *d_pd;
    uint8_t d_port;
    struct ibv_port_attr d_pattr;
    union ibv_gid d_gid;
    uint8_t d_gid_index;
    uint8_t d_mtu; // enum ibv_mtu we offer: min(port's active, TP_IBV_MTU)
    uint8_t d_timeout, d_retry_cnt, d_sl, d_tc;
    char d_name[TP_IBV_NAME_LEN];
};

struct tp_ibv_cq {
    struct ibv_comp_channel *q_ch;
    struct ibv_cq *q_cq;
};

struct tp_ibv_qp {
    tp_ibv_dev *p_dev;
    struct ibv_qp *p_qp;
    uint32_t p_psn;
};

// The QP address, little-endian: lid u16, link layer u8, pad u8, mtu u32,
// qpn u32, psn u32, gid 16 bytes.
enum {
    QA_LID = 0,
    QA_LL = 2,
    QA_MTU = 4,
    QA_QPN = 8,
    QA_PSN = 12,
    QA_GID = 16
};

// Why there is no device: what the kernel and sysfs show.
static void
real_no_device_why(int list_errno, char *why, size_t why_len)
{
    struct stat sb;
    bool sys = stat("/sys/class/infiniband", &sb) == 0;
    bool core = stat("/sys/module/ib_core", &sb) == 0;
    snprintf(why, why_len,
             "no RDMA device: ibv_get_device_list found none%s%s%s; %s; %s",
             list_errno ? " (" : "", list_errno ? strerror(list_errno) : "",
             list_errno ? ")" : "",
             sys ? "/sys/class/infiniband lists no usable device"
                 : "no /sys/class/infiniband",
             core ? "the kernel has InfiniBand support (ib_core)"
                  : "the kernel has no InfiniBand support (no "
                    "/sys/module/ib_core; soft-RoCE cannot load either)");
}

// The tried list of an error: "; "-separated reasons.
static void real_note(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void
real_note(char *buf, size_t len, const char *fmt, ...)
{
    size_t l = strlen(buf);
    if (l + 3 >= len) {
        return;
    }
    if (l > 0) {
        memcpy(buf + l, "; ", 3);
        l += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, len - l, fmt, ap);
    va_end(ap);
}

// A RoCE v2 GID that maps an IPv4 address (::ffff:a.b.c.d), the one NCCL
// prefers: it routes over IPv4 and needs no IPv6 on the fabric.
static bool
real_gid_is_v4(const union ibv_gid *g)
{
    static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, pfx, sizeof(pfx)) == 0;
}

// The GID of @port: on InfiniBand index 0 (no GRH is used); on RoCE
// TP_IBV_GID_INDEX, or (-1) the first RoCE v2 IPv4-mapped GID, else the
// first RoCE v2 one, else index 0. False with @why on failure.
static bool
real_gid_pick(tp_ibv_dev *d, const char *name, int64_t want, char *why,
              size_t why_len)
{
    bool eth = d->d_pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
    int idx = want >= 0 && eth ? (int)want : 0;
    if (eth && want < 0) {
        int v2 = -1, v2_v4 = -1;
        for (int i = 0; i < d->d_pattr.gid_tbl_len && v2_v4 < 0; i++) {
            struct ibv_gid_entry e;
            if (ibv_query_gid_ex(d->d_ctx, d->d_port, (uint32_t)i, &e, 0) !=
                    0 ||
                e.gid_type != IBV_GID_TYPE_ROCE_V2) {
                continue;
            }
            if (v2 < 0) {
                v2 = i;
            }
            if (real_gid_is_v4(&e.gid)) {
                v2_v4 = i;
            }
        }
        idx = v2_v4 >= 0 ? v2_v4 : v2 >= 0 ? v2 : 0;
    }
    if (idx >= d->d_pattr.gid_tbl_len ||
        ibv_query_gid(d->d_ctx, d->d_port, idx, &d->d_gid) != 0) {
        snprintf(why, why_len,
                 "%s port %u: GID index %d cannot be read (the port has %d; "
                 "TP_IBV_GID_INDEX)",
                 name, d->d_port, idx, d->d_pattr.gid_tbl_len);
        return false;
    }
    static const uint8_t zero[16];
    if (eth && memcmp(d->d_gid.raw, zero, sizeof(zero)) == 0) {
        snprintf(why, why_len,
                 "%s port %u: GID index %d is empty (no address on the "
                 "port's netdev?; TP_IBV_GID_INDEX)",
                 name, d->d_port, idx);
        return false;
    }
    d->d_gid_index = (uint8_t)idx;
    return true;
}

// Takes port @port of @ctx (@name) into @d if it is ACTIVE and has a GID;
// else notes why in @tried.
static bool
real_port_take(tp_ibv_dev *d, struct ibv_context *ctx, const char *name,
               uint8_t port, const tp_ibv_tunables *it, char *tried,
               size_t tried_len)
{
    struct ibv_port_attr pa;
    int rv = ibv_query_port(ctx, port, &pa);
    if (rv != 0) {
        real_note(tried, tried_len, "%s port %u: ibv_query_port: %s", name,
                  port, strerror(rv));
        return false;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        const char *st = ibv_port_state_str(pa.state); // "PORT_DOWN"
        if (strncmp(st, "PORT_", 5) == 0) {
            st += 5;
        }
        real_note(tried, tried_len,
                  "%s port %u is %s, not ACTIVE (ibstat %s shows why)", name,
                  port, st, name);
        return false;
    }
    d->d_ctx = ctx;
    d->d_port = port;
    d->d_pattr = pa;
    char why[256];
    if (!real_gid_pick(d, name, it->it_gid_index, why, sizeof(why))) {
        real_note(tried, tried_len, "%s", why);
        d->d_ctx = NULL;
        return false;
    }
    // The MTU we offer: the port's, capped by TP_IBV_MTU (256 = code 1).
    int cap = 1;
    while ((INT64_C(256) << cap) <= it->it_mtu) {
        cap++;
    }
    d->d_mtu = (uint8_t)TP_MIN((int)pa.active_mtu, cap);
    snprintf(d->d_name, sizeof(d->d_name), "%s", name);
    return true;
}

// Opens @dev and takes its port @want (0: the first ACTIVE one).
static bool
real_dev_take(tp_ibv_dev *d, struct ibv_device *dev, unsigned want,
              const tp_ibv_tunables *it, char *tried, size_t tried_len)
{
    const char *name = ibv_get_device_name(dev);
    struct ibv_context *ctx = ibv_open_device(dev);
    if (ctx == NULL) {
        real_note(tried, tried_len, "%s: cannot open (%s)", name,
                  strerror(errno));
        return false;
    }
    struct ibv_device_attr da;
    int rv = ibv_query_device(ctx, &da);
    if (rv != 0) {
        real_note(tried, tried_len, "%s: ibv_query_device: %s", name,
                  strerror(rv));
        ibv_close_device(ctx);
        return false;
    }
    if (want > da.phys_port_cnt) {
        real_note(tried, tried_len, "%s has ports 1..%u, not port %u", name,
                  da.phys_port_cnt, want);
        ibv_close_device(ctx);
        return false;
    }
    for (unsigned p = want ? want : 1; p <= (want ? want : da.phys_port_cnt);
         p++) {
        if (real_port_take(d, ctx, name, (uint8_t)p, it, tried, tried_len)) {
            return true;
        }
    }
    ibv_close_device(ctx);
    return false;
}

static tp_status
real_dev_open(const tp_config *cfg, tp_ibv_dev **dev_p, char *domain,
              size_t domain_len, tp_error **err_p)
{
    const tp_ibv_tunables *it = tp__ibv_tunables_of(cfg);
    char want[TP_IBV_NAME_LEN];
    unsigned port = 0;
    tp_status st = tp__ibv_want_device(cfg, want, sizeof(want), &port, err_p);
    if (st != TP_OK) {
        return st;
    }
    int n = 0;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (list == NULL || n == 0) {
        char why[512];
        real_no_device_why(list == NULL ? errno : 0, why, sizeof(why));
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        return tp__error_set(err_p, TP_ENOTSUP, "ibv: %s", why);
    }
    tp_ibv_dev *d = tp__zalloc(sizeof(*d));
    if (d == NULL) {
        ibv_free_device_list(list);
        return tp__error_set(err_p, TP_ENOMEM, "ibv: out of memory");
    }
    d->d_timeout = (uint8_t)it->it_timeout;
    d->d_retry_cnt = (uint8_t)it->it_retry_cnt;
    d->d_sl = (uint8_t)it->it_sl;
    d->d_tc = (uint8_t)it->it_tc;
    char tried[512] = "";
    char names[256] = "";
    bool found = want[0] == '\0';
    for (int i = 0; i < n && d->d_ctx == NULL; i++) {
        const char *name = ibv_get_device_name(list[i]);
        real_note(names, sizeof(names), "%s", name);
        if (want[0] != '\0') {
            if (strcmp(name, want) != 0) {
                continue;
            }
            found = true;
        }
        (void)real_dev_take(d, list[i], port, it, tried, sizeof(tried));
    }
    ibv_free_device_list(list);
    if (!found) { // the loop saw every device: names is complete
        tp__free(d);
        return tp__error_set(err_p, TP_ENOTSUP,
                             "ibv: TP_IBV_DEVICE=%s: no such device (the "
                             "devices here: %s)",
                             it->it_device, names);
    }
    if (d->d_ctx == NULL) {
        tp__free(d);
        return tp__error_set(err_p, TP_ENOTSUP, "ibv: no usable device (%s)",
                             tried);
    }
    d->d_pd = ibv_alloc_pd(d->d_ctx);
    if (d->d_pd == NULL) {
        int e = errno;
        ibv_close_device(d->d_ctx);
        tp__free(d);
        return tp__error_errno(err_p, e, "ibv: ibv_alloc_pd on %s", d->d_name);
    }
    // One fabric: the same link layer and GID subnet prefix.
    const uint8_t *g = d->d_gid.raw;
    snprintf(domain, domain_len, "ibv:%s:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
             d->d_pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? "eth" : "ib",
             g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
    *dev_p = d;
    return TP_OK;
}

static bool
real_probe(const tp_config *cfg, char *why, size_t why_len)
{
    tp_ibv_dev *d = NULL;
    tp_error *err = NULL;
    char domain[128];
    if (real_dev_open(cfg, &d, domain, sizeof(domain), &err) != TP_OK) {
        const char *m = tp_error_message(err);
        snprintf(why, why_len, "%s", strncmp(m, "ibv: ", 5) == 0 ? m + 5 : m);
        tp_error_unref(err);
        return false;
    }
    ibv_dealloc_pd(d->d_pd);
    ibv_close_device(d->d_ctx);
    tp__free(d);
    return true;
}

static void
real_dev_close(tp_ibv_dev *d)
{
    if (d == NULL) {
        return;
    }
    ibv_dealloc_pd(d->d_pd);
    ibv_close_device(d->d_ctx);
    tp__free(d);
}

static tp_status
real_buf_alloc(tp_ibv_dev *d, size_t len, void **p_p, tp_error **err_p)
{
    TP_UNUSED(d);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return tp__error_errno(err_p, errno, "ibv: mmap of a %zu-byte ring",
                               len);
    }
    *p_p = p;
    return TP_OK;
}

static void
real_buf_free(tp_ibv_dev *d, void *p, size_t len)
{
    TP_UNUSED(d);
    munmap(p, len);
}

static tp_status
real_reg_mr(tp_ibv_dev *d, void *addr, size_t len, bool remote_write,
            tp_ibv_mr **mr_p, tp_error **err_p)
{
    tp_ibv_mr *m = tp__zalloc(sizeof(*m));
    if (m == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv: out of memory");
    }
    int access = IBV_ACCESS_LOCAL_WRITE;
    if (remote_write) {
        access |= IBV_ACCESS_REMOTE_WRITE;
    }
    struct ibv_mr *mr = ibv_reg_mr(d->d_pd, addr, len, access);
    if (mr == NULL) {
        int e = errno;
        tp__free(m);
        return tp__error_errno(err_p, e,
                               "ibv: ibv_reg_mr of %zu bytes on %s (is "
                               "RLIMIT_MEMLOCK large enough?)",
                               len, d->d_name);
    }
    m->mr_addr = addr;
    m->mr_len = len;
    m->mr_lkey = mr->lkey;
    m->mr_rkey = mr->rkey;
    m->mr_impl = mr;
    *mr_p = m;
    return TP_OK;
}

static void
real_dereg_mr(tp_ibv_mr *m)
{
    ibv_dereg_mr(m->mr_impl);
    tp__free(m);
}

static tp_status
real_cq_create(tp_ibv_dev *d, int depth, tp_ibv_cq **cq_p, int *fd_p,
               tp_error **err_p)
{
    tp_ibv_cq *q = tp__zalloc(sizeof(*q));
    if (q == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv: out of memory");
    }
    q->q_ch = ibv_create_comp_channel(d->d_ctx);
    if (q->q_ch == NULL) {
        int e = errno;
        tp__free(q);
        return tp__error_errno(err_p, e, "ibv: ibv_create_comp_channel on %s",
                               d->d_name);
    }
    int fl = fcntl(q->q_ch->fd, F_GETFL);
    if (fl < 0 || fcntl(q->q_ch->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        int e = errno;
        ibv_destroy_comp_channel(q->q_ch);
        tp__free(q);
        return tp__error_errno(err_p, e,
                               "ibv: making the completion channel "
                               "non-blocking");
    }
    q->q_cq = ibv_create_cq(d->d_ctx, depth, NULL, q->q_ch, 0);
    if (q->q_cq == NULL) {
        int e = errno;
        ibv_destroy_comp_channel(q->q_ch);
        tp__free(q);
        return tp__error_errno(err_p, e, "ibv: ibv_create_cq of %d on %s",
                               depth, d->d_name);
    }
    *cq_p = q;
    *fd_p = q->q_ch->fd;
    return TP_OK;
}

static int
real_cq_get_events(tp_ibv_cq *q)
{
    int n = 0;
    struct ibv_cq *cq;
    void *ctx;
    while (ibv_get_cq_event(q->q_ch, &cq, &ctx) == 0) {
        n++;
    }
    if (n > 0) {
        ibv_ack_cq_events(q->q_cq, (unsigned)n);
    }
    return n;
}

static void
real_cq_destroy(tp_ibv_cq *q)
{
    (void)real_cq_get_events(q);
    ibv_destroy_cq(q->q_cq);
    ibv_destroy_comp_channel(q->q_ch);
    tp__free(q);
}

static tp_status
real_cq_req_notify(tp_ibv_cq *q)
{
    return ibv_req_notify_cq(q->q_cq, 0) == 0 ? TP_OK : TP_EDEVICE;
}

static int
real_cq_poll(tp_ibv_cq *q, int n, tp_ibv_wc *out)
{
    struct ibv_wc wc[16];
    if (n > 16) {
        n = 16;
    }
    int got = ibv_poll_cq(q->q_cq, n, wc);
    for (int i = 0; i < got; i++) {
        tp_ibv_wc *o = &out[i];
        memset(o, 0, sizeof(*o));
        o->wc_wr_id = wc[i].wr_id;
        if (wc[i].status == IBV_WC_SUCCESS) {
            o->wc_status = TP_IBV_WC_OK;
            o->wc_opcode =
                (wc[i].opcode & IBV_WC_RECV) ? TP_IBV_WC_RECV : TP_IBV_WC_SEND;
            o->wc_imm = ntohl(wc[i].imm_data);
        } else {
            // The opcode is undefined on errors: receives have wr_id 0.
            o->wc_opcode = wc[i].wr_id == 0 ? TP_IBV_WC_RECV : TP_IBV_WC_SEND;
            o->wc_status = wc[i].status == IBV_WC_WR_FLUSH_ERR
                               ? TP_IBV_WC_FLUSH
                               : TP_IBV_WC_ERROR;
            snprintf(o->wc_why, sizeof(o->wc_why), "%s",
                     ibv_wc_status_str(wc[i].status));
        }
    }
    return got;
}

static tp_status
real_qp_create(tp_ibv_dev *d, tp_ibv_cq *q, int send_depth, int recv_depth,
               tp_ibv_qp **qp_p, tp_ibv_qp_addr *addr_p, tp_error **err_p)
{
    tp_ibv_qp *p = tp__zalloc(sizeof(*p));
    if (p == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv: out of memory");
    }
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = q->q_cq;
    ia.recv_cq = q->q_cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = (uint32_t)send_depth;
    ia.cap.max_recv_wr = (uint32_t)recv_depth;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    p->p_qp = ibv_create_qp(d->d_pd, &ia);
    if (p->p_qp == NULL) {
        int e = errno;
        tp__free(p);
        return tp__error_errno(err_p, e, "ibv: ibv_create_qp on %s", d->d_name);
    }
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = d->d_port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    int rv = ibv_modify_qp(p->p_qp, &a,
                           IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                               IBV_QP_ACCESS_FLAGS);
    if (rv != 0) {
        ibv_destroy_qp(p->p_qp);
        tp__free(p);
        return tp__error_errno(err_p, rv, "ibv: QP to INIT on %s", d->d_name);
    }
    p->p_dev = d;
    p->p_psn = (uint32_t)random() & 0xffffffu;
    memset(addr_p, 0, sizeof(*addr_p));
    uint8_t *b = addr_p->qa_bytes;
    b[QA_LID] = (uint8_t)(d->d_pattr.lid & 0xff);
    b[QA_LID + 1] = (uint8_t)(d->d_pattr.lid >> 8);
    b[QA_LL] = d->d_pattr.link_layer;
    tp__put_u32le(b + QA_MTU, d->d_mtu);
    tp__put_u32le(b + QA_QPN, p->p_qp->qp_num);
    tp__put_u32le(b + QA_PSN, p->p_psn);
    memcpy(b + QA_GID, d->d_gid.raw, 16);
    *qp_p = p;
    return TP_OK;
}

static tp_status
real_qp_connect(tp_ibv_qp *p, const tp_ibv_qp_addr *remote, tp_error **err_p)
{
    tp_ibv_dev *d = p->p_dev;
    const uint8_t *b = remote->qa_bytes;
    uint32_t mtu = tp__get_u32le(b + QA_MTU);
    if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096) {
        return tp__error_set(err_p, TP_EPROTO, "ibv: peer sent MTU code %u",
                             mtu);
    }
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)TP_MIN(mtu, (uint32_t)d->d_mtu);
    a.dest_qp_num = tp__get_u32le(b + QA_QPN);
    a.rq_psn = tp__get_u32le(b + QA_PSN) & 0xffffffu;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = (uint16_t)(b[QA_LID] | (b[QA_LID + 1] << 8));
    a.ah_attr.port_num = d->d_port;
    a.ah_attr.sl = d->d_sl;
    if (d->d_pattr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, b + QA_GID, 16);
        a.ah_attr.grh.sgid_index = d->d_gid_index;
        a.ah_attr.grh.hop_limit = 1;
        a.ah_attr.grh.traffic_class = d->d_tc;
    }
    int rv = ibv_modify_qp(
        p->p_qp, &a,
        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rv != 0) {
        return tp__error_errno(err_p, rv, "ibv: QP to RTR on %s", d->d_name);
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = d->d_timeout;
    a.retry_cnt = d->d_retry_cnt;
    a.rnr_retry = 7;
    a.sq_psn = p->p_psn;
    a.max_rd_atomic = 1;
    rv = ibv_modify_qp(p->p_qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
    if (rv != 0) {
        return tp__error_errno(err_p, rv, "ibv: QP to RTS on %s", d->d_name);
    }
    return TP_OK;
}

static void
real_qp_set_error(tp_ibv_qp *p)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_ERR;
    (void)ibv_modify_qp(p->p_qp, &a, IBV_QP_STATE);
}

static void
real_qp_destroy(tp_ibv_qp *p)
{
    ibv_destroy_qp(p->p_qp);
    tp__free(p);
}

static tp_status
real_post_recv(tp_ibv_qp *p, uint64_t wr_id, tp_error **err_p)
{
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.num_sge = 0;
    int rv = ibv_post_recv(p->p_qp, &wr, &bad);
    if (rv != 0) {
        return tp__error_errno(err_p, rv, "ibv: ibv_post_recv");
    }
    return TP_OK;
}

static tp_status
real_post_write_imm(tp_ibv_qp *p, uint64_t wr_id, const void *laddr,
                    const tp_ibv_mr *lmr, uint32_t len, uint64_t raddr,
                    uint32_t rkey, uint32_t imm, tp_error **err_p)
{
    struct ibv_sge sge;
    sge.addr = (uint64_t)(uintptr_t)laddr;
    sge.length = len;
    sge.lkey = lmr->mr_lkey;
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = len > 0 ? &sge : NULL;
    wr.num_sge = len > 0 ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    int rv = ibv_post_send(p->p_qp, &wr, &bad);
    if (rv != 0) {
        return tp__error_errno(err_p, rv, "ibv: ibv_post_send of %u bytes",
                               len);
    }
    return TP_OK;
}

const tp_ibv_verbs tp__ibv_verbs_real = {
    .v_name = "libibverbs",
    .probe = real_probe,
    .dev_open = real_dev_open,
    .dev_close = real_dev_close,
    .buf_alloc = real_buf_alloc,
    .buf_free = real_buf_free,
    .reg_mr = real_reg_mr,
    .dereg_mr = real_dereg_mr,
    .cq_create = real_cq_create,
    .cq_destroy = real_cq_destroy,
    .cq_get_events = real_cq_get_events,
    .cq_req_notify = real_cq_req_notify,
    .cq_poll = real_cq_poll,
    .qp_create = real_qp_create,
    .qp_connect = real_qp_connect,
    .qp_set_error = real_qp_set_error,
    .qp_destroy = real_qp_destroy,
    .post_recv = real_post_recv,
    .post_write_imm = real_post_write_imm,
};
