// SPDX-License-Identifier: Apache-2.0
// cma.c - the cma channel: two processes on one host. The sender puts its
// pid and the tensor's address in the descriptor; the receiver copies the
// bytes once with process_vm_readv (cma_probe.c) on the context's pool,
// then acknowledges on the channel's own connection (frame ACK, body: the
// message number, aux: the tensor index) so the sender can release the
// buffer. A bad address from the peer only makes the read fail (EFAULT).
//
// Trust: the pid in a descriptor is the peer's claim, and a peer could
// name any process we can read. So before any read each end learns the
// peer's pid from the kernel (the side socket, cma_probe.h): on the
// channel's connection both ends first send a hello (the name of their
// side socket and a token), connect to the peer's side socket and present
// its token, then send "ready"; the end that reads "ready" takes
// SO_PEERCRED of the connection with its token. A descriptor naming any
// other pid fails the pipe (TP_EPROTO); so does a peer whose kernel uid or
// gid differs from ours, whatever its domain string claimed. Receives wait
// (c_recvs) until then. See docs/channel-cma.md, "Trust".
//
// Only tensors that travel by cma depend on this channel: a failure of its
// connection or side socket (the peer exited, a handshake that never
// finished) fails the pipe only while a cma op waits on it (a send for its
// ack, a receive for the handshake); otherwise it is kept (chan_ack.h, ca_err)
// and the next cma op fails with it. So a peer that read its last message and
// exited does not fail the writes whose bytes it already has. A receive
// completes only once its ack is written (chan_ack.h): a reader
// that exits right after its read has sent the ack, and the sender's write
// completes.

#include "channel/cma/cma_impl.h"

static unsigned
cma_nconns(const tp_config *cfg, bool *lanes_p)
{
    (void)cfg;
    *lanes_p = false;
    return 1;
}

static bool
cma_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    return tp__cma_viable(why, why_len);
}

// The inline size is part of the domain: both ends must agree on which
// tensors travel on the pipe's connection.
// cma's own tunables (TP_TUNABLES_OWN, table at the end), inside every
// tp_config.
typedef struct cma_tunables {
    int64_t ct_inline_max; // TP_CMA_INLINE_MAX bytes
} cma_tunables;

extern const tp_tunables tp__cma_tunables;

static int64_t
cma_cfg_inline_max(const tp_config *cfg)
{
    const cma_tunables *ct = tp__config_own_const(cfg, &tp__cma_tunables);
    return ct->ct_inline_max;
}

static tp_status
cma_domain(const tp_config *cfg, char *buf, size_t len, tp_error **err_p)
{
    tp_status st = tp__cma_domain(buf, len, err_p);
    if (st != TP_OK) {
        return st;
    }
    size_t n = strlen(buf);
    int m = snprintf(buf + n, len - n, ":inline=%lld",
                     (long long)cma_cfg_inline_max(cfg));
    if (m < 0 || (size_t)m >= len - n) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "cma: domain descriptor longer than %zu bytes",
                             len);
    }
    return TP_OK;
}

// Tensors up to TP_CMA_INLINE_MAX follow the payloads on the pipe's
// connection: for small ones a process_vm_readv and its ack cost more
// than the bytes.
static uint64_t
cma_inline_max(const tp_config *cfg)
{
    return (uint64_t)cma_cfg_inline_max(cfg);
}

static void cma_read_acks(tp_chan *ch);

void
tp__cma_chan_maybe_free(tp_chan *ch)
{
    if (ch->c_destroy_req && !ch->c_rbusy && !ch->c_acks.ca_wbusy &&
        ch->c_copies == 0) {
        tp__loop_defer(ch->c_env.ce_loop, &ch->c_free_task);
    }
}

static void
cma_free_task(void *arg)
{
    tp_chan *ch = arg;
    tp__aio_fini(&ch->c_raio);
    tp__chan_acks_fini(&ch->c_acks);
    tp__cma_side_close(&ch->c_side);
    tp__cma_peer_fini(&ch->c_peer);
    tp__free(ch);
}

void
tp__cma_chan_fail(tp_chan *ch, tp_error *err)
{
    if (!ch->c_closed) {
        ch->c_env.ce_fail(ch->c_env.ce_pipe, err);
    } else {
        tp_error_unref(err);
    }
}

// The channel's connection or side socket failed with @err (taken). A cma
// op waiting on it fails the pipe; otherwise the channel only stops, and
// its next op fails (see the top of this file). A peer that breaks the
// protocol fails the pipe at once.
static void
cma_broken(tp_chan *ch, tp_error *err)
{
    if (ch->c_closed) {
        tp_error_unref(err);
        return;
    }
    // A receive waiting for the handshake depends on the connection too.
    err = tp__chan_acks_broken(&ch->c_acks, err, !tp__list_empty(&ch->c_recvs));
    if (err != NULL) {
        tp__cma_chan_fail(ch, err);
        return;
    }
    tp__cma_side_close(&ch->c_side);
}

static void
cma_write_failed(void *owner, tp_error *err)
{
    cma_broken(owner, err);
}

static void
cma_write_ended(void *owner)
{
    tp__cma_chan_maybe_free(owner);
}

// The peer's hello: connect to its side socket, present its token, then
// tell it so ("ready"; it accepts only after reading that, so the
// connection is already waiting).
static void
cma_got_hello(tp_chan *ch)
{
    if (memcmp(ch->c_rbuf, CMA_HELLO_MAGIC, CMA_MAGIC_LEN) != 0) {
        tp__cma_chan_fail(ch, tp__error_new(TP_EPROTO, 0, NULL,
                                            "cma: pipe to %s: protocol error: "
                                            "expected the cma hello",
                                            ch->c_env.ce_peer));
        return;
    }
    tp_error *err = NULL;
    const uint8_t *name = ch->c_rbuf + CMA_MAGIC_LEN;
    if (tp__cma_side_connect((const char *)name, name + TP_CMA_SIDE_NAME_LEN,
                             &err) != TP_OK) {
        cma_broken(ch, tp__error_new(tp_error_status(err), 0, err,
                                     "cma: pipe to %s: side connection",
                                     ch->c_env.ce_peer));
        tp_error_unref(err);
        return;
    }
    if (!tp__chan_acks_push(&ch->c_acks, CMA_READY_MAGIC, CMA_MAGIC_LEN)) {
        tp__cma_chan_fail(ch, tp__error_new(TP_ENOMEM, 0, NULL,
                                            "cma: pipe to %s: out of memory",
                                            ch->c_env.ce_peer));
        return;
    }
    tp__chan_acks_flush(&ch->c_acks);
    ch->c_hs = CMA_HS_READY;
    cma_read_acks(ch);
}

// The peer says it connected to our side socket: the kernel now tells
// who it is. Only then do receives start.
static void
cma_got_ready(tp_chan *ch)
{
    const char *peer = ch->c_env.ce_peer;
    if (memcmp(ch->c_rbuf, CMA_READY_MAGIC, CMA_MAGIC_LEN) != 0) {
        tp__cma_chan_fail(ch, tp__error_new(TP_EPROTO, 0, NULL,
                                            "cma: pipe to %s: protocol error: "
                                            "expected the cma ready",
                                            peer));
        return;
    }
    tp_error *err = NULL;
    if (tp__cma_side_accept(&ch->c_side, &ch->c_peer, &err) != TP_OK) {
        cma_broken(ch, tp__error_new(tp_error_status(err), 0, err,
                                     "cma: pipe to %s: side connection", peer));
        tp_error_unref(err);
        return;
    }
    // The domains matched on uid and gid, but those were the peer's words.
    // The uids and gids go to the local log only, never into an error a
    // caller might pass on.
    if (ch->c_peer.cp_uid != getuid() || ch->c_peer.cp_gid != getgid()) {
        TP_LOG_WARN("TP-CMA-PEER",
                    "cma: pipe to %s: the peer's process (pid %d) runs as "
                    "uid %u gid %u, this one as uid %u gid %u; refused",
                    peer, (int)ch->c_peer.cp_pid, (unsigned)ch->c_peer.cp_uid,
                    (unsigned)ch->c_peer.cp_gid, (unsigned)getuid(),
                    (unsigned)getgid());
        tp__cma_chan_fail(
            ch, tp__error_new(TP_EPROTO, 0, NULL,
                              "cma: pipe to %s: protocol error: the "
                              "peer's process runs as another user or "
                              "group than this one (its domain said "
                              "otherwise; see TP-CMA-PEER in the log)",
                              peer));
        return;
    }
    TP_LOG_DEBUG("TP-CMA-PEER", "cma: pipe to %s: the peer is pid %d", peer,
                 (int)ch->c_peer.cp_pid);
    ch->c_hs = CMA_HS_DONE;
    tp_chan_op *op;
    while ((op = tp__list_pop_first(&ch->c_recvs)) != NULL) {
        tp__cma_chan_recv_start(ch, op);
    }
    cma_read_acks(ch);
}

static void
cma_raio_cb(void *arg)
{
    tp_chan *ch = arg;
    ch->c_rbusy = false;
    if (ch->c_closed) {
        tp__cma_chan_maybe_free(ch);
        return;
    }
    if (tp_aio_status(&ch->c_raio) != TP_OK) {
        cma_broken(ch, tp__error_new(tp_aio_status(&ch->c_raio), 0,
                                     tp_aio_error(&ch->c_raio),
                                     ch->c_hs == CMA_HS_DONE
                                         ? "cma: pipe to %s: ack connection"
                                         : "cma: pipe to %s: waiting for the "
                                           "peer's cma hello "
                                           "(TP_HANDSHAKE_TIMEOUT_MS)",
                                     ch->c_env.ce_peer));
        return;
    }
    if (ch->c_hs == CMA_HS_HELLO) {
        cma_got_hello(ch);
        return;
    }
    if (ch->c_hs == CMA_HS_READY) {
        cma_got_ready(ch);
        return;
    }
    tp_error *err = NULL;
    if (tp__chan_acks_got(&ch->c_acks, ch->c_rbuf, &err) != TP_OK) {
        tp__cma_chan_fail(ch, err);
        return;
    }
    cma_read_acks(ch);
}

static void
cma_read_acks(tp_chan *ch)
{
    if (ch->c_closed || ch->c_rbusy || ch->c_acks.ca_err != NULL) {
        return;
    }
    // The peer's hello and ready are due within the handshake timeout;
    // acks come when they come.
    size_t len = ch->c_hs == CMA_HS_HELLO   ? CMA_HELLO_LEN
                 : ch->c_hs == CMA_HS_READY ? CMA_MAGIC_LEN
                                            : CMA_ACK_FRAME;
    tp_aio_set_timeout(
        &ch->c_raio,
        ch->c_hs == CMA_HS_DONE ? 0 : ch->c_env.ce_cfg->handshake_timeout_ms);
    tp_iov iov = {ch->c_rbuf, len};
    tp_aio_set_iov(&ch->c_raio, 1, &iov);
    ch->c_rbusy = true;
    tp__conn_read(ch->c_conn, &ch->c_raio);
}

static tp_status
cma_create(const tp_chan_env *env, tp_chan **ch_p, tp_error **err_p)
{
    if (env->ce_nconns != 1) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "cma: needs 1 connection, got %u", env->ce_nconns);
    }
    tp_chan *ch = tp__zalloc(sizeof(*ch));
    if (ch == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "cma: out of memory");
    }
    ch->c_env = *env;
    ch->c_conn = env->ce_conns[0];
    ch->c_peer.cp_pidfd = -1;
    tp__chan_acks_init(&ch->c_acks, "cma", env, ch->c_conn, cma_write_failed,
                       cma_write_ended, ch);
    ch->c_acks.ca_down_code = "TP-CMA-DOWN";
    TP_LIST_INIT(&ch->c_recvs, tp_chan_op, co_node);
    tp_status st = tp__cma_side_listen(&ch->c_side, err_p);
    if (st != TP_OK) {
        tp__chan_acks_fini(&ch->c_acks);
        tp__free(ch);
        return st;
    }
    uint8_t hello[CMA_HELLO_LEN];
    memcpy(hello, CMA_HELLO_MAGIC, CMA_MAGIC_LEN);
    memcpy(hello + CMA_MAGIC_LEN, ch->c_side.cs_name, TP_CMA_SIDE_NAME_LEN);
    memcpy(hello + CMA_MAGIC_LEN + TP_CMA_SIDE_NAME_LEN, ch->c_side.cs_token,
           TP_CMA_SIDE_TOKEN_LEN);
    if (!tp__chan_acks_push(&ch->c_acks, hello, sizeof(hello))) {
        tp__cma_side_close(&ch->c_side);
        tp__chan_acks_fini(&ch->c_acks);
        tp__free(ch);
        return tp__error_set(err_p, TP_ENOMEM, "cma: out of memory");
    }
    tp__aio_init(&ch->c_raio, cma_raio_cb, ch);
    tp__task_init(&ch->c_free_task, cma_free_task, ch);
    // Peers must be allowed to read us (Yama scope 1).
    tp__cma_allow_peers();
    tp__chan_acks_flush(&ch->c_acks);
    cma_read_acks(ch);
    *ch_p = ch;
    return TP_OK;
}

static void
cma_close(tp_chan *ch, const tp_error *err)
{
    ch->c_closed = true;
    tp__chan_acks_close(&ch->c_acks, err);
    tp_chan_op *op;
    while ((op = tp__list_pop_first(&ch->c_recvs)) != NULL) {
        tp__chan_op_fail_later(ch->c_env.ce_loop, op, tp_error_ref(err));
    }
    tp__cma_side_close(&ch->c_side);
    tp_aio_cancel(&ch->c_raio);
}

static void
cma_destroy(tp_chan *ch)
{
    ch->c_destroy_req = true;
    tp__cma_chan_maybe_free(ch);
}

static const tp_tunable cma_tunable_rows[] = {
    {
        .tu_name = "cma_inline_max",
        .tu_env = "TP_CMA_INLINE_MAX",
        // 16K: below it a process_vm_readv plus its ack on the ack
        // connection costs more than copying through the connection.
        .tu_def = "16K",
        .tu_doc = "cma tensors up to this size travel on the pipe's own "
                  "connection instead of being read by the peer",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_FIELD(cma_tunables, ct_inline_max),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_GIB,
    },
};

const tp_tunables tp__cma_tunables = {
    .ts_component = "cma",
    .ts_rows = cma_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(cma_tunable_rows),
    .ts_store = TP_TUNABLES_OWN,
    .ts_size = sizeof(cma_tunables),
};

const tp_channel_ops tp__channel_cma_ops = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "cma",
    .devices = TP_CHAN_DEV_CPU_CPU,
    .tunables = &tp__cma_tunables,
    .nconns = cma_nconns,
    .is_viable = cma_is_viable,
    .domain = cma_domain,
    .inline_max = cma_inline_max,
    .create = cma_create,
    .send = tp__cma_chan_send,
    .recv = tp__cma_chan_recv,
    .close = cma_close,
    .destroy = cma_destroy,
};
