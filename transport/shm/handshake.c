// SPDX-License-Identifier: Apache-2.0
// handshake.c - the shm transport's hellos (fds passed with SCM_RIGHTS)
// and the connecting side.

#include "transport/shm/shm_impl.h"

// ---- handshake ------------------------------------------------------------

void
tp__shm_conn_setup(shm_conn *c)
{
    c->c_state = SHM_C_NEW;
    c->c_sock = -1;
    c->c_wake_fd = -1;
    c->c_peer_wake_fd = -1;
    c->c_out_fd = -1;
    c->c_hs_fds[0] = c->c_hs_fds[1] = -1;
    TP_LIST_INIT(&c->c_readq, tp_aio, a_node);
    TP_LIST_INIT(&c->c_writeq, tp_aio, a_node);
    tp__list_node_init(&c->c_lnode);
    tp__timer_init(&c->c_timer, tp__shm_timer_cb, c);
    c->c_poller.lp_poll = tp__shm_poll_cb;
    c->c_poller.lp_prepare_sleep = tp__shm_prepare_sleep_cb;
    c->c_poller.lp_after_sleep = tp__shm_after_sleep_cb;
    c->c_spin_base_ns = (uint64_t)shm_cfg(c)->shm_spin_us * 1000u;
    c->c_poller.lp_spin_ns = c->c_spin_base_ns;
    c->c_cpu = -1;
    c->c_poller.lp_arg = c;
}

void
tp__shm_set_names(shm_conn *c)
{
    snprintf(c->c_base.c_peer, sizeof(c->c_base.c_peer),
             "pid %d (" SHM_SCHEME "%s)", c->c_peer_pid, c->c_name);
    snprintf(c->c_base.c_local, sizeof(c->c_base.c_local),
             "pid %d (" SHM_SCHEME "%s)", (int)getpid(), c->c_name);
}

// Creates our outbox and wake eventfd and sends the hello carrying both.
tp_status
tp__shm_send_hello(shm_conn *c, tp_error **err_p)
{
    uint64_t size = (uint64_t)shm_cfg(c)->shm_ring_size;
    if (size < SHM_RING_MIN_SIZE || size > SHM_RING_MAX_SIZE ||
        (size & (size - 1)) != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm: ring size %" PRIu64
                             " is not a power of two in [%u, %u]",
                             size, SHM_RING_MIN_SIZE, SHM_RING_MAX_SIZE);
    }
    tp_status st = tp__shm_ring_create(&c->c_out, size, &c->c_out_fd, err_p);
    if (st != TP_OK) {
        return st;
    }
    c->c_out_head = 0;
    c->c_out_chunk = tp__shm_chunk(size);
    c->c_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->c_wake_fd < 0) {
        return tp__error_errno(err_p, errno, "shm: eventfd");
    }
    bool secret = false;
    st = tp__auth_enabled(&secret, err_p);
    if (st != TP_OK) {
        return st;
    }
    c->c_hs_flags = secret ? TP_AUTH_HELLO_FLAG : 0;
    uint8_t b[SHM_HELLO_LEN];
    memcpy(b, TP_HELLO_MAGIC, 8);
    tp__put_u32le(b + 8, SHM_PROTO_VERSION);
    tp__put_u32le(b + 12, c->c_hs_flags);
    tp__put_u64le(b + 16, size);
    tp__put_u64le(b + 24, SHM_RING_DATA_OFF);
    memset(b + 32, 0, 8);
    int fds[SHM_NFDS] = {c->c_out_fd, c->c_wake_fd};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(fds))];
    } u;
    memset(&u, 0, sizeof(u));
    struct iovec iov = {.iov_base = b, .iov_len = sizeof(b)};
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof(u.buf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(cm), fds, sizeof(fds));
    ssize_t n;
    do {
        n = sendmsg(c->c_sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return tp__error_errno(err_p, errno, "shm: send the hello to peer %s",
                               c->c_base.c_peer);
    }
    if ((size_t)n != sizeof(b)) {
        return tp__error_set(err_p, TP_ECONNRESET,
                             "shm: send the hello to peer %s: short send "
                             "(%zd of %zu bytes)",
                             c->c_base.c_peer, n, sizeof(b));
    }
    // The peer holds the memfd now (in flight or received); our mapping
    // keeps the memory.
    tp__shm_close_fd(&c->c_out_fd);
    return TP_OK;
}

// Reads the peer's hello. Returns 1 when complete, 0 if more bytes are
// needed, -1 on error (*st_p and @why set).
int
tp__shm_recv_hello(shm_conn *c, tp_status *st_p, char *why, size_t why_len)
{
    while (c->c_hs_got < SHM_HELLO_LEN) {
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * SHM_MAX_RECV_FDS)];
        } u;
        struct iovec iov = {.iov_base = c->c_hs_buf + c->c_hs_got,
                            .iov_len = SHM_HELLO_LEN - c->c_hs_got};
        struct msghdr m;
        memset(&m, 0, sizeof(m));
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = u.buf;
        m.msg_controllen = sizeof(u.buf);
        ssize_t n = recvmsg(c->c_sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            int e = errno;
            if (e == EINTR) {
                continue;
            }
            if (e == EAGAIN || e == EWOULDBLOCK) {
                return 0;
            }
            *st_p = TP_ECONNRESET;
            snprintf(why, why_len, "recv: %s (%s)", strerror(e),
                     tp__errno_name(e));
            return -1;
        }
        bool late_fds = false, extra_fds = false;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm != NULL;
             cm = CMSG_NXTHDR(&m, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
                continue;
            }
            size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                if (c->c_hs_got > 0) {
                    late_fds = true;
                    close(fd);
                } else if (c->c_hs_nfds < SHM_NFDS) {
                    c->c_hs_fds[c->c_hs_nfds++] = fd;
                } else {
                    extra_fds = true;
                    close(fd);
                }
            }
        }
        *st_p = TP_EPROTO;
        if (m.msg_flags & MSG_CTRUNC) {
            snprintf(why, why_len,
                     "control data truncated (more than %d fds sent)",
                     SHM_MAX_RECV_FDS);
            return -1;
        }
        if (extra_fds) {
            snprintf(why, why_len, "more than %d fds sent", SHM_NFDS);
            return -1;
        }
        if (late_fds) {
            snprintf(why, why_len, "fds sent after the first hello byte");
            return -1;
        }
        if (n == 0) {
            *st_p = TP_ECONNRESET;
            snprintf(why, why_len,
                     "connection closed after %zu of %u hello bytes",
                     c->c_hs_got, SHM_HELLO_LEN);
            return -1;
        }
        c->c_hs_got += (size_t)n;
        size_t k = TP_MIN(c->c_hs_got, (size_t)8);
        if (memcmp(c->c_hs_buf, TP_HELLO_MAGIC, k) != 0) {
            snprintf(why, why_len, "bad magic (not a tpipe hello)");
            return -1;
        }
    }
    return 1;
}

static bool
shm_is_eventfd(int fd)
{
    char path[64], link[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n < 0) {
        return true; // no /proc: cannot tell; the fd is non-blocking anyway
    }
    link[n] = '\0';
    return strcmp(link, "anon_inode:[eventfd]") == 0;
}

// Checks a complete hello and its fds, and maps the peer's ring. On
// failure returns false with @why.
bool
tp__shm_hello_accept(shm_conn *c, char *why, size_t why_len)
{
    const uint8_t *b = c->c_hs_buf;
    uint32_t version = tp__get_u32le(b + 8);
    uint32_t flags = tp__get_u32le(b + 12);
    uint64_t size = tp__get_u64le(b + 16);
    uint64_t off = tp__get_u64le(b + 24);
    uint64_t reserved = tp__get_u64le(b + 32);
    if (version != SHM_PROTO_VERSION) {
        snprintf(why, why_len, "unsupported version %" PRIu32 " (we speak %u)",
                 version, SHM_PROTO_VERSION);
        return false;
    }
    if ((flags & ~TP_AUTH_HELLO_FLAG) != 0 || reserved != 0) {
        snprintf(why, why_len, "unknown flags 0x%" PRIx32 " or reserved bytes",
                 flags);
        return false;
    }
    if (size < SHM_RING_MIN_SIZE || size > SHM_RING_MAX_SIZE ||
        (size & (size - 1)) != 0) {
        snprintf(why, why_len,
                 "ring size %" PRIu64 " is not a power of two in [%u, %u]",
                 size, SHM_RING_MIN_SIZE, SHM_RING_MAX_SIZE);
        return false;
    }
    if (off != SHM_RING_DATA_OFF) {
        snprintf(why, why_len, "ring data offset %" PRIu64 ", expected %u", off,
                 SHM_RING_DATA_OFF);
        return false;
    }
    if (c->c_hs_nfds != SHM_NFDS) {
        snprintf(why, why_len, "expected %d fds (ring memfd, eventfd), got %d",
                 SHM_NFDS, c->c_hs_nfds);
        return false;
    }
    int efd = c->c_hs_fds[1];
    if (!shm_is_eventfd(efd)) {
        snprintf(why, why_len, "the second fd is not an eventfd");
        return false;
    }
    // Never block the loop on a write to it.
    int fl = fcntl(efd, F_GETFL);
    if (fl < 0 ||
        (!(fl & O_NONBLOCK) && fcntl(efd, F_SETFL, fl | O_NONBLOCK))) {
        snprintf(why, why_len, "fcntl on the eventfd: %s", strerror(errno));
        return false;
    }
    if (!tp__shm_ring_map_peer(&c->c_in, c->c_hs_fds[0], size, why, why_len)) {
        return false;
    }
    c->c_in_tail = 0;
    c->c_in_chunk = tp__shm_chunk(size);
    tp__shm_close_fd(&c->c_hs_fds[0]); // the mapping keeps the memory
    c->c_peer_wake_fd = efd;
    c->c_hs_fds[1] = -1;
    c->c_hs_nfds = 0;
    return true;
}

// Handshake done: watch our eventfd too; reads and writes may start.
tp_status
tp__shm_conn_ready(shm_conn *c, tp_error **err_p)
{
    tp__timer_stop(shm_loop(c), &c->c_timer);
    tp_status st = tp__loop_fd_add(shm_loop(c), &c->c_wake_lfd, c->c_wake_fd,
                                   TP_EV_READ, tp__shm_wake_cb, c, err_p);
    if (st != TP_OK) {
        return st;
    }
    c->c_state = SHM_C_READY;
    return TP_OK;
}

// ---- connect --------------------------------------------------------------

// Completes the connect aio with @err (takes it) and drops the conn.
void
tp__shm_connect_fail(shm_conn *c, tp_error *err)
{
    tp_aio *aio = c->c_connect_aio;
    c->c_connect_aio = NULL;
    TP_LOG_DEBUG("TP-SHM-CONNECT", "%s", tp_error_message(err));
    if (aio != NULL) {
        tp__aio_finish(aio, err, 0);
    } else {
        tp_error_unref(err);
    }
    tp__shm_conn_close(&c->c_base);
    tp__conn_unref(&c->c_base);
}

static void
shm_connect_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    shm_conn *c = arg;
    TP_ASSERT(c->c_connect_aio == aio);
    if (reason == TP_ETIMEDOUT) {
        tp__shm_connect_fail(c,
                             tp__error_new(reason, 0, NULL,
                                           "shm: connect to " SHM_SCHEME
                                           "%s: timed out after %" PRId64 " ms",
                                           c->c_name, aio->a_timeout_ms));
    } else {
        tp__shm_connect_fail(
            c, tp__error_new(reason, 0, NULL,
                             "shm: connect to " SHM_SCHEME "%s: %s", c->c_name,
                             reason == TP_ECLOSED ? "closed" : "canceled"));
    }
}

static void
shm_connect_established(shm_conn *c)
{
    tp_error *err = NULL;
    c->c_peer_pid = tp__shm_peer_pid(c->c_sock);
    tp__shm_set_names(c);
    if (tp__shm_send_hello(c, &err) != TP_OK ||
        tp__loop_fd_add(shm_loop(c), &c->c_sock_lfd, c->c_sock, TP_EV_READ,
                        tp__shm_sock_cb, c, &err) != TP_OK) {
        tp__error_wrap(&err, TP_ECONNRESET, "shm: connect to " SHM_SCHEME "%s",
                       c->c_name);
        tp__shm_connect_fail(c, err);
        return;
    }
    if (c->c_hs_flags & TP_AUTH_HELLO_FLAG) {
        // Our nonce right behind the hello: the exchange then costs the
        // connector no extra round trip (the listener answers with its
        // hello, nonce and proof in one go).
        tp__auth_start(&c->c_auth, false, "shm");
        if (tp__shm_auth_pump(c, true, &err) < 0) {
            tp__shm_connect_fail(c, err);
            return;
        }
    }
    c->c_state = SHM_C_WAIT_REPLY;
    int64_t ms = shm_cfg(c)->handshake_timeout_ms;
    c->c_deadline_ns = tp__deadline_after_ms(ms);
    if (c->c_deadline_ns != UINT64_MAX) {
        tp__timer_start(shm_loop(c), &c->c_timer, c->c_deadline_ns);
    }
}

void
tp__shm_connect_try(shm_conn *c)
{
    struct sockaddr_un sa;
    socklen_t len = tp__shm_sockaddr(c->c_name, &sa);
    int rv;
    do {
        rv = connect(c->c_sock, (struct sockaddr *)&sa, len);
    } while (rv != 0 && errno == EINTR);
    if (rv == 0) {
        shm_connect_established(c);
        return;
    }
    int e = errno;
    if (e == EAGAIN || e == EWOULDBLOCK) {
        // The listener's backlog is full: try again shortly.
        c->c_state = SHM_C_CONNECTING;
        uint64_t at = tp__now_ns() + SHM_CONNECT_RETRY_NS;
        tp__timer_start(shm_loop(c), &c->c_timer, TP_MIN(at, c->c_deadline_ns));
        return;
    }
    if (e == ECONNREFUSED || e == ENOENT) {
        tp__shm_connect_fail(
            c, tp__error_new(TP_ECONNREFUSED, e, NULL,
                             "shm: connect to " SHM_SCHEME
                             "%s: connection refused (no listener "
                             "with that name in this network "
                             "namespace)",
                             c->c_name));
        return;
    }
    tp_error *err = NULL;
    tp__error_errno(&err, e, "shm: connect to " SHM_SCHEME "%s", c->c_name);
    tp__shm_connect_fail(c, err);
}

void
tp__shm_connector_on_reply(shm_conn *c)
{
    tp_status st = TP_EPROTO;
    char why[256];
    int r = tp__shm_recv_hello(c, &st, why, sizeof(why));
    if (r == 0) {
        return;
    }
    if (r > 0 && !tp__shm_hello_accept(c, why, sizeof(why))) {
        r = -1;
        st = TP_EPROTO;
    }
    if (r < 0) {
        tp__shm_connect_fail(c, tp__error_new(st, 0, NULL,
                                              "shm: connect to " SHM_SCHEME
                                              "%s: handshake with peer pid %d "
                                              "failed: %s",
                                              c->c_name, c->c_peer_pid, why));
        return;
    }
    tp_error *err = NULL;
    char what[SHM_NAME_MAX + 64];
    snprintf(what, sizeof(what), "shm: connect to " SHM_SCHEME "%s", c->c_name);
    r = tp__auth_decide(c->c_hs_flags, tp__get_u32le(c->c_hs_buf + 12), false,
                        what, &err);
    if (r < 0) {
        tp__shm_connect_fail(c, err);
        return;
    }
    if (r == 1) {
        // Our nonce went out behind our hello (shm_connect_established).
        c->c_state = SHM_C_AUTH;
        tp__shm_connector_on_auth(c);
        return;
    }
    tp__shm_connector_on_auth(c);
}

// tp__auth_io over the control socket. The socket is watched for reads
// only, and the 64 bytes of an exchange never fill a fresh unix socket: a
// send that would block is an error, not a wait.
static ssize_t
shm_auth_io(void *ctx, bool send_, void *buf, size_t len)
{
    shm_conn *c = ctx;
    if (!send_) {
        return recv(c->c_sock, buf, len, MSG_DONTWAIT);
    }
    ssize_t n = send(c->c_sock, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
        errno = ENOBUFS;
        n = -1;
    }
    return n;
}

// Runs the job-secret exchange on the control socket as far as it goes
// (@send_only: our nonce only). Returns 1 when done, 0 when more is to
// come, -1 on failure (*err_p).
int
tp__shm_auth_pump(shm_conn *c, bool send_only, tp_error **err_p)
{
    char who[SHM_NAME_MAX + 64];
    snprintf(who, sizeof(who), "shm: peer pid %d (" SHM_SCHEME "%s)",
             c->c_peer_pid, c->c_name);
    bool done = false;
    if (tp__auth_pump(&c->c_auth, shm_auth_io, c, send_only, who, &done,
                      err_p) != TP_OK) {
        return -1;
    }
    return done ? 1 : 0;
}

// Connector: the exchange (if any) progressed; when it is done, the
// connection is ready.
void
tp__shm_connector_on_auth(shm_conn *c)
{
    tp_error *err = NULL;
    if (c->c_state == SHM_C_AUTH) {
        int r = tp__shm_auth_pump(c, false, &err);
        if (r < 0) {
            tp__shm_connect_fail(c, err);
            return;
        }
        if (r == 0) {
            return;
        }
    }
    if (tp__shm_conn_ready(c, &err) != TP_OK) {
        tp__shm_connect_fail(c, err);
        return;
    }
    TP_LOG_DEBUG("TP-SHM-CONNECT", "shm: connected to peer %s",
                 c->c_base.c_peer);
    tp_aio *aio = c->c_connect_aio;
    c->c_connect_aio = NULL;
    tp__aio_set_output(aio, 0, &c->c_base);
    tp__aio_finish(aio, NULL, 0);
    // Bytes (or EOF) that arrived with the reply are seen on the next
    // readiness event; check now in case it already fired.
    tp__shm_sock_check(c);
}

void
tp__shm_connect(tp_transport *t, const char *addr, tp_aio *aio)
{
    char name[SHM_NAME_MAX + 1];
    tp_error *err = NULL;
    if (tp__shm_parse_addr(addr, name, &err) != TP_OK) {
        if (tp__aio_begin(aio, t->t_loop, NULL, NULL)) {
            tp__aio_finish(aio, err, 0);
        } else {
            tp_error_unref(err);
        }
        return;
    }
    shm_conn *c = (shm_conn *)tp__conn_alloc(t);
    if (c == NULL) {
        if (tp__aio_begin(aio, t->t_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM,
                                  "shm: connect to %s: out of memory", addr);
        }
        return;
    }
    tp__shm_conn_setup(c);
    memcpy(c->c_name, name, sizeof(name));
    c->c_peer_pid = 0;
    tp__shm_set_names(c);
    if (!tp__aio_begin(aio, t->t_loop, shm_connect_cancel, c)) {
        tp__shm_conn_close(&c->c_base);
        tp__conn_unref(&c->c_base);
        return;
    }
    c->c_connect_aio = aio;
    bool secret = false;
    if (tp__auth_enabled(&secret, &err) != TP_OK) {
        tp__error_wrap(&err, tp_error_status(err), "shm: connect to %s", addr);
        tp__shm_connect_fail(c, err);
        return;
    }
    c->c_deadline_ns = tp__deadline_after_ms(t->t_cfg.connect_timeout_ms);
    c->c_sock = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->c_sock < 0) {
        tp__error_errno(&err, errno, "shm: connect to %s: socket", addr);
        tp__shm_connect_fail(c, err);
        return;
    }
    tp__shm_connect_try(c);
}
