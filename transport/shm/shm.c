// SPDX-License-Identifier: Apache-2.0
// shm.c - the shared-memory transport (this folder; shm_impl.h lists its
// files): two single-producer single-consumer
// byte rings (shm_ring.h) in memfds, passed with SCM_RIGHTS over a unix
// stream socket in the abstract namespace. The socket stays open for the
// life of the connection: its EOF is how each side learns that the other
// one exited or was killed.
//
// Each side owns the ring it writes into (its outbox) and maps the peer's
// outbox as its inbox. Steady-state transfers make no syscall: the loop
// spins on a tp_loop_poller while a conn has pending reads (or writes
// blocked on a full ring), then sleeps; before sleeping it sets a flag in
// the shared header, and the other side writes our eventfd only when that
// flag is set (Dekker: store flag, fence, load counter / store counter,
// fence, load flag). See docs/transport-shm.md.
//
// Threading: every function here except shm_is_viable, shm_ctx_init and
// tp__shm_listen runs on the transport's loop thread (transport.c guarantees
// it), so there are no locks.

#include "transport/shm/shm_impl.h"

#include "core/host.h"

// ---- context ---------------------------------------------------------------

// Same host and same network namespace (abstract sockets live there) and
// same user namespace: "shm:<boot id>:<net ns inode>:<user ns inode>".
static bool
shm_domain(char *buf, size_t len, char *why, size_t why_len)
{
    char boot[64];
    uint64_t net = 0, user = 0;
    int e;
    if ((e = tp__host_boot_id(boot, sizeof(boot))) != 0) {
        snprintf(why, why_len, "read %s: %s", TP_HOST_BOOT_ID_PATH,
                 e == ENODATA ? "empty" : strerror(e));
        return false;
    }
    if ((e = tp__host_ns_inode("net", &net)) != 0 ||
        (e = tp__host_ns_inode("user", &user)) != 0) {
        snprintf(why, why_len, "stat /proc/self/ns/%s: %s",
                 net == 0 ? "net" : "user", strerror(e));
        return false;
    }
    snprintf(buf, len, "shm:%s:%" PRIu64 ":%" PRIu64, boot, net, user);
    return true;
}

// The viability probe: the whole fd-passing path on a socketpair.
static bool
shm_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    TP_UNUSED(cfg);
    char dom[256];
    if (!shm_domain(dom, sizeof(dom), why, why_len)) {
        return false;
    }
    bool ok = false;
    int sv[2] = {-1, -1};
    int rfd = -1;
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    uint8_t *a = MAP_FAILED, *b = MAP_FAILED;
    shm_ring r;
    int mfd = -1;
    memset(&r, 0, sizeof(r));
    tp_error *err = NULL;
    if (efd < 0) {
        snprintf(why, why_len, "eventfd: %s", strerror(errno));
        goto out;
    }
    if (tp__shm_ring_create(&r, SHM_RING_MIN_SIZE, &mfd, &err) != TP_OK) {
        snprintf(why, why_len, "%s", tp_error_message(err));
        goto out;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(why, why_len, "socketpair(AF_UNIX): %s", strerror(errno));
        goto out;
    }
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof(u));
    uint8_t byte = 1;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof(u.buf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
    if (sendmsg(sv[0], &m, MSG_NOSIGNAL) != 1) {
        snprintf(why, why_len, "sendmsg(SCM_RIGHTS): %s", strerror(errno));
        goto out;
    }
    memset(&u, 0, sizeof(u));
    m.msg_controllen = sizeof(u.buf);
    if (recvmsg(sv[1], &m, MSG_CMSG_CLOEXEC) != 1 ||
        (cm = CMSG_FIRSTHDR(&m)) == NULL || cm->cmsg_type != SCM_RIGHTS) {
        snprintf(why, why_len, "recvmsg(SCM_RIGHTS): no fd received");
        goto out;
    }
    memcpy(&rfd, CMSG_DATA(cm), sizeof(int));
    size_t len = SHM_RING_DATA_OFF + SHM_RING_MIN_SIZE;
    b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
    if (b == MAP_FAILED) {
        snprintf(why, why_len, "mmap of a passed memfd: %s", strerror(errno));
        goto out;
    }
    a = (uint8_t *)r.r_hdr;
    a[len - 1] = 0x5a;
    if (b[len - 1] != 0x5a) {
        snprintf(why, why_len, "a memfd passed over a socket is not shared");
        goto out;
    }
    ok = true;
out:
    if (b != MAP_FAILED) {
        munmap(b, SHM_RING_DATA_OFF + SHM_RING_MIN_SIZE);
    }
    tp__shm_ring_unmap(&r);
    tp_error_unref(err);
    tp__shm_close_fd(&rfd);
    tp__shm_close_fd(&mfd);
    tp__shm_close_fd(&sv[0]);
    tp__shm_close_fd(&sv[1]);
    tp__shm_close_fd(&efd);
    return ok;
}

static tp_status
shm_ctx_init(tp_transport *t, tp_error **err_p)
{
    char why[256];
    if (!shm_domain(t->t_domain, sizeof(t->t_domain), why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP, "shm: domain descriptor: %s",
                             why);
    }
    return TP_OK;
}

static void
shm_ctx_fini(tp_transport *t)
{
    TP_UNUSED(t);
}

// shm's tunables: fields of tp_config (its tests set them there).
static const tp_tunable shm_tunable_rows[] = {
    {
        .tu_name = "shm_ring_size",
        .tu_env = "TP_SHM_RING_SIZE",
        // 512K: small enough to stay in cache while both sides copy, which
        // beats larger rings at every size (bench transport, shm stream:
        // 7.5-7.9 GB/s at 64 MiB against 6.5-6.9 with 4M).
        .tu_def = "512K",
        .tu_doc = "bytes of each shared-memory ring (a power of two)",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(shm_ring_size),
        .tu_min = 64 * TP_TUNABLE_KIB,
        .tu_max = TP_TUNABLE_GIB,
        .tu_flags = TP_TUNABLE_POW2,
    },
    {
        .tu_name = "shm_spin_us",
        .tu_env = "TP_SHM_SPIN_US",
        .tu_def = "50",
        .tu_doc = "microseconds a shm reader spins on its ring before "
                  "sleeping",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(shm_spin_us),
        .tu_min = 0,
        .tu_max = 1000000,
        .tu_unit = "microseconds",
    },
};

static const tp_tunables tp__shm_tunables = {
    .ts_component = "shm",
    .ts_rows = shm_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(shm_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};

const tp_transport_ops tp__transport_shm_ops = {
    .abi_version = TP_TRANSPORT_ABI_V1,
    .name = "shm",
    .props = TP_TRANSPORT_PROP_SAME_HOST,
    .ctx_size = 0,
    .listener_size = sizeof(shm_listener),
    .conn_size = sizeof(shm_conn),
    .tunables = &tp__shm_tunables,
    .is_viable = shm_is_viable,
    .ctx_init = shm_ctx_init,
    .ctx_fini = shm_ctx_fini,
    .listen = tp__shm_listen,
    .accept = tp__shm_accept,
    .listener_close = tp__shm_listener_close,
    .connect = tp__shm_connect,
    .conn_read = tp__shm_conn_read,
    .conn_write = tp__shm_conn_write,
    .conn_close = tp__shm_conn_close,
    .conn_fini = tp__shm_conn_fini,
};
