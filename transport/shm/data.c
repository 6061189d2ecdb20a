// SPDX-License-Identifier: Apache-2.0
// data.c - the shm transport's data path: reads and writes through the
// rings, the loop poller that spins then sleeps (the Dekker flags of
// shm.c's header comment), and failing a connection.

#include "transport/shm/shm_impl.h"

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
            tp__shm_copy_iov(r, c->c_in_tail, aio, done, n, false);
            c->c_in_tail += n;
            aio->a_prov_u64[0] = done + n;
            budget -= n;
            atomic_store_explicit(&r->r_hdr->rh_tail, c->c_in_tail,
                                  memory_order_release);
            tp__shm_notify(&r->r_hdr->rh_producer_waiting, c->c_peer_wake_fd);
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
            tp__shm_copy_iov(r, c->c_out_head, aio, done, n, true);
            c->c_out_head += n;
            aio->a_prov_u64[0] = done + n;
            budget -= n;
            atomic_store_explicit(&r->r_hdr->rh_head, c->c_out_head,
                                  memory_order_release);
            tp__shm_notify(&r->r_hdr->rh_consumer_sleeping, c->c_peer_wake_fd);
            progress = true;
        }
        tp__list_remove(&c->c_writeq, aio);
        tp__aio_finish(aio, NULL, total);
        progress = true;
    }
    return progress;
}

void
tp__shm_disarm(shm_conn *c)
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
        tp__shm_disarm(c);
    }
}

// Fails every pending read and write with a reference to @err.
void
tp__shm_fail_all(shm_conn *c, tp_error *err)
{
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&c->c_readq)) != NULL) {
        tp__aio_finish(aio, tp_error_ref(err), aio->a_prov_u64[0]);
    }
    while ((aio = tp__list_pop_first(&c->c_writeq)) != NULL) {
        tp__aio_finish(aio, tp_error_ref(err), aio->a_prov_u64[0]);
    }
}

void
tp__shm_release_fds(shm_conn *c)
{
    tp_loop *loop = shm_loop(c);
    tp__loop_fd_remove(loop, &c->c_sock_lfd);
    tp__loop_fd_remove(loop, &c->c_wake_lfd);
    tp__shm_close_fd(&c->c_sock); // the peer sees EOF
    tp__shm_close_fd(&c->c_wake_fd);
    tp__shm_close_fd(&c->c_peer_wake_fd);
    tp__shm_close_fd(&c->c_out_fd);
    for (int i = 0; i < c->c_hs_nfds; i++) {
        tp__shm_close_fd(&c->c_hs_fds[i]);
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
    tp__shm_fail_all(c, err);
    shm_update_poller(c);
    tp__shm_disarm(c);
    tp__shm_release_fds(c);
    if (c->c_listener != NULL) {
        // Handshaken but not yet accepted: nobody has seen this conn, and
        // it is dead. Drop it rather than hand it to an accept.
        TP_LOG_DEBUG("TP-SHM-ACCEPT",
                     "shm: dropping a connection that died before it was "
                     "accepted: %s",
                     tp_error_message(err));
        shm_listener *l = c->c_listener;
        tp__shm_listener_unlink(c);
        tp__shm_conn_close(&c->c_base);
        tp__conn_unref(&c->c_base);
        tp__shm_listener_serve(l); // there is room for another one now
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

bool
tp__shm_poll_cb(tp_loop_poller *p)
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
// then look again (Dekker with tp__shm_notify on the other side).
bool
tp__shm_prepare_sleep_cb(tp_loop_poller *p)
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

void
tp__shm_after_sleep_cb(tp_loop_poller *p)
{
    tp__shm_disarm(p->lp_arg);
}

// Our eventfd: the peer published data or space while we slept.
void
tp__shm_wake_cb(tp_loop_fd *lfd, uint32_t events)
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
void
tp__shm_sock_check(shm_conn *c)
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

void
tp__shm_conn_read(tp_conn *base, tp_aio *aio)
{
    shm_conn *c = (shm_conn *)base;
    shm_conn_submit(c, aio, &c->c_readq);
}

void
tp__shm_conn_write(tp_conn *base, tp_aio *aio)
{
    shm_conn *c = (shm_conn *)base;
    shm_conn_submit(c, aio, &c->c_writeq);
}
