// SPDX-License-Identifier: Apache-2.0
// shm.c - the shared-memory transport: two single-producer single-consumer
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
// shm_listen runs on the transport's loop thread (transport.c guarantees
// it), so there are no locks.

#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "shm_ring.h"

#define SHM_SCHEME     "shm://"
#define SHM_SCHEME_LEN 6
#define SHM_NAME_MAX   100
// Hello: TP_HELLO_LEN bytes (magic, u32le version, u32le flags), then
// u64le ring data size, u64le data offset, 8 reserved zero bytes. It
// carries two fds: the sender's outbox memfd and its wake eventfd.
#define SHM_HELLO_LEN     40u
#define SHM_PROTO_VERSION 1u
#define SHM_NFDS          2
// At most this many fds are accepted in a control message; more is a
// protocol error (and the extra fds are closed).
#define SHM_MAX_RECV_FDS 8
// A listener handshakes at most this many conns at once, and holds at most
// this many handshaken conns that no accept has taken yet.
#define SHM_MAX_HANDSHAKES 16
#define SHM_MAX_READY      64
// A unix connect() on a full backlog fails with EAGAIN: retry this often.
#define SHM_CONNECT_RETRY_NS 1000000u
// Bytes copied before the counter is published, so that the other side
// starts copying early (both copies then run concurrently).
#define SHM_CHUNK_MAX (64u * 1024u)
// Each side publishes the CPU its loop thread runs on (rh_producer_cpu of
// its outbox). When the peer's loop thread last ran on our CPU, spinning
// cannot help: the peer only runs once we stop. The poller then does not
// spin at all (see shm_poll_cb).

typedef enum shm_state {
    SHM_C_NEW = 0,
    SHM_C_CONNECTING, // connector: connect() said EAGAIN, retrying
    SHM_C_WAIT_REPLY, // connector: hello sent, waiting for the listener's
    SHM_C_WAIT_HELLO, // acceptor: waiting for the connector's hello
    SHM_C_READY,
    SHM_C_BROKEN, // c_err set; fds closed, rings still mapped
    SHM_C_CLOSED,
} shm_state;

typedef struct shm_listener shm_listener;

typedef struct shm_conn {
    tp_conn c_base; // first: transport.c allocates conn_size bytes
    shm_state c_state;
    char c_name[SHM_NAME_MAX + 1]; // abstract socket name (no scheme)
    int c_peer_pid;
    int c_sock; // unix socket: handshake, then death detection
    tp_loop_fd c_sock_lfd;
    int c_wake_fd; // our eventfd; the peer writes it to wake us
    tp_loop_fd c_wake_lfd;
    int c_peer_wake_fd; // the peer's eventfd
    int c_out_fd;       // our outbox memfd, until sent
    shm_ring c_out;     // we produce
    shm_ring c_in;      // we consume
    uint64_t c_out_head;
    uint64_t c_in_tail;
    uint64_t c_out_chunk;
    uint64_t c_in_chunk;
    tp_list c_readq; // tp_aio, in order
    tp_list c_writeq;
    tp_loop_poller c_poller;
    bool c_armed_read;       // we set rh_consumer_sleeping in c_in
    bool c_armed_write;      // we set rh_producer_waiting in c_out
    uint64_t c_spin_base_ns; // TP_SHM_SPIN_US
    int c_cpu;               // last CPU published in c_out, -1 none
    tp_error *c_err;         // why the conn broke (SHM_C_BROKEN)
    bool c_drain;            // broken by the peer: reads may still drain c_in
    // handshake
    tp_aio *c_connect_aio;
    tp_timer c_timer;
    uint64_t c_deadline_ns;
    uint8_t c_hs_buf[SHM_HELLO_LEN];
    size_t c_hs_got;
    int c_hs_fds[SHM_NFDS];
    int c_hs_nfds;
    // acceptor side, while owned by the listener
    shm_listener *c_listener;
    tp_list_node c_lnode;
    bool c_in_ready; // in l_ready (else in l_hs)
} shm_conn;

struct shm_listener {
    tp_listener l_base; // first
    int l_fd;
    tp_loop_fd l_lfd;
    char l_name[SHM_NAME_MAX + 1];
    tp_list l_acceptq; // tp_aio
    tp_list l_hs;      // shm_conn, handshaking
    tp_list l_ready;   // shm_conn, handshaken, waiting for an accept
    size_t l_nhs;
    size_t l_nready;
    bool l_serving; // in shm_listener_serve (it may be re-entered)
    tp_task l_start_task;
};

static _Atomic unsigned shm_name_counter;

static void shm_conn_close(tp_conn *base);
static void shm_listener_serve(shm_listener *l);
static void shm_timer_cb(tp_timer *t, void *arg);
static void shm_listener_unlink(shm_conn *c);

static tp_loop *
shm_loop(const shm_conn *c)
{
    return c->c_base.c_transport->t_loop;
}

static const tp_config *
shm_cfg(const shm_conn *c)
{
    return &c->c_base.c_transport->t_cfg;
}

// ---- addresses ------------------------------------------------------------

static bool
shm_name_char_ok(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
}

// "shm://NAME" -> NAME. NAME: 1..100 of [A-Za-z0-9._-].
static tp_status
shm_parse_addr(const char *addr, char *name, tp_error **err_p)
{
    if (strncmp(addr, SHM_SCHEME, SHM_SCHEME_LEN) != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm: bad address \"%s\": expected shm://NAME",
                             addr);
    }
    const char *n = addr + SHM_SCHEME_LEN;
    size_t len = strlen(n);
    if (len == 0 || len > SHM_NAME_MAX) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm: bad address \"%s\": the name must have 1 "
                             "to %d characters",
                             addr, SHM_NAME_MAX);
    }
    for (size_t i = 0; i < len; i++) {
        if (!shm_name_char_ok(n[i])) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "shm: bad address \"%s\": the name may "
                                 "only contain letters, digits, '.', '_' "
                                 "and '-'",
                                 addr);
        }
    }
    memcpy(name, n, len + 1);
    return TP_OK;
}

// An abstract-namespace address: sun_path[0] = '\0', then the name
// (not NUL-terminated; the length says where it ends).
static socklen_t
shm_sockaddr(const char *name, struct sockaddr_un *sa)
{
    size_t n = strlen(name);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int
shm_peer_pid(int fd)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
        return 0;
    }
    return (int)cr.pid;
}

static void
shm_close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

// ---- rings ----------------------------------------------------------------

static uint64_t
shm_chunk(uint64_t ring_size)
{
    return TP_MIN(ring_size / 4, (uint64_t)SHM_CHUNK_MAX);
}

static void
shm_ring_unmap(shm_ring *r)
{
    if (r->r_map_len > 0) {
        munmap(r->r_hdr, r->r_map_len);
    }
    memset(r, 0, sizeof(*r));
}

// Creates our outbox: a sealed memfd of SHM_RING_DATA_OFF + @size bytes,
// mapped, header initialised. On success *fd_p holds the memfd.
static tp_status
shm_ring_create(shm_ring *r, uint64_t size, int *fd_p, tp_error **err_p)
{
    size_t len = SHM_RING_DATA_OFF + (size_t)size;
    int fd = memfd_create("tpipe-shm-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "shm: memfd_create");
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e,
                               "shm: ftruncate a ring memfd to %zu "
                               "bytes",
                               len);
    }
    // Sealed so that the peer can rely on the size: a shrunk mapping would
    // make its reads fault (SIGBUS).
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
        0) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e, "shm: seal a ring memfd");
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e, "shm: mmap %zu bytes of a ring memfd",
                               len);
    }
    shm_ring_hdr *h = p;
    memcpy(h->rh_magic, SHM_RING_MAGIC, 8);
    tp__put_u32le(h->rh_version, SHM_RING_VERSION);
    tp__put_u64le(h->rh_size, size);
    tp__put_u64le(h->rh_data_off, SHM_RING_DATA_OFF);
    atomic_store_explicit(&h->rh_head, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_tail, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_consumer_sleeping, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_producer_waiting, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_producer_cpu, -1, memory_order_relaxed);
    r->r_hdr = h;
    r->r_data = (uint8_t *)p + SHM_RING_DATA_OFF;
    r->r_size = size;
    r->r_mask = size - 1;
    r->r_map_len = len;
    *fd_p = fd;
    return TP_OK;
}

// Checks the peer's outbox memfd and maps it as our inbox. The fd and every
// field come from the peer: nothing is trusted. On failure @why says why.
static bool
shm_ring_map_peer(shm_ring *r, int fd, uint64_t size, char *why, size_t why_len)
{
    size_t len = SHM_RING_DATA_OFF + (size_t)size;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "fstat of the ring fd: %s", strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "the ring fd is not a memfd (mode 0%o)",
                 (unsigned)st.st_mode);
        return false;
    }
    if ((uint64_t)st.st_size != len) {
        snprintf(why, why_len,
                 "the ring memfd has %lld bytes, the hello says %zu",
                 (long long)st.st_size, len);
        return false;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(why, why_len,
                 "the ring memfd is not sealed against shrinking");
        return false;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, why_len, "mmap of the peer's ring (%zu bytes): %s", len,
                 strerror(errno));
        return false;
    }
    shm_ring_hdr *h = p;
    const char *bad = NULL;
    if (memcmp(h->rh_magic, SHM_RING_MAGIC, 8) != 0) {
        bad = "bad ring header magic";
    } else if (tp__get_u32le(h->rh_version) != SHM_RING_VERSION) {
        bad = "unsupported ring header version";
    } else if (tp__get_u64le(h->rh_size) != size ||
               tp__get_u64le(h->rh_data_off) != SHM_RING_DATA_OFF) {
        bad = "ring header geometry differs from the hello";
    } else if (atomic_load_explicit(&h->rh_tail, memory_order_acquire) != 0 ||
               atomic_load_explicit(&h->rh_head, memory_order_acquire) > size) {
        bad = "ring counters are not those of a new ring";
    }
    if (bad != NULL) {
        munmap(p, len);
        snprintf(why, why_len, "%s", bad);
        return false;
    }
    r->r_hdr = h;
    r->r_data = (uint8_t *)p + SHM_RING_DATA_OFF;
    r->r_size = size;
    r->r_mask = size - 1;
    r->r_map_len = len;
    return true;
}

// Wakes the other side through @fd if it said (in @flag) that it sleeps.
// Called right after publishing a counter with a release store.
static void
shm_notify(_Atomic uint32_t *flag, int fd)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(flag, memory_order_relaxed) != 0 &&
        atomic_exchange_explicit(flag, 0, memory_order_relaxed) != 0 &&
        fd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(fd, &one, sizeof(one));
        TP_UNUSED(n); // EAGAIN: the counter is already non-zero
    }
}

// Copies @n bytes between the iovs of @aio, from byte @off on, and the ring
// at counter @pos.
static void
shm_copy_iov(const shm_ring *r, uint64_t pos, const tp_aio *aio, uint64_t off,
             uint64_t n, bool to_ring)
{
    unsigned i = 0;
    while (off >= aio->a_iov[i].iov_len) {
        off -= aio->a_iov[i].iov_len;
        i++;
    }
    while (n > 0) {
        uint64_t k = TP_MIN(n, aio->a_iov[i].iov_len - off);
        uint8_t *base = (uint8_t *)aio->a_iov[i].iov_base + off;
        if (to_ring) {
            shm_ring_put(r, pos, base, k);
        } else {
            shm_ring_get(r, pos, base, k,
                         aio->a_prov_u64[1] >= TP_COPY_STREAM_MIN);
        }
        pos += k;
        n -= k;
        off = 0;
        i++;
    }
}

// ---- data path --------------------------------------------------------------

// Copies from the inbox into the pending reads, in order. Returns true if
// a byte moved or a read completed. A counter the peer could not have
// written sets *err_p (the caller breaks the conn).
static bool
shm_pump_reads(shm_conn *c, tp_error **err_p)
{
    shm_ring *r = &c->c_in;
    uint64_t budget = r->r_size; // per call: the loop has other work too
    bool progress = false;
    tp_aio *aio;
    while ((aio = tp__list_first(&c->c_readq)) != NULL) {
        uint64_t total = aio->a_prov_u64[1];
        while (aio->a_prov_u64[0] < total) {
            uint64_t head =
                atomic_load_explicit(&r->r_hdr->rh_head, memory_order_acquire);
            uint64_t avail = head - c->c_in_tail;
            if (avail > r->r_size) {
                *err_p = tp__error_new(
                    TP_EPROTO, 0, NULL,
                    "shm: peer %s published an impossible ring head "
                    "(%" PRIu64 ", tail %" PRIu64 ", ring %" PRIu64 " bytes)",
                    c->c_base.c_peer, head, c->c_in_tail, r->r_size);
                return true;
            }
            if (avail == 0 || budget == 0) {
                return progress;
            }
            uint64_t done = aio->a_prov_u64[0];
            uint64_t n = TP_MIN(TP_MIN(avail, total - done),
                                TP_MIN(c->c_in_chunk, budget));
            shm_copy_iov(r, c->c_in_tail, aio, done, n, false);
            c->c_in_tail += n;
            aio->a_prov_u64[0] = done + n;
            budget -= n;
            atomic_store_explicit(&r->r_hdr->rh_tail, c->c_in_tail,
                                  memory_order_release);
            shm_notify(&r->r_hdr->rh_producer_waiting, c->c_peer_wake_fd);
            progress = true;
        }
        tp__list_remove(&c->c_readq, aio);
        tp__aio_finish(aio, NULL, total);
        progress = true;
    }
    return progress;
}

// Copies the pending writes into the outbox, in order.
static bool
shm_pump_writes(shm_conn *c, tp_error **err_p)
{
    shm_ring *r = &c->c_out;
    uint64_t budget = r->r_size;
    bool progress = false;
    tp_aio *aio;
    while ((aio = tp__list_first(&c->c_writeq)) != NULL) {
        uint64_t total = aio->a_prov_u64[1];
        while (aio->a_prov_u64[0] < total) {
            uint64_t tail =
                atomic_load_explicit(&r->r_hdr->rh_tail, memory_order_acquire);
            uint64_t used = c->c_out_head - tail;
            if (used > r->r_size) {
                *err_p = tp__error_new(
                    TP_EPROTO, 0, NULL,
                    "shm: peer %s published an impossible ring tail "
                    "(%" PRIu64 ", head %" PRIu64 ", ring %" PRIu64 " bytes)",
                    c->c_base.c_peer, tail, c->c_out_head, r->r_size);
                return true;
            }
            uint64_t space = r->r_size - used;
            if (space == 0 || budget == 0) {
                return progress;
            }
            uint64_t done = aio->a_prov_u64[0];
            uint64_t n = TP_MIN(TP_MIN(space, total - done),
                                TP_MIN(c->c_out_chunk, budget));
            shm_copy_iov(r, c->c_out_head, aio, done, n, true);
            c->c_out_head += n;
            aio->a_prov_u64[0] = done + n;
            budget -= n;
            atomic_store_explicit(&r->r_hdr->rh_head, c->c_out_head,
                                  memory_order_release);
            shm_notify(&r->r_hdr->rh_consumer_sleeping, c->c_peer_wake_fd);
            progress = true;
        }
        tp__list_remove(&c->c_writeq, aio);
        tp__aio_finish(aio, NULL, total);
        progress = true;
    }
    return progress;
}

static void
shm_disarm(shm_conn *c)
{
    if (c->c_armed_read) {
        atomic_store_explicit(&c->c_in.r_hdr->rh_consumer_sleeping, 0,
                              memory_order_relaxed);
        c->c_armed_read = false;
    }
    if (c->c_armed_write) {
        atomic_store_explicit(&c->c_out.r_hdr->rh_producer_waiting, 0,
                              memory_order_relaxed);
        c->c_armed_write = false;
    }
}

// The poller runs while a read waits for data or a write for space; an
// idle conn has none, so it costs nothing.
static void
shm_update_poller(shm_conn *c)
{
    bool want = c->c_state == SHM_C_READY &&
                (!tp__list_empty(&c->c_readq) || !tp__list_empty(&c->c_writeq));
    if (want) {
        tp__loop_poller_start(shm_loop(c), &c->c_poller);
    } else if (c->c_poller.lp_active) {
        tp__loop_poller_stop(shm_loop(c), &c->c_poller);
        shm_disarm(c);
    }
}

// Fails every pending read and write with a reference to @err.
static void
shm_fail_all(shm_conn *c, tp_error *err)
{
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&c->c_readq)) != NULL) {
        tp__aio_finish(aio, tp_error_ref(err), aio->a_prov_u64[0]);
    }
    while ((aio = tp__list_pop_first(&c->c_writeq)) != NULL) {
        tp__aio_finish(aio, tp_error_ref(err), aio->a_prov_u64[0]);
    }
}

static void
shm_release_fds(shm_conn *c)
{
    tp_loop *loop = shm_loop(c);
    tp__loop_fd_remove(loop, &c->c_sock_lfd);
    tp__loop_fd_remove(loop, &c->c_wake_lfd);
    shm_close_fd(&c->c_sock); // the peer sees EOF
    shm_close_fd(&c->c_wake_fd);
    shm_close_fd(&c->c_peer_wake_fd);
    shm_close_fd(&c->c_out_fd);
    for (int i = 0; i < c->c_hs_nfds; i++) {
        shm_close_fd(&c->c_hs_fds[i]);
    }
    c->c_hs_nfds = 0;
}

// The stream is unusable (peer gone, protocol violation, partial cancel):
// remember why (takes @err), fail every pending op with it, and close the
// socket so the peer learns it too. With @drain (the peer went away
// cleanly), reads that the bytes already in the inbox satisfy complete
// first, now and later.
static void
shm_conn_fail(shm_conn *c, tp_error *err, bool drain)
{
    if (c->c_state != SHM_C_READY) {
        tp_error_unref(err);
        return;
    }
    c->c_state = SHM_C_BROKEN;
    c->c_err = err;
    c->c_drain = drain;
    if (drain) {
        tp_error *perr = NULL;
        shm_pump_reads(c, &perr);
        tp_error_unref(perr);
    }
    shm_fail_all(c, err);
    shm_update_poller(c);
    shm_disarm(c);
    shm_release_fds(c);
    if (c->c_listener != NULL) {
        // Handshaken but not yet accepted: nobody has seen this conn, and
        // it is dead. Drop it rather than hand it to an accept.
        TP_LOG_DEBUG("TP-SHM-ACCEPT",
                     "shm: dropping a connection that died before it was "
                     "accepted: %s",
                     tp_error_message(err));
        shm_listener *l = c->c_listener;
        shm_listener_unlink(c);
        shm_conn_close(&c->c_base);
        tp__conn_unref(&c->c_base);
        shm_listener_serve(l); // there is room for another one now
    }
}

// Moves what can move; breaks the conn on a corrupt counter. Returns true
// on progress.
static bool
shm_pump(shm_conn *c)
{
    tp_error *err = NULL;
    bool progress = false;
    if (c->c_state == SHM_C_READY && !tp__list_empty(&c->c_readq)) {
        progress |= shm_pump_reads(c, &err);
    }
    if (err == NULL && c->c_state == SHM_C_READY &&
        !tp__list_empty(&c->c_writeq)) {
        progress |= shm_pump_writes(c, &err);
    }
    if (err != NULL) {
        TP_LOG_WARN("TP-SHM-PROTO", "%s", tp_error_message(err));
        shm_conn_fail(c, err, false);
        return true;
    }
    shm_update_poller(c);
    return progress;
}

// Publishes our CPU in the outbox and decides whether spinning makes
// sense: not when the peer's loop thread last ran on this CPU.
static void
shm_check_cpu(shm_conn *c)
{
    int cpu = sched_getcpu();
    if (cpu != c->c_cpu) {
        c->c_cpu = cpu;
        atomic_store_explicit(&c->c_out.r_hdr->rh_producer_cpu, cpu,
                              memory_order_relaxed);
    }
    int peer = atomic_load_explicit(&c->c_in.r_hdr->rh_producer_cpu,
                                    memory_order_relaxed);
    c->c_poller.lp_spin_ns = (cpu >= 0 && peer == cpu) ? 0 : c->c_spin_base_ns;
}

static bool
shm_poll_cb(tp_loop_poller *p)
{
    shm_conn *c = p->lp_arg;
    if (shm_pump(c)) {
        return true;
    }
    if (c->c_spin_base_ns > 0 && c->c_state == SHM_C_READY) {
        shm_check_cpu(c);
    }
    return false;
}

// Before the loop sleeps: tell the peer to wake us (flag in shared memory),
// then look again (Dekker with shm_notify on the other side).
static bool
shm_prepare_sleep_cb(tp_loop_poller *p)
{
    shm_conn *c = p->lp_arg;
    if (c->c_state != SHM_C_READY) {
        return false;
    }
    bool reading = !tp__list_empty(&c->c_readq);
    bool writing = !tp__list_empty(&c->c_writeq);
    if (reading) {
        atomic_store_explicit(&c->c_in.r_hdr->rh_consumer_sleeping, 1,
                              memory_order_seq_cst);
        c->c_armed_read = true;
    }
    if (writing) {
        atomic_store_explicit(&c->c_out.r_hdr->rh_producer_waiting, 1,
                              memory_order_seq_cst);
        c->c_armed_write = true;
    }
    atomic_thread_fence(memory_order_seq_cst);
    bool work = false;
    if (reading && atomic_load_explicit(&c->c_in.r_hdr->rh_head,
                                        memory_order_acquire) != c->c_in_tail) {
        work = true;
    }
    if (writing &&
        c->c_out_head - atomic_load_explicit(&c->c_out.r_hdr->rh_tail,
                                             memory_order_acquire) !=
            c->c_out.r_size) {
        work = true;
    }
    return work;
}

static void
shm_after_sleep_cb(tp_loop_poller *p)
{
    shm_disarm(p->lp_arg);
}

// Our eventfd: the peer published data or space while we slept.
static void
shm_wake_cb(tp_loop_fd *lfd, uint32_t events)
{
    shm_conn *c = lfd->lf_arg;
    TP_UNUSED(events);
    uint64_t v;
    ssize_t n = read(c->c_wake_fd, &v, sizeof(v));
    TP_UNUSED(n);
    shm_pump(c);
}

// After the handshake the peer sends nothing on the socket: readable means
// EOF (it closed or died) or a protocol violation.
static void
shm_sock_check(shm_conn *c)
{
    uint8_t buf[64];
    ssize_t n;
    do {
        n = recv(c->c_sock, buf, sizeof(buf), MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
    }
    tp_error *err;
    if (n == 0) {
        err = tp__error_new(TP_ECONNRESET, 0, NULL,
                            "shm: peer %s closed the connection (EOF)",
                            c->c_base.c_peer);
    } else if (n < 0) {
        int e = errno;
        err = tp__error_new(TP_ECONNRESET, e, NULL,
                            "shm: peer %s: connection lost: %s (%s)",
                            c->c_base.c_peer, strerror(e), tp__errno_name(e));
    } else {
        err = tp__error_new(TP_EPROTO, 0, NULL,
                            "shm: peer %s sent unexpected bytes on the "
                            "control socket",
                            c->c_base.c_peer);
        TP_LOG_WARN("TP-SHM-PROTO", "%s", tp_error_message(err));
    }
    TP_LOG_DEBUG("TP-SHM-PEER", "%s", tp_error_message(err));
    shm_conn_fail(c, err, n == 0 || n < 0);
}

static void
shm_io_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    shm_conn *c = arg;
    tp_list *q = aio->a_prov_data[0];
    const char *what = q == &c->c_readq ? "read from" : "write to";
    char why[96];
    if (reason == TP_ETIMEDOUT) {
        snprintf(why, sizeof(why), "timed out after %" PRId64 " ms",
                 aio->a_timeout_ms);
    } else if (reason == TP_ECLOSED) {
        snprintf(why, sizeof(why), "connection closed");
    } else {
        snprintf(why, sizeof(why), "canceled");
    }
    uint64_t done = aio->a_prov_u64[0];
    uint64_t total = aio->a_prov_u64[1];
    TP_LOG_DEBUG(
        "TP-SHM-CANCEL",
        "shm: %s peer %s: %s; inbox head %" PRIu64 " tail %" PRIu64
        " sleeping %u, outbox head %" PRIu64 " tail %" PRIu64
        " waiting %u, poller %s spin %" PRIu64 " ns",
        what, c->c_base.c_peer, why,
        atomic_load_explicit(&c->c_in.r_hdr->rh_head, memory_order_relaxed),
        c->c_in_tail,
        atomic_load_explicit(&c->c_in.r_hdr->rh_consumer_sleeping,
                             memory_order_relaxed),
        c->c_out_head,
        atomic_load_explicit(&c->c_out.r_hdr->rh_tail, memory_order_relaxed),
        atomic_load_explicit(&c->c_out.r_hdr->rh_producer_waiting,
                             memory_order_relaxed),
        c->c_poller.lp_active ? "active" : "inactive", c->c_poller.lp_spin_ns);
    tp__list_remove(q, aio);
    if (done == 0) {
        tp__aio_finish(aio,
                       tp__error_new(reason, 0, NULL, "shm: %s peer %s: %s",
                                     what, c->c_base.c_peer, why),
                       0);
        shm_update_poller(c);
        return;
    }
    // Some bytes moved: the other side cannot know where the next message
    // starts any more. Close the stream.
    tp__aio_finish(aio,
                   tp__error_new(reason, 0, NULL,
                                 "shm: %s peer %s: %s after %" PRIu64
                                 " of %" PRIu64 " bytes; the stream is "
                                 "broken, connection closed",
                                 what, c->c_base.c_peer, why, done, total),
                   done);
    shm_conn_fail(
        c,
        tp__error_new(TP_ECLOSED, 0, NULL,
                      "shm: connection to peer %s closed: a %s "
                      "%s after moving %" PRIu64 " of %" PRIu64 " bytes",
                      c->c_base.c_peer, q == &c->c_readq ? "read" : "write",
                      why, done, total),
        false);
}

static void
shm_conn_submit(shm_conn *c, tp_aio *aio, tp_list *q)
{
    if (!tp__aio_begin(aio, shm_loop(c), shm_io_cancel, c)) {
        return;
    }
    const char *what = q == &c->c_readq ? "read from" : "write to";
    aio->a_prov_data[0] = q;
    aio->a_prov_u64[0] = 0;
    aio->a_prov_u64[1] = tp__aio_iov_total(aio);
    switch (c->c_state) {
    case SHM_C_READY:
        tp__list_append(q, aio);
        shm_pump(c);
        return;
    case SHM_C_BROKEN:
        if (c->c_drain && q == &c->c_readq) {
            tp__list_append(q, aio);
            tp_error *perr = NULL;
            shm_pump_reads(c, &perr);
            tp_error_unref(perr);
            if (tp__list_node_active(&aio->a_node)) {
                tp__list_remove(q, aio);
                tp__aio_finish(aio, tp_error_ref(c->c_err), aio->a_prov_u64[0]);
            }
            return;
        }
        tp__aio_finish(aio, tp_error_ref(c->c_err), 0);
        return;
    default:
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "shm: %s peer %s: connection closed", what,
                              c->c_base.c_peer);
        return;
    }
}

static void
shm_conn_read(tp_conn *base, tp_aio *aio)
{
    shm_conn *c = (shm_conn *)base;
    shm_conn_submit(c, aio, &c->c_readq);
}

static void
shm_conn_write(tp_conn *base, tp_aio *aio)
{
    shm_conn *c = (shm_conn *)base;
    shm_conn_submit(c, aio, &c->c_writeq);
}

// ---- handshake ------------------------------------------------------------

static void
shm_conn_setup(shm_conn *c)
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
    tp__timer_init(&c->c_timer, shm_timer_cb, c);
    c->c_poller.lp_poll = shm_poll_cb;
    c->c_poller.lp_prepare_sleep = shm_prepare_sleep_cb;
    c->c_poller.lp_after_sleep = shm_after_sleep_cb;
    c->c_spin_base_ns = (uint64_t)shm_cfg(c)->shm_spin_us * 1000u;
    c->c_poller.lp_spin_ns = c->c_spin_base_ns;
    c->c_cpu = -1;
    c->c_poller.lp_arg = c;
}

static void
shm_set_names(shm_conn *c)
{
    snprintf(c->c_base.c_peer, sizeof(c->c_base.c_peer),
             "pid %d (" SHM_SCHEME "%s)", c->c_peer_pid, c->c_name);
    snprintf(c->c_base.c_local, sizeof(c->c_base.c_local),
             "pid %d (" SHM_SCHEME "%s)", (int)getpid(), c->c_name);
}

// Creates our outbox and wake eventfd and sends the hello carrying both.
static tp_status
shm_send_hello(shm_conn *c, tp_error **err_p)
{
    uint64_t size = (uint64_t)shm_cfg(c)->shm_ring_size;
    if (size < SHM_RING_MIN_SIZE || size > SHM_RING_MAX_SIZE ||
        (size & (size - 1)) != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm: ring size %" PRIu64
                             " is not a power of two in [%u, %u]",
                             size, SHM_RING_MIN_SIZE, SHM_RING_MAX_SIZE);
    }
    tp_status st = shm_ring_create(&c->c_out, size, &c->c_out_fd, err_p);
    if (st != TP_OK) {
        return st;
    }
    c->c_out_head = 0;
    c->c_out_chunk = shm_chunk(size);
    c->c_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->c_wake_fd < 0) {
        return tp__error_errno(err_p, errno, "shm: eventfd");
    }
    uint8_t b[SHM_HELLO_LEN];
    memcpy(b, TP_HELLO_MAGIC, 8);
    tp__put_u32le(b + 8, SHM_PROTO_VERSION);
    tp__put_u32le(b + 12, 0);
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
    shm_close_fd(&c->c_out_fd);
    return TP_OK;
}

// Reads the peer's hello. Returns 1 when complete, 0 if more bytes are
// needed, -1 on error (*st_p and @why set).
static int
shm_recv_hello(shm_conn *c, tp_status *st_p, char *why, size_t why_len)
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
static bool
shm_hello_accept(shm_conn *c, char *why, size_t why_len)
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
    if (flags != 0 || reserved != 0) {
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
    if (!shm_ring_map_peer(&c->c_in, c->c_hs_fds[0], size, why, why_len)) {
        return false;
    }
    c->c_in_tail = 0;
    c->c_in_chunk = shm_chunk(size);
    shm_close_fd(&c->c_hs_fds[0]); // the mapping keeps the memory
    c->c_peer_wake_fd = efd;
    c->c_hs_fds[1] = -1;
    c->c_hs_nfds = 0;
    return true;
}

// Handshake done: watch our eventfd too; reads and writes may start.
static tp_status
shm_conn_ready(shm_conn *c, tp_error **err_p)
{
    tp__timer_stop(shm_loop(c), &c->c_timer);
    tp_status st = tp__loop_fd_add(shm_loop(c), &c->c_wake_lfd, c->c_wake_fd,
                                   TP_EV_READ, shm_wake_cb, c, err_p);
    if (st != TP_OK) {
        return st;
    }
    c->c_state = SHM_C_READY;
    return TP_OK;
}

// ---- connect --------------------------------------------------------------

// Completes the connect aio with @err (takes it) and drops the conn.
static void
shm_connect_fail(shm_conn *c, tp_error *err)
{
    tp_aio *aio = c->c_connect_aio;
    c->c_connect_aio = NULL;
    TP_LOG_DEBUG("TP-SHM-CONNECT", "%s", tp_error_message(err));
    if (aio != NULL) {
        tp__aio_finish(aio, err, 0);
    } else {
        tp_error_unref(err);
    }
    shm_conn_close(&c->c_base);
    tp__conn_unref(&c->c_base);
}

static void
shm_connect_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    shm_conn *c = arg;
    TP_ASSERT(c->c_connect_aio == aio);
    if (reason == TP_ETIMEDOUT) {
        shm_connect_fail(c, tp__error_new(reason, 0, NULL,
                                          "shm: connect to " SHM_SCHEME
                                          "%s: timed out after %" PRId64 " ms",
                                          c->c_name, aio->a_timeout_ms));
    } else {
        shm_connect_fail(
            c, tp__error_new(reason, 0, NULL,
                             "shm: connect to " SHM_SCHEME "%s: %s", c->c_name,
                             reason == TP_ECLOSED ? "closed" : "canceled"));
    }
}

static void shm_sock_cb(tp_loop_fd *lfd, uint32_t events);

static void
shm_connect_established(shm_conn *c)
{
    tp_error *err = NULL;
    c->c_peer_pid = shm_peer_pid(c->c_sock);
    shm_set_names(c);
    if (shm_send_hello(c, &err) != TP_OK ||
        tp__loop_fd_add(shm_loop(c), &c->c_sock_lfd, c->c_sock, TP_EV_READ,
                        shm_sock_cb, c, &err) != TP_OK) {
        tp__error_wrap(&err, TP_ECONNRESET, "shm: connect to " SHM_SCHEME "%s",
                       c->c_name);
        shm_connect_fail(c, err);
        return;
    }
    c->c_state = SHM_C_WAIT_REPLY;
    int64_t ms = shm_cfg(c)->handshake_timeout_ms;
    c->c_deadline_ns = tp__deadline_after_ms(ms);
    if (c->c_deadline_ns != UINT64_MAX) {
        tp__timer_start(shm_loop(c), &c->c_timer, c->c_deadline_ns);
    }
}

static void
shm_connect_try(shm_conn *c)
{
    struct sockaddr_un sa;
    socklen_t len = shm_sockaddr(c->c_name, &sa);
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
        shm_connect_fail(c, tp__error_new(TP_ECONNREFUSED, e, NULL,
                                          "shm: connect to " SHM_SCHEME
                                          "%s: connection refused (no listener "
                                          "with that name in this network "
                                          "namespace)",
                                          c->c_name));
        return;
    }
    tp_error *err = NULL;
    tp__error_errno(&err, e, "shm: connect to " SHM_SCHEME "%s", c->c_name);
    shm_connect_fail(c, err);
}

static void
shm_connector_on_reply(shm_conn *c)
{
    tp_status st = TP_EPROTO;
    char why[256];
    int r = shm_recv_hello(c, &st, why, sizeof(why));
    if (r == 0) {
        return;
    }
    if (r > 0 && !shm_hello_accept(c, why, sizeof(why))) {
        r = -1;
        st = TP_EPROTO;
    }
    if (r < 0) {
        shm_connect_fail(c, tp__error_new(st, 0, NULL,
                                          "shm: connect to " SHM_SCHEME
                                          "%s: handshake with peer pid %d "
                                          "failed: %s",
                                          c->c_name, c->c_peer_pid, why));
        return;
    }
    tp_error *err = NULL;
    if (shm_conn_ready(c, &err) != TP_OK) {
        shm_connect_fail(c, err);
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
    shm_sock_check(c);
}

static void
shm_connect(tp_transport *t, const char *addr, tp_aio *aio)
{
    char name[SHM_NAME_MAX + 1];
    tp_error *err = NULL;
    if (shm_parse_addr(addr, name, &err) != TP_OK) {
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
    shm_conn_setup(c);
    memcpy(c->c_name, name, sizeof(name));
    c->c_peer_pid = 0;
    shm_set_names(c);
    if (!tp__aio_begin(aio, t->t_loop, shm_connect_cancel, c)) {
        shm_conn_close(&c->c_base);
        tp__conn_unref(&c->c_base);
        return;
    }
    c->c_connect_aio = aio;
    c->c_deadline_ns = tp__deadline_after_ms(t->t_cfg.connect_timeout_ms);
    c->c_sock = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->c_sock < 0) {
        tp__error_errno(&err, errno, "shm: connect to %s: socket", addr);
        shm_connect_fail(c, err);
        return;
    }
    shm_connect_try(c);
}

// ---- accept -----------------------------------------------------------------

static void
shm_listener_unlink(shm_conn *c)
{
    shm_listener *l = c->c_listener;
    if (l == NULL) {
        return;
    }
    if (c->c_in_ready) {
        tp__list_remove(&l->l_ready, c);
        l->l_nready--;
    } else {
        tp__list_remove(&l->l_hs, c);
        l->l_nhs--;
    }
    c->c_listener = NULL;
    c->c_in_ready = false;
}

// A connection that did not complete the handshake: log why, drop it, and
// keep serving the others.
static void
shm_acceptor_reject(shm_conn *c, const char *why)
{
    shm_listener *l = c->c_listener;
    if (c->c_hs_got == 0 && strncmp(why, "connection closed", 17) == 0) {
        // Connected and closed without a byte (a canceled connect, a
        // probe): not bad input.
        TP_LOG_DEBUG("TP-SHM-HELLO",
                     "shm: listener %s: pid %d closed before its hello",
                     l->l_base.l_addr, c->c_peer_pid);
    } else {
        TP_LOG_WARN("TP-SHM-HELLO",
                    "shm: listener %s: rejected connection from pid %d: %s",
                    l->l_base.l_addr, c->c_peer_pid, why);
    }
    shm_listener_unlink(c);
    shm_conn_close(&c->c_base);
    tp__conn_unref(&c->c_base);
    shm_listener_serve(l);
}

static void
shm_acceptor_on_hello(shm_conn *c)
{
    tp_status st = TP_EPROTO;
    char why[256];
    int r = shm_recv_hello(c, &st, why, sizeof(why));
    if (r == 0) {
        return;
    }
    if (r < 0 || !shm_hello_accept(c, why, sizeof(why))) {
        shm_acceptor_reject(c, why);
        return;
    }
    tp_error *err = NULL;
    if (shm_send_hello(c, &err) != TP_OK || shm_conn_ready(c, &err) != TP_OK) {
        snprintf(why, sizeof(why), "%s", tp_error_message(err));
        tp_error_unref(err);
        shm_acceptor_reject(c, why);
        return;
    }
    TP_LOG_DEBUG("TP-SHM-ACCEPT", "shm: accepted peer %s", c->c_base.c_peer);
    shm_listener *l = c->c_listener;
    tp__list_remove(&l->l_hs, c);
    l->l_nhs--;
    tp__list_append(&l->l_ready, c);
    l->l_nready++;
    c->c_in_ready = true;
    // The connector may have closed right after its hello: that EOF came
    // with the readiness event just consumed, so look for it now.
    shm_sock_check(c);
    shm_listener_serve(l);
}

static void
shm_timer_cb(tp_timer *t, void *arg)
{
    shm_conn *c = arg;
    TP_UNUSED(t);
    char why[128];
    switch (c->c_state) {
    case SHM_C_CONNECTING:
        if (tp__now_ns() < c->c_deadline_ns) {
            shm_connect_try(c);
            return;
        }
        shm_connect_fail(c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                          "shm: connect to " SHM_SCHEME
                                          "%s: timed out after %" PRId64
                                          " ms (listener backlog full)",
                                          c->c_name,
                                          shm_cfg(c)->connect_timeout_ms));
        return;
    case SHM_C_WAIT_REPLY:
        shm_connect_fail(c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                          "shm: connect to " SHM_SCHEME
                                          "%s: no hello from peer pid %d "
                                          "within %" PRId64 " ms",
                                          c->c_name, c->c_peer_pid,
                                          shm_cfg(c)->handshake_timeout_ms));
        return;
    case SHM_C_WAIT_HELLO:
        snprintf(why, sizeof(why),
                 "timed out after %" PRId64 " ms with %zu of %u hello bytes",
                 shm_cfg(c)->handshake_timeout_ms, c->c_hs_got, SHM_HELLO_LEN);
        shm_acceptor_reject(c, why);
        return;
    default:
        return;
    }
}

static void
shm_sock_cb(tp_loop_fd *lfd, uint32_t events)
{
    shm_conn *c = lfd->lf_arg;
    TP_UNUSED(events);
    switch (c->c_state) {
    case SHM_C_WAIT_REPLY:
        shm_connector_on_reply(c);
        return;
    case SHM_C_WAIT_HELLO:
        shm_acceptor_on_hello(c);
        return;
    case SHM_C_READY:
        shm_sock_check(c);
        return;
    default:
        return;
    }
}

static void
shm_acceptor_start(shm_listener *l, int fd)
{
    tp_transport *t = l->l_base.l_transport;
    int pid = shm_peer_pid(fd);
    shm_conn *c = (shm_conn *)tp__conn_alloc(t);
    if (c == NULL) {
        TP_LOG_WARN("TP-SHM-HELLO",
                    "shm: listener %s: rejected connection from pid %d: out "
                    "of memory",
                    l->l_base.l_addr, pid);
        close(fd);
        return;
    }
    shm_conn_setup(c);
    c->c_sock = fd;
    c->c_peer_pid = pid;
    memcpy(c->c_name, l->l_name, sizeof(c->c_name));
    shm_set_names(c);
    c->c_listener = l;
    c->c_in_ready = false;
    tp__list_append(&l->l_hs, c);
    l->l_nhs++;
    c->c_state = SHM_C_WAIT_HELLO;
    tp_error *err = NULL;
    if (tp__loop_fd_add(t->t_loop, &c->c_sock_lfd, fd, TP_EV_READ, shm_sock_cb,
                        c, &err) != TP_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", tp_error_message(err));
        tp_error_unref(err);
        shm_acceptor_reject(c, why);
        return;
    }
    c->c_deadline_ns = tp__deadline_after_ms(t->t_cfg.handshake_timeout_ms);
    if (c->c_deadline_ns != UINT64_MAX) {
        tp__timer_start(t->t_loop, &c->c_timer, c->c_deadline_ns);
    }
}

// Hands handshaken conns to waiting accepts, then takes new connections
// from the kernel while there is room.
static void
shm_listener_serve(shm_listener *l)
{
    if (l->l_serving) {
        return; // the outer call re-checks the counts
    }
    l->l_serving = true;
    while (!tp__list_empty(&l->l_acceptq) && !tp__list_empty(&l->l_ready)) {
        tp_aio *aio = tp__list_pop_first(&l->l_acceptq);
        shm_conn *c = tp__list_first(&l->l_ready);
        shm_listener_unlink(c);
        tp__aio_set_output(aio, 0, &c->c_base);
        tp__aio_finish(aio, NULL, 0);
    }
    while (l->l_lfd.lf_active && l->l_nhs < SHM_MAX_HANDSHAKES &&
           l->l_nready < SHM_MAX_READY) {
        int fd = accept4(l->l_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED) {
                continue;
            }
            if (e != EAGAIN && e != EWOULDBLOCK) {
                TP_LOG_WARN("TP-SHM-ACCEPT", "shm: listener %s: accept: %s",
                            l->l_base.l_addr, strerror(e));
            }
            break;
        }
        shm_acceptor_start(l, fd);
    }
    l->l_serving = false;
}

static void
shm_listen_cb(tp_loop_fd *lfd, uint32_t events)
{
    TP_UNUSED(events);
    shm_listener_serve(lfd->lf_arg);
}

static void
shm_accept_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    shm_listener *l = arg;
    tp__list_remove(&l->l_acceptq, aio);
    if (reason == TP_ETIMEDOUT) {
        tp__aio_finish_status(
            aio, reason, "shm: accept on %s: timed out after %" PRId64 " ms",
            l->l_base.l_addr, aio->a_timeout_ms);
    } else {
        tp__aio_finish_status(
            aio, reason, "shm: accept on %s: %s", l->l_base.l_addr,
            reason == TP_ECLOSED ? "listener closed" : "canceled");
    }
}

// Registers the listening socket with the loop (listen() may not touch
// the loop, so it posts this): from then on connections are handshaken as
// they arrive, whether or not an accept is pending, so a connector does
// not wait on the server's first accept.
static tp_status
shm_listener_start(shm_listener *l, tp_error **err_p)
{
    tp_transport *t = l->l_base.l_transport;
    if (l->l_lfd.lf_active || l->l_fd < 0) {
        return TP_OK;
    }
    if (tp__loop_fd_add(t->t_loop, &l->l_lfd, l->l_fd, TP_EV_READ,
                        shm_listen_cb, l, err_p) != TP_OK) {
        return tp__error_wrap(err_p, TP_EINTERNAL, "shm: listen on %s",
                              l->l_base.l_addr);
    }
    shm_listener_serve(l);
    return TP_OK;
}

static void
shm_listener_start_task(void *arg)
{
    shm_listener *l = arg;
    tp_error *err = NULL;
    if (shm_listener_start(l, &err) != TP_OK) {
        // The first accept tries again and reports it.
        TP_LOG_WARN("TP-SHM-LISTEN", "%s", tp_error_message(err));
        tp_error_unref(err);
    }
}

static void
shm_accept(tp_listener *base, tp_aio *aio)
{
    shm_listener *l = (shm_listener *)base;
    tp_transport *t = base->l_transport;
    if (!tp__aio_begin(aio, t->t_loop, shm_accept_cancel, l)) {
        return;
    }
    tp_error *err = NULL;
    if (shm_listener_start(l, &err) != TP_OK) {
        tp__aio_finish(aio, err, 0);
        return;
    }
    tp__list_append(&l->l_acceptq, aio);
    shm_listener_serve(l);
}

static void
shm_listener_close(tp_listener *base)
{
    shm_listener *l = (shm_listener *)base;
    tp_transport *t = base->l_transport;
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&l->l_acceptq)) != NULL) {
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "shm: accept on %s: listener closed",
                              base->l_addr);
    }
    shm_conn *c;
    while ((c = tp__list_first(&l->l_hs)) != NULL ||
           (c = tp__list_first(&l->l_ready)) != NULL) {
        shm_listener_unlink(c);
        shm_conn_close(&c->c_base);
        tp__conn_unref(&c->c_base);
    }
    tp__loop_fd_remove(t->t_loop, &l->l_lfd);
    shm_close_fd(&l->l_fd);
}

static tp_status
shm_listen(tp_transport *t, tp_listener *base, const char *addr,
           tp_error **err_p)
{
    shm_listener *l = (shm_listener *)base;
    bool pick =
        addr == NULL || addr[0] == '\0' || strcmp(addr, SHM_SCHEME) == 0;
    char name[SHM_NAME_MAX + 1];
    if (!pick && shm_parse_addr(addr, name, err_p) != TP_OK) {
        return TP_EINVAL;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "shm: listen on %s: socket",
                               pick ? SHM_SCHEME : addr);
    }
    for (int attempt = 0;; attempt++) {
        if (pick) {
            uint32_t rnd = (uint32_t)tp__random_u64();
            snprintf(name, sizeof(name), "tpipe-%d-%u-%08x", (int)getpid(),
                     atomic_fetch_add_explicit(&shm_name_counter, 1,
                                               memory_order_relaxed),
                     rnd);
        }
        struct sockaddr_un sa;
        socklen_t len = shm_sockaddr(name, &sa);
        if (bind(fd, (struct sockaddr *)&sa, len) == 0) {
            break;
        }
        int e = errno;
        if (pick && e == EADDRINUSE && attempt < 8) {
            continue;
        }
        close(fd);
        return tp__error_errno(err_p, e, "shm: listen on " SHM_SCHEME "%s",
                               name);
    }
    if (listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e, "shm: listen on " SHM_SCHEME "%s",
                               name);
    }
    l->l_fd = fd;
    memcpy(l->l_name, name, sizeof(name));
    snprintf(base->l_addr, sizeof(base->l_addr), SHM_SCHEME "%s", name);
    TP_LIST_INIT(&l->l_acceptq, tp_aio, a_node);
    TP_LIST_INIT(&l->l_hs, shm_conn, c_lnode);
    TP_LIST_INIT(&l->l_ready, shm_conn, c_lnode);
    // Posted before anything the caller can post for this listener (its
    // destroy included), so it runs first.
    tp__task_init(&l->l_start_task, shm_listener_start_task, l);
    tp__loop_post(t->t_loop, &l->l_start_task);
    return TP_OK;
}

// ---- close ------------------------------------------------------------------

static void
shm_conn_close(tp_conn *base)
{
    shm_conn *c = (shm_conn *)base;
    if (c->c_state == SHM_C_CLOSED) {
        return;
    }
    tp_loop *loop = shm_loop(c);
    if (c->c_connect_aio != NULL) {
        tp_aio *aio = c->c_connect_aio;
        c->c_connect_aio = NULL;
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "shm: connect to " SHM_SCHEME "%s: closed",
                              c->c_name);
    }
    if (!tp__list_empty(&c->c_readq) || !tp__list_empty(&c->c_writeq)) {
        tp_error *err = tp__error_new(TP_ECLOSED, 0, NULL,
                                      "shm: connection to peer %s closed",
                                      c->c_base.c_peer);
        shm_fail_all(c, err);
        tp_error_unref(err);
    }
    shm_listener_unlink(c);
    if (c->c_poller.lp_active) {
        tp__loop_poller_stop(loop, &c->c_poller);
    }
    if (c->c_state == SHM_C_READY) {
        shm_disarm(c);
    }
    tp__timer_stop(loop, &c->c_timer);
    shm_release_fds(c);
    shm_ring_unmap(&c->c_out);
    shm_ring_unmap(&c->c_in);
    c->c_state = SHM_C_CLOSED;
}

static void
shm_conn_fini(tp_conn *base)
{
    shm_conn *c = (shm_conn *)base;
    tp_error_unref(c->c_err);
    c->c_err = NULL;
}

// ---- context
// ------------------------------------------------------------------

static bool
shm_read_boot_id(char *buf, size_t len, char *why, size_t why_len)
{
    const char *path = "/proc/sys/kernel/random/boot_id";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, "open %s: %s", path, strerror(errno));
        return false;
    }
    ssize_t n = read(fd, buf, len - 1);
    int e = errno;
    close(fd);
    if (n <= 0) {
        snprintf(why, why_len, "read %s: %s", path,
                 n < 0 ? strerror(e) : "empty");
        return false;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return true;
}

static bool
shm_ns_inode(const char *ns, uint64_t *ino_p, char *why, size_t why_len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/ns/%s", ns);
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(why, why_len, "stat %s: %s", path, strerror(errno));
        return false;
    }
    *ino_p = (uint64_t)st.st_ino;
    return true;
}

// Same host and same network namespace (abstract sockets live there) and
// same user namespace: "shm:<boot id>:<net ns inode>:<user ns inode>".
static bool
shm_domain(char *buf, size_t len, char *why, size_t why_len)
{
    char boot[64];
    uint64_t net, user;
    if (!shm_read_boot_id(boot, sizeof(boot), why, why_len) ||
        !shm_ns_inode("net", &net, why, why_len) ||
        !shm_ns_inode("user", &user, why, why_len)) {
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
    if (shm_ring_create(&r, SHM_RING_MIN_SIZE, &mfd, &err) != TP_OK) {
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
    shm_ring_unmap(&r);
    tp_error_unref(err);
    shm_close_fd(&rfd);
    shm_close_fd(&mfd);
    shm_close_fd(&sv[0]);
    shm_close_fd(&sv[1]);
    shm_close_fd(&efd);
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

const tp_transport_ops tp__transport_shm_ops = {
    .abi_version = TP_TRANSPORT_ABI_V1,
    .name = "shm",
    .same_host = true,
    .ctx_size = 0,
    .listener_size = sizeof(shm_listener),
    .conn_size = sizeof(shm_conn),
    .is_viable = shm_is_viable,
    .ctx_init = shm_ctx_init,
    .ctx_fini = shm_ctx_fini,
    .listen = shm_listen,
    .accept = shm_accept,
    .listener_close = shm_listener_close,
    .connect = shm_connect,
    .conn_read = shm_conn_read,
    .conn_write = shm_conn_write,
    .conn_close = shm_conn_close,
    .conn_fini = shm_conn_fini,
};
