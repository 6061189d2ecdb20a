// SPDX-License-Identifier: Apache-2.0
// ibv_fake.c - the in-memory verbs fake (see ibv_fake.h).

#include "ibv_fake.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/wire.h"

#define FAKE_HDR 4096u // the memfd's first page: the region's address

struct tp_ibv_dev {
    char d_name[TP_IBV_NAME_LEN];
    unsigned d_port;
};

// The fake's devices and their ports' states, as ibv_devinfo would list
// them: fake_1's port 2 is down, so the ACTIVE check has a case.
typedef struct fake_devinfo {
    const char *fd_name;
    unsigned fd_nports;
    unsigned fd_down; // a port that is not ACTIVE (0: none)
} fake_devinfo;
static const fake_devinfo fake_devs[] = {
    {"fake_0", 1, 0},
    {"fake_1", 2, 2},
};

typedef struct fake_region {
    struct fake_region *r_next;
    uint8_t *r_map; // header page + user bytes
    size_t r_len;   // user bytes
    int r_fd;
} fake_region;

static pthread_mutex_t fake_mtx = PTHREAD_MUTEX_INITIALIZER;
static fake_region *fake_regions;
static _Atomic uint64_t fake_reg_count, fake_dereg_count, fake_write_count;
static _Atomic uint32_t fake_corrupt_imm;
static _Atomic bool fake_corrupt_armed;

// A completion as it travels through the CQ's pipe (one atomic write).
typedef struct fake_msg {
    uint8_t m_opcode;
    uint8_t m_status;
    uint8_t m_why; // index into fake_whys
    uint8_t m_pad;
    uint32_t m_imm;
    uint64_t m_wr_id;
} fake_msg;
_Static_assert(sizeof(fake_msg) == 16, "fake completion is 16 bytes");

static const char *const fake_whys[] = {
    "",
    "work request flushed (QP in error state)",
    "transport retry counter exceeded (peer gone)",
    "remote access error (address outside the peer's region)",
    "local protection error (buffer not registered)",
    "receiver not ready (no receive posted)",
};
enum { W_NONE, W_FLUSH, W_RETRY, W_RACCESS, W_LPROT, W_RNR };

struct tp_ibv_cq {
    int q_rd; // the channel fd
    int q_wr;
    struct tp_ibv_qp *q_qp;
};

enum { QP_INIT, QP_RTS, QP_ERR };

struct tp_ibv_qp {
    tp_ibv_cq *p_cq;
    int p_state;
    unsigned p_recvs; // posted, not consumed
    pid_t p_peer_pid;
    int p_peer_cq; // the peer CQ's write end, opened through /proc
    uint32_t p_map_rkey;
    uint8_t *p_map; // the peer region's mapping (header page first)
    size_t p_map_len;
    uint64_t p_map_base; // the region's address in the peer
};

void
tp__ibv_fake_stats(tp_ibv_fake_stats *st)
{
    st->fs_reg_mr = atomic_load(&fake_reg_count);
    st->fs_dereg_mr = atomic_load(&fake_dereg_count);
    st->fs_writes = atomic_load(&fake_write_count);
}

void
tp__ibv_fake_corrupt_next_imm(uint32_t imm)
{
    atomic_store(&fake_corrupt_imm, imm);
    atomic_store(&fake_corrupt_armed, true);
}

// The device choice of verbs_real.c, on the fake's table: TP_IBV_DEVICE
// (or the first device), TP_IBV_PORT (or the first ACTIVE port).
static tp_status
fake_choose(const tp_config *cfg, tp_ibv_dev *d, tp_error **err_p)
{
    char want[TP_IBV_NAME_LEN];
    unsigned port = 0;
    tp_status st = tp__ibv_want_device(cfg, want, sizeof(want), &port, err_p);
    if (st != TP_OK) {
        return st;
    }
    const fake_devinfo *di = want[0] == '\0' ? &fake_devs[0] : NULL;
    char names[128] = "";
    for (size_t i = 0; i < TP_ARRAY_LEN(fake_devs); i++) {
        size_t l = strlen(names);
        snprintf(names + l, sizeof(names) - l, "%s%s", l ? "; " : "",
                 fake_devs[i].fd_name);
        if (di == NULL && strcmp(fake_devs[i].fd_name, want) == 0) {
            di = &fake_devs[i];
        }
    }
    if (di == NULL) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "ibv: TP_IBV_DEVICE=%s: no such device (the "
                             "devices here: %s)",
                             tp__ibv_tunables_of(cfg)->it_device, names);
    }
    if (port > di->fd_nports) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "ibv: no usable device (%s has ports 1..%u, not "
                             "port %u)",
                             di->fd_name, di->fd_nports, port);
    }
    if (port != 0 && port == di->fd_down) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "ibv: no usable device (%s port %u is DOWN, not "
                             "ACTIVE (ibstat %s shows why))",
                             di->fd_name, port, di->fd_name);
    }
    snprintf(d->d_name, sizeof(d->d_name), "%s", di->fd_name);
    d->d_port = port != 0 ? port : 1;
    return TP_OK;
}

static bool
fake_probe(const tp_config *cfg, char *why, size_t why_len)
{
    tp_ibv_dev d;
    tp_error *err = NULL;
    if (fake_choose(cfg, &d, &err) != TP_OK) {
        const char *m = tp_error_message(err);
        snprintf(why, why_len, "%s", strncmp(m, "ibv: ", 5) == 0 ? m + 5 : m);
        tp_error_unref(err);
        return false;
    }
    return true;
}

static tp_status
fake_dev_open(const tp_config *cfg, tp_ibv_dev **dev_p, char *domain,
              size_t domain_len, tp_error **err_p)
{
    tp_ibv_dev *d = tp__zalloc(sizeof(*d));
    if (d == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv fake: out of memory");
    }
    tp_status st = fake_choose(cfg, d, err_p);
    if (st != TP_OK) {
        tp__free(d);
        return st;
    }
    // One fabric: every fake device reaches every other.
    snprintf(domain, domain_len, "ibv:fake");
    *dev_p = d;
    return TP_OK;
}

// The device and port this transport's verbs opened (tests).
void
tp__ibv_fake_dev_name(const tp_ibv_dev *d, char *buf, size_t len)
{
    snprintf(buf, len, "%s:%u", d->d_name, d->d_port);
}

static void
fake_dev_close(tp_ibv_dev *d)
{
    tp__free(d);
}

static tp_status
fake_buf_alloc(tp_ibv_dev *d, size_t len, void **p_p, tp_error **err_p)
{
    TP_UNUSED(d);
    fake_region *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv fake: out of memory");
    }
    r->r_fd = memfd_create("tp-ibv-fake", MFD_CLOEXEC);
    if (r->r_fd < 0 || ftruncate(r->r_fd, (off_t)(FAKE_HDR + len)) != 0) {
        int e = errno;
        if (r->r_fd >= 0) {
            close(r->r_fd);
        }
        tp__free(r);
        return tp__error_errno(err_p, e, "ibv fake: memfd of %zu bytes", len);
    }
    void *m = mmap(NULL, FAKE_HDR + len, PROT_READ | PROT_WRITE, MAP_SHARED,
                   r->r_fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(r->r_fd);
        tp__free(r);
        return tp__error_errno(err_p, e, "ibv fake: mmap of %zu bytes", len);
    }
    r->r_map = m;
    r->r_len = len;
    tp__put_u64le(r->r_map, (uint64_t)(uintptr_t)(r->r_map + FAKE_HDR));
    pthread_mutex_lock(&fake_mtx);
    r->r_next = fake_regions;
    fake_regions = r;
    pthread_mutex_unlock(&fake_mtx);
    *p_p = r->r_map + FAKE_HDR;
    return TP_OK;
}

static fake_region *
fake_region_find(const void *p, size_t len)
{
    const uint8_t *a = p;
    fake_region *found = NULL;
    pthread_mutex_lock(&fake_mtx);
    for (fake_region *r = fake_regions; r != NULL; r = r->r_next) {
        if (a >= r->r_map + FAKE_HDR &&
            a + len <= r->r_map + FAKE_HDR + r->r_len) {
            found = r;
            break;
        }
    }
    pthread_mutex_unlock(&fake_mtx);
    return found;
}

static void
fake_buf_free(tp_ibv_dev *d, void *p, size_t len)
{
    TP_UNUSED(d);
    pthread_mutex_lock(&fake_mtx);
    for (fake_region **pp = &fake_regions; *pp != NULL; pp = &(*pp)->r_next) {
        fake_region *r = *pp;
        if (r->r_map + FAKE_HDR == p) {
            *pp = r->r_next;
            pthread_mutex_unlock(&fake_mtx);
            TP_ASSERT(r->r_len == len);
            munmap(r->r_map, FAKE_HDR + r->r_len);
            close(r->r_fd);
            tp__free(r);
            return;
        }
    }
    pthread_mutex_unlock(&fake_mtx);
    TP_ASSERT(!"ibv fake: buf_free of an unknown buffer");
}

static tp_status
fake_reg_mr(tp_ibv_dev *d, void *addr, size_t len, bool remote_write,
            tp_ibv_mr **mr_p, tp_error **err_p)
{
    TP_UNUSED(d);
    TP_UNUSED(remote_write);
    fake_region *r = fake_region_find(addr, len);
    if (r == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "ibv fake: reg_mr of %zu bytes outside any "
                             "buffer from buf_alloc",
                             len);
    }
    tp_ibv_mr *m = tp__zalloc(sizeof(*m));
    if (m == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv fake: out of memory");
    }
    m->mr_addr = addr;
    m->mr_len = len;
    m->mr_lkey = (uint32_t)r->r_fd;
    m->mr_rkey = (uint32_t)r->r_fd;
    m->mr_impl = r;
    atomic_fetch_add(&fake_reg_count, 1);
    *mr_p = m;
    return TP_OK;
}

static void
fake_dereg_mr(tp_ibv_mr *m)
{
    atomic_fetch_add(&fake_dereg_count, 1);
    tp__free(m);
}

static tp_status
fake_cq_create(tp_ibv_dev *d, int depth, tp_ibv_cq **cq_p, int *fd_p,
               tp_error **err_p)
{
    TP_UNUSED(d);
    TP_UNUSED(depth);
    tp_ibv_cq *q = tp__zalloc(sizeof(*q));
    if (q == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv fake: out of memory");
    }
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        int e = errno;
        tp__free(q);
        return tp__error_errno(err_p, e, "ibv fake: pipe for a CQ");
    }
    q->q_rd = fds[0];
    q->q_wr = fds[1];
    *cq_p = q;
    *fd_p = q->q_rd;
    return TP_OK;
}

static void
fake_cq_destroy(tp_ibv_cq *q)
{
    close(q->q_rd);
    close(q->q_wr);
    tp__free(q);
}

static int
fake_cq_get_events(tp_ibv_cq *q)
{
    TP_UNUSED(q);
    return 0;
}

static tp_status
fake_cq_req_notify(tp_ibv_cq *q)
{
    TP_UNUSED(q);
    return TP_OK;
}

// Queues a completion on @fd (ours or the peer's CQ). False if it is gone.
static bool
fake_put(int fd, int opcode, int status, int why, uint32_t imm, uint64_t wr_id)
{
    fake_msg m;
    memset(&m, 0, sizeof(m));
    m.m_opcode = (uint8_t)opcode;
    m.m_status = (uint8_t)status;
    m.m_why = (uint8_t)why;
    m.m_imm = imm;
    m.m_wr_id = wr_id;
    ssize_t n;
    do {
        n = write(fd, &m, sizeof(m));
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof(m);
}

static void
fake_qp_flush_recvs(tp_ibv_qp *p)
{
    for (; p->p_recvs > 0; p->p_recvs--) {
        (void)fake_put(p->p_cq->q_wr, TP_IBV_WC_RECV, TP_IBV_WC_FLUSH, W_FLUSH,
                       0, 0);
    }
}

static void
fake_qp_set_error(tp_ibv_qp *p)
{
    p->p_state = QP_ERR;
    fake_qp_flush_recvs(p);
}

static int
fake_cq_poll(tp_ibv_cq *q, int n, tp_ibv_wc *wc)
{
    fake_msg m[16];
    if (n > 16) {
        n = 16;
    }
    ssize_t got;
    do {
        got = read(q->q_rd, m, sizeof(m[0]) * (size_t)n);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        return errno == EAGAIN ? 0 : -1;
    }
    TP_ASSERT(got % (ssize_t)sizeof(fake_msg) == 0);
    int k = (int)(got / (ssize_t)sizeof(fake_msg));
    for (int i = 0; i < k; i++) {
        memset(&wc[i], 0, sizeof(wc[i]));
        wc[i].wc_wr_id = m[i].m_wr_id;
        wc[i].wc_opcode = m[i].m_opcode;
        wc[i].wc_status = m[i].m_status;
        wc[i].wc_imm = m[i].m_imm;
        tp_ibv_qp *p = q->q_qp;
        if (m[i].m_opcode == TP_IBV_WC_RECV && m[i].m_status == TP_IBV_WC_OK &&
            p != NULL) {
            // A write with immediate takes a posted receive.
            if (p->p_state == QP_ERR) {
                wc[i].wc_status = TP_IBV_WC_FLUSH;
                m[i].m_why = W_FLUSH;
            } else if (p->p_recvs == 0) {
                wc[i].wc_status = TP_IBV_WC_ERROR;
                m[i].m_why = W_RNR;
                fake_qp_set_error(p);
            } else {
                p->p_recvs--;
            }
        }
        snprintf(wc[i].wc_why, sizeof(wc[i].wc_why), "%s",
                 fake_whys[m[i].m_why < 6 ? m[i].m_why : 0]);
    }
    return k;
}

// The QP address: our pid and our CQ's write end.
static tp_status
fake_qp_create(tp_ibv_dev *d, tp_ibv_cq *q, int send_depth, int recv_depth,
               tp_ibv_qp **qp_p, tp_ibv_qp_addr *addr_p, tp_error **err_p)
{
    TP_UNUSED(d);
    TP_UNUSED(send_depth);
    TP_UNUSED(recv_depth);
    tp_ibv_qp *p = tp__zalloc(sizeof(*p));
    if (p == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "ibv fake: out of memory");
    }
    p->p_cq = q;
    p->p_state = QP_INIT;
    p->p_peer_cq = -1;
    q->q_qp = p;
    memset(addr_p, 0, sizeof(*addr_p));
    tp__put_u32le(addr_p->qa_bytes, (uint32_t)getpid());
    tp__put_u32le(addr_p->qa_bytes + 4, (uint32_t)q->q_wr);
    *qp_p = p;
    return TP_OK;
}

static tp_status
fake_qp_connect(tp_ibv_qp *p, const tp_ibv_qp_addr *remote, tp_error **err_p)
{
    uint32_t pid = tp__get_u32le(remote->qa_bytes);
    uint32_t fd = tp__get_u32le(remote->qa_bytes + 4);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/fd/%u", pid, fd);
    int pfd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (pfd < 0) {
        return tp__error_errno(err_p, errno,
                               "ibv fake: opening the peer's CQ %s", path);
    }
    p->p_peer_pid = (pid_t)pid;
    p->p_peer_cq = pfd;
    p->p_state = QP_RTS;
    return TP_OK;
}

static void
fake_qp_unmap(tp_ibv_qp *p)
{
    if (p->p_map != NULL) {
        munmap(p->p_map, p->p_map_len);
        p->p_map = NULL;
    }
}

static void
fake_qp_destroy(tp_ibv_qp *p)
{
    fake_qp_unmap(p);
    if (p->p_peer_cq >= 0) {
        close(p->p_peer_cq);
    }
    if (p->p_cq->q_qp == p) {
        p->p_cq->q_qp = NULL;
    }
    tp__free(p);
}

static tp_status
fake_post_recv(tp_ibv_qp *p, uint64_t wr_id, tp_error **err_p)
{
    TP_UNUSED(err_p);
    if (p->p_state == QP_ERR) {
        (void)fake_put(p->p_cq->q_wr, TP_IBV_WC_RECV, TP_IBV_WC_FLUSH, W_FLUSH,
                       0, wr_id);
        return TP_OK;
    }
    p->p_recvs++;
    return TP_OK;
}

// Maps the peer's region of @rkey (its memfd, through /proc).
static bool
fake_map_peer(tp_ibv_qp *p, uint32_t rkey)
{
    if (p->p_map != NULL && p->p_map_rkey == rkey) {
        return true;
    }
    fake_qp_unmap(p);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%u", (int)p->p_peer_pid, rkey);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= (off_t)FAKE_HDR) {
        close(fd);
        return false;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        return false;
    }
    p->p_map = m;
    p->p_map_len = (size_t)sb.st_size;
    p->p_map_rkey = rkey;
    p->p_map_base = tp__get_u64le(p->p_map);
    return true;
}

static void
fake_send_fail(tp_ibv_qp *p, uint64_t wr_id, int why)
{
    (void)fake_put(p->p_cq->q_wr, TP_IBV_WC_SEND, TP_IBV_WC_ERROR, why, 0,
                   wr_id);
    fake_qp_set_error(p);
}

static tp_status
fake_post_write_imm(tp_ibv_qp *p, uint64_t wr_id, const void *laddr,
                    const tp_ibv_mr *lmr, uint32_t len, uint64_t raddr,
                    uint32_t rkey, uint32_t imm, tp_error **err_p)
{
    TP_UNUSED(err_p);
    if (p->p_state != QP_RTS) {
        (void)fake_put(p->p_cq->q_wr, TP_IBV_WC_SEND, TP_IBV_WC_FLUSH, W_FLUSH,
                       0, wr_id);
        return TP_OK;
    }
    atomic_fetch_add(&fake_write_count, 1);
    if (len > 0) {
        const uint8_t *l = laddr;
        const uint8_t *lb = lmr->mr_addr;
        if (l < lb || l + len > lb + lmr->mr_len) {
            fake_send_fail(p, wr_id, W_LPROT);
            return TP_OK;
        }
        // A QP that is gone takes no writes (its ring may serve another
        // QP by now): the write is retried until it fails, as on RC.
        struct pollfd pf = {.fd = p->p_peer_cq, .events = 0, .revents = 0};
        if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLERR | POLLHUP))) {
            fake_send_fail(p, wr_id, W_RETRY);
            return TP_OK;
        }
        if (!fake_map_peer(p, rkey)) {
            fake_send_fail(p, wr_id, W_RETRY);
            return TP_OK;
        }
        uint64_t size = p->p_map_len - FAKE_HDR;
        if (raddr < p->p_map_base || raddr - p->p_map_base > size ||
            len > size - (raddr - p->p_map_base)) {
            fake_send_fail(p, wr_id, W_RACCESS);
            return TP_OK;
        }
        memcpy(p->p_map + FAKE_HDR + (raddr - p->p_map_base), l, len);
        bool armed = true;
        if (atomic_compare_exchange_strong(&fake_corrupt_armed, &armed,
                                           false)) {
            imm = atomic_load(&fake_corrupt_imm);
        }
    }
    // The data is in place before its completion reaches the peer (one
    // atomic pipe write), as an RC write with immediate guarantees.
    if (!fake_put(p->p_peer_cq, TP_IBV_WC_RECV, TP_IBV_WC_OK, W_NONE, imm, 0)) {
        fake_send_fail(p, wr_id, W_RETRY);
        return TP_OK;
    }
    (void)fake_put(p->p_cq->q_wr, TP_IBV_WC_SEND, TP_IBV_WC_OK, W_NONE, 0,
                   wr_id);
    return TP_OK;
}

const tp_ibv_verbs tp__ibv_verbs_fake = {
    .v_name = "fake",
    .probe = fake_probe,
    .dev_open = fake_dev_open,
    .dev_close = fake_dev_close,
    .buf_alloc = fake_buf_alloc,
    .buf_free = fake_buf_free,
    .reg_mr = fake_reg_mr,
    .dereg_mr = fake_dereg_mr,
    .cq_create = fake_cq_create,
    .cq_destroy = fake_cq_destroy,
    .cq_get_events = fake_cq_get_events,
    .cq_req_notify = fake_cq_req_notify,
    .cq_poll = fake_cq_poll,
    .qp_create = fake_qp_create,
    .qp_connect = fake_qp_connect,
    .qp_set_error = fake_qp_set_error,
    .qp_destroy = fake_qp_destroy,
    .post_recv = fake_post_recv,
    .post_write_imm = fake_post_write_imm,
};

void
tp__ibv_fake_install_from_env(void)
{
    const char *s = getenv("TP_IBV_FAKE");
    if (s != NULL && strcmp(s, "1") == 0) {
        tp__ibv_verbs_override(&tp__ibv_verbs_fake);
    }
}
