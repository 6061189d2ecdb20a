// SPDX-License-Identifier: Apache-2.0
// cma_peer_test.c - the cma channel trusts the kernel, not the peer, about
// which process it reads (docs/channel-cma.md, "Trust").
//
// The attack: a pipe peer ("mallory", driven by hand over raw tcp
// connections) negotiates cma and sends a descriptor whose cma info names
// another process (the "victim", a forked child holding a secret) and an
// address in it. The agent could read that process (the test checks it),
// so without the check it would hand the secret to whoever reads the
// message. With it, the read fails with a protocol error naming the peer,
// only that pipe closes, and the secret is nowhere in the buffer.
//
// Also: the same raw peer naming its own process works (so the refusal
// is the check, not a broken handshake); a peer that never presents its
// token, and (as root) one whose side connection comes from a process of
// another uid, are refused; the side socket's own steps.

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/pipe.h>

#include "channel/channel.h"
#include "channel/cma/cma_probe.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"
#include "transport/transport.h"

#define WAIT_MS     20000
#define SECRET_LEN  (64u * 1024u) // above TP_CMA_INLINE_MAX (16K)
#define HELLO_LEN   (8u + TP_CMA_SIDE_NAME_LEN + TP_CMA_SIDE_TOKEN_LEN)
#define READY_MAGIC "TPCMARDY"

static void
need_cma(void)
{
    char why[512];
    if (!tp__cma_viable(why, sizeof(why))) {
        tp_test_skip("cma not viable: %s", why);
    }
}

static void
secret_fill(uint8_t *p, size_t n)
{
    static const char s[] = "SECRET-of-the-victim-";
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)s[i % (sizeof(s) - 1)];
    }
}

// ---- the victim: a process holding a secret ---------------------------------

typedef struct victim {
    pid_t pid;
    uint64_t addr;
    int hold_fd; // closing it lets the victim exit
} victim;

static void
victim_start(victim *v)
{
    int up[2], hold[2];
    TP_CHECK(pipe(up) == 0 && pipe(hold) == 0);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(up[0]);
        close(hold[1]);
        uint8_t *s = mmap(NULL, SECRET_LEN, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) {
            _exit(1);
        }
        secret_fill(s, SECRET_LEN);
        tp__cma_allow_peers(); // Yama scope 1: let the agent read us
        uint64_t a = (uint64_t)(uintptr_t)s;
        if (write(up[1], &a, sizeof(a)) != (ssize_t)sizeof(a)) {
            _exit(1);
        }
        char b;
        while (read(hold[0], &b, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    close(up[1]);
    close(hold[0]);
    v->pid = pid;
    v->hold_fd = hold[1];
    struct pollfd pfd = {.fd = up[0], .events = POLLIN};
    TP_CHECK(poll(&pfd, 1, (int)tp_test_ms(WAIT_MS)) == 1);
    TP_CHECK(read(up[0], &v->addr, sizeof(v->addr)) ==
             (ssize_t)sizeof(v->addr));
    close(up[0]);
}

static void
victim_stop(victim *v)
{
    close(v->hold_fd);
    int st = 0;
    TP_CHECK(waitpid(v->pid, &st, 0) == v->pid);
    TP_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

// ---- mallory: a pipe peer by hand -------------------------------------------

typedef struct raw {
    tp_config cfg;
    tp_loop *loop;
    tp_transport *t;
    tp_conn *c;    // the pipe's connection
    tp_conn *side; // the cma channel's connection
    tp__cma_side s;
    uint8_t hello[HELLO_LEN]; // the agent's
} raw;

static tp_conn *
raw_connect(raw *r, const char *url)
{
    op o;
    op_init(&o, WAIT_MS);
    tp__transport_connect(r->t, url, o.aio);
    op_wait(&o, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(o.aio), tp_aio_error(o.aio));
    tp_conn *c = tp_aio_get_output(o.aio, 0);
    op_fini(&o);
    return c;
}

static tp_status
raw_io(tp_conn *c, bool write, void *buf, uint64_t len)
{
    op o;
    op_init(&o, WAIT_MS);
    tp_iov iov = {buf, len};
    tp_aio_set_iov(o.aio, 1, &iov);
    if (write) {
        tp__conn_write(c, o.aio);
    } else {
        tp__conn_read(c, o.aio);
    }
    op_wait(&o, WAIT_MS);
    tp_status st = tp_aio_status(o.aio);
    op_fini(&o);
    return st;
}

static void
raw_frame(tp_conn *c, uint8_t type, const void *body, uint64_t len)
{
    uint8_t *buf = malloc(TP_FRAME_HDR_LEN + len);
    tp__frame_hdr h = {type, TP_PIPE_WIRE_VERSION, 0, len};
    tp__frame_hdr_encode(buf, &h);
    memcpy(buf + TP_FRAME_HDR_LEN, body, len);
    TP_CHECK_OK(raw_io(c, true, buf, TP_FRAME_HDR_LEN + len), NULL);
    free(buf);
}

// How mallory answers the agent's cma hello.
enum side_mode {
    SIDE_HONEST, // connects to the agent's side socket with its token
    SIDE_SILENT, // says "ready" without connecting
    SIDE_NOBODY, // connects from a child running as uid/gid 65534
    SIDE_GONE,   // its side socket is closed before its hello is sent
};

static void
nobody_connect(tp_test_peer *self, void *arg)
{
    (void)self;
    const uint8_t *hello = arg;
    if (setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
        _exit(2);
    }
    _exit(tp__cma_side_connect((const char *)hello + 8,
                               hello + 8 + TP_CMA_SIDE_NAME_LEN, NULL) == TP_OK
              ? 0
              : 1);
}

// As a process of uid and gid 65534: connect to the agent's side socket
// and present its token.
static void
side_connect_as_nobody(const uint8_t *hello)
{
    tp_test_peer nobody;
    tp_test_peer_fork(&nobody, "nobody", TP_TEST_PEER_DOWN, nobody_connect,
                      (void *)hello);
    tp_test_peer_wait(&nobody, WAIT_MS);
}

static void
raw_start(raw *r, tp_pipe_listener *l)
{
    tp_error *err = NULL;
    memset(r, 0, sizeof(*r));
    r->s.cs_fd = -1;
    tp__config_defaults(&r->cfg);
    TP_CHECK_OK(tp__loop_create(&r->cfg, "mallory", &r->loop, &err), err);
    TP_CHECK_OK(tp__transport_create("tcp", r->loop, &r->cfg, &r->t, &err),
                err);
    r->c = raw_connect(r, tp_pipe_listener_addr(l, "tcp"));
}

// Sends a brochure offering tcp and cma with @cma_domain (NULL: the
// agent's own, whatever this process really is) and returns the answer
// (free()).
static tp__answer *
raw_brochure(raw *r, const char *cma_domain)
{
    tp_error *err = NULL;
    tp__brochure *b = calloc(1, sizeof(*b));
    snprintf(b->b_ctxname, sizeof(b->b_ctxname), "mallory");
    b->b_ntransports = 1;
    snprintf(b->b_transports[0].be_name, sizeof(b->b_transports[0].be_name),
             "tcp");
    snprintf(b->b_transports[0].be_domain, sizeof(b->b_transports[0].be_domain),
             "%s", tp__transport_domain(r->t));
    b->b_nchannels = 1;
    snprintf(b->b_channels[0].be_name, sizeof(b->b_channels[0].be_name), "cma");
    if (cma_domain != NULL) {
        snprintf(b->b_channels[0].be_domain, sizeof(b->b_channels[0].be_domain),
                 "%s", cma_domain);
    } else {
        TP_CHECK_OK(tp__channel_find("cma")->domain(
                        &r->cfg, b->b_channels[0].be_domain,
                        sizeof(b->b_channels[0].be_domain), &err),
                    err);
    }
    size_t n = tp__brochure_size(b);
    uint8_t *body = malloc(n);
    TP_CHECK_EQ(tp__brochure_encode(b, body, n), n);
    raw_frame(r->c, TP_FRAME_BROCHURE, body, n);
    free(body);
    free(b);

    uint8_t hdr[TP_FRAME_HDR_LEN];
    TP_CHECK_OK(raw_io(r->c, false, hdr, sizeof(hdr)), NULL);
    tp__frame_hdr h;
    TP_CHECK_OK(tp__frame_hdr_decode(hdr, &h, NULL), NULL);
    TP_CHECK_EQ(h.fh_type, TP_FRAME_ANSWER);
    uint8_t *abody = malloc(h.fh_body_len);
    TP_CHECK_OK(raw_io(r->c, false, abody, h.fh_body_len), NULL);
    tp__answer *a = calloc(1, sizeof(*a));
    TP_CHECK_OK(tp__answer_decode(abody, h.fh_body_len, a, &err), err);
    free(abody);
    return a;
}

// Mallory connects to @l, negotiates tcp + cma (claiming the agent's own
// cma domain), joins the channel's connection and answers the cma hello
// as @mode says.
static void
mallory_open(raw *r, tp_pipe_listener *l, enum side_mode mode)
{
    tp_error *err = NULL;
    raw_start(r, l);
    tp__answer *a = raw_brochure(r, NULL);
    TP_CHECK(a->a_accepted);
    TP_CHECK(strcmp(a->a_channel, "cma") == 0);
    TP_CHECK_EQ(a->a_nconns, 1);

    r->side = raw_connect(r, a->a_conns[0].ac_addr);
    uint8_t join[TP_JOIN_LEN];
    tp__join_encode(a->a_conns[0].ac_reg_id, 0, join);
    raw_frame(r->side, TP_FRAME_JOIN, join, sizeof(join));
    free(a);

    // The cma hello, both ways, then "ready".
    TP_CHECK_OK(raw_io(r->side, false, r->hello, sizeof(r->hello)), NULL);
    TP_CHECK(memcmp(r->hello, "TPCMAHI\x01", 8) == 0);
    TP_CHECK_OK(tp__cma_side_listen(&r->s, &err), err);
    if (mode == SIDE_GONE) {
        tp__cma_side_close(&r->s); // the agent's connect is refused
    }
    uint8_t mine[HELLO_LEN];
    memcpy(mine, "TPCMAHI\x01", 8);
    memcpy(mine + 8, r->s.cs_name, TP_CMA_SIDE_NAME_LEN);
    memcpy(mine + 8 + TP_CMA_SIDE_NAME_LEN, r->s.cs_token,
           TP_CMA_SIDE_TOKEN_LEN);
    TP_CHECK_OK(raw_io(r->side, true, mine, sizeof(mine)), NULL);
    if (mode == SIDE_HONEST) {
        TP_CHECK_OK(tp__cma_side_connect((const char *)r->hello + 8,
                                         r->hello + 8 + TP_CMA_SIDE_NAME_LEN,
                                         &err),
                    err);
    } else if (mode == SIDE_NOBODY) {
        side_connect_as_nobody(r->hello);
    }
    char ready[] = READY_MAGIC;
    TP_CHECK_OK(raw_io(r->side, true, ready, 8), NULL);
}

// Sends a descriptor of one SECRET_LEN tensor whose cma info names @pid
// and @addr.
static void
mallory_send(raw *r, pid_t pid, uint64_t addr)
{
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0].len = SECRET_LEN;
    tp__chan_info info = {.ci_len = 12};
    tp__put_u32le(info.ci_bytes, (uint32_t)pid);
    tp__put_u64le(info.ci_bytes + 4, addr);
    uint64_t n = tp__desc_size(m, &info);
    TP_CHECK(n > 0);
    uint8_t *body = malloc(n);
    TP_CHECK_EQ(tp__desc_encode(m, &info, body, n), n);
    raw_frame(r->c, TP_FRAME_MESSAGE, body, n);
    free(body);
    tp_message_destroy(m);
}

// Sends a message of one 4-byte payload and no tensor.
static void
mallory_send_plain(raw *r)
{
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(1, 0, &m), NULL);
    m->payloads[0].len = 4;
    uint64_t n = tp__desc_size(m, NULL);
    TP_CHECK(n > 0);
    uint8_t *body = malloc(n);
    TP_CHECK_EQ(tp__desc_encode(m, NULL, body, n), n);
    raw_frame(r->c, TP_FRAME_MESSAGE, body, n);
    free(body);
    tp_message_destroy(m);
    char pay[4] = "PING";
    TP_CHECK_OK(raw_io(r->c, true, pay, sizeof(pay)), NULL);
}

static void
mallory_close(raw *r)
{
    tp__cma_side_close(&r->s);
    tp__conn_close(r->side);
    tp__conn_unref(r->side);
    tp__conn_close(r->c);
    tp__conn_unref(r->c);
    tp__transport_destroy(r->t);
    tp__loop_destroy(r->loop);
}

// ---- the agent --------------------------------------------------------------

static tp_context *
ctx_new(const char *name)
{
    return tp_test_ctx(name, "tcp", "cma");
}

static tp_pipe_listener *
listen_lo(tp_context *ctx)
{
    const char *url = "tcp://127.0.0.1:0";
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_listen(ctx, &url, 1, &l, &err), err);
    return l;
}

// Reads one message from @p into a buffer the pipe allocates. Returns the
// status of the read; *@msg_p gets the message (NULL if the descriptor
// read failed), *@err_p a reference to the error.
static tp_status
agent_read(tp_pipe *p, tp_message **msg_p, tp_error **err_p)
{
    op r;
    op_init(&r, WAIT_MS);
    tp_pipe_read_descriptor(p, r.aio);
    op_wait(&r, WAIT_MS);
    tp_status st = tp_aio_status(r.aio);
    *msg_p = NULL;
    if (st == TP_OK) {
        tp_message *in = tp_aio_get_output(r.aio, 0);
        TP_CHECK_EQ(in->ntensors, 1);
        TP_CHECK_EQ(in->tensors[0].len, SECRET_LEN);
        atomic_store(&r.done, 0);
        tp_pipe_read(p, in, r.aio);
        op_wait(&r, WAIT_MS);
        st = tp_aio_status(r.aio);
        *msg_p = in;
    }
    *err_p = tp_error_ref((tp_error *)tp_aio_error(r.aio));
    op_fini(&r);
    return st;
}

static bool
holds_secret(const tp_message *m)
{
    if (m == NULL || m->tensors[0].data == NULL) {
        return false;
    }
    return memmem(m->tensors[0].data, m->tensors[0].len, "SECRET-of-the", 13) !=
           NULL;
}

// A proper cma pipe between a new context and @l moves a tensor: the
// agent's other pipes are unaffected.
static void
check_other_pipe_works(tp_pipe_listener *l)
{
    tp_context *b = ctx_new("bob");
    tp_pipe *pb = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_context_connect(b, tp_pipe_listener_addr(l, "tcp"), &pb, &err), err);
    tp_pipe *pa = op_pipe_accept(l, WAIT_MS);
    TP_CHECK(strcmp(tp_pipe_channel(pa), "cma") == 0);
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    uint8_t *buf = malloc(SECRET_LEN);
    for (size_t i = 0; i < SECRET_LEN; i++) {
        buf[i] = (uint8_t)(i * 7u + 3u);
    }
    m->tensors[0].data = buf;
    m->tensors[0].len = SECRET_LEN;
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pb, m, w.aio);
    tp_message *in = NULL;
    TP_CHECK_OK(agent_read(pa, &in, &err), err);
    TP_CHECK(memcmp(in->tensors[0].data, buf, SECRET_LEN) == 0);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    tp_message_destroy(in);
    m->tensors[0].data = NULL;
    tp_message_destroy(m);
    free(buf);
    tp_pipe_unref(pa);
    tp_pipe_unref(pb);
    tp_context_destroy(b);
}

// ---- cases ------------------------------------------------------------------

// The attack, refused.
static void
descriptor_names_other_process(void)
{
    need_cma();
    victim v;
    victim_start(&v); // before any thread exists
    // The agent's process could read the victim: only the check stands
    // between mallory and the secret.
    uint8_t *probe = malloc(SECRET_LEN);
    tp_error *err = NULL;
    TP_CHECK_OK(tp__cma_read(v.pid, v.addr, probe, SECRET_LEN, &err), err);
    TP_CHECK(memcmp(probe, "SECRET-of-the", 13) == 0);
    free(probe);

    tp_context *a = ctx_new("agent");
    tp_pipe_listener *l = listen_lo(a);
    raw r;
    mallory_open(&r, l, SIDE_HONEST);
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    mallory_send(&r, v.pid, v.addr);
    tp_message *in = NULL;
    TP_CHECK_EQ(agent_read(p, &in, &err), TP_EPROTO);
    const char *msg = tp_error_message(err);
    TP_CHECK_STR_CONTAINS(msg, "mallory");
    TP_CHECK_STR_CONTAINS(msg, "protocol error");
    TP_CHECK_STR_CONTAINS(msg, "names pid");
    TP_CHECK(!holds_secret(in));
    tp_error_unref(err);
    tp_message_destroy(in);
    // That pipe is closed: the next read fails at once.
    TP_CHECK(agent_read(p, &in, &err) != TP_OK);
    tp_error_unref(err);
    tp_message_destroy(in);
    check_other_pipe_works(l);
    tp_pipe_unref(p);
    mallory_close(&r);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(a);
    victim_stop(&v);
}

// The same raw peer naming its own process (this one, which made the side
// connection) is read: the handshake above was right.
static void
descriptor_names_peer(void)
{
    need_cma();
    tp_context *a = ctx_new("agent");
    tp_pipe_listener *l = listen_lo(a);
    raw r;
    mallory_open(&r, l, SIDE_HONEST);
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    uint8_t *own = malloc(SECRET_LEN);
    secret_fill(own, SECRET_LEN);
    mallory_send(&r, getpid(), (uint64_t)(uintptr_t)own);
    tp_message *in = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(agent_read(p, &in, &err), err);
    TP_CHECK(memcmp(in->tensors[0].data, own, SECRET_LEN) == 0);
    tp_message_destroy(in);
    free(own);
    tp_pipe_unref(p);
    mallory_close(&r);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(a);
}

// The pipe of a peer whose side connection fails fails before any read.
static void
check_pipe_refused(enum side_mode mode, const char *what)
{
    tp_context *a = ctx_new("agent");
    tp_pipe_listener *l = listen_lo(a);
    raw r;
    mallory_open(&r, l, mode);
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    mallory_send(&r, getpid(), 4096);
    tp_message *in = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(agent_read(p, &in, &err), TP_EPROTO);
    const char *msg = tp_error_message(err);
    TP_CHECK_STR_CONTAINS(msg, "mallory");
    TP_CHECK_STR_CONTAINS(msg, what);
    // Nothing about uids in the error (a caller may pass it on).
    TP_CHECK(strstr(msg, "uid") == NULL);
    TP_CHECK(strstr(msg, "65534") == NULL);
    tp_error_unref(err);
    tp_message_destroy(in);
    check_other_pipe_works(l);
    tp_pipe_unref(p);
    mallory_close(&r);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(a);
}

// "Ready" without a connection presenting the token.
static void
side_without_token(void)
{
    need_cma();
    check_pipe_refused(SIDE_SILENT, "token");
}

// The domain says uid 0 (mallory copies the agent's), the kernel says the
// side connection came from uid 65534.
static void
side_from_other_uid(void)
{
    if (geteuid() != 0) {
        tp_test_skip("needs root (to connect as another uid)");
    }
    need_cma();
    check_pipe_refused(SIDE_NOBODY, "another user");
}

// The side socket alone: the kernel names the connecting process, strays
// without the token are skipped, foreign names are refused, and the pidfd
// sees the peer exit.
static void
side_socket(void)
{
    tp_error *err = NULL;
    tp__cma_side s;
    TP_CHECK_OK(tp__cma_side_listen(&s, &err), err);
    uint8_t wrong[TP_CMA_SIDE_TOKEN_LEN];
    memcpy(wrong, s.cs_token, sizeof(wrong));
    wrong[0] ^= 1;
    TP_CHECK_OK(tp__cma_side_connect(s.cs_name, wrong, &err), err);
    // A child connects with the token, then exits.
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        _exit(tp__cma_side_connect(s.cs_name, s.cs_token, NULL) == TP_OK ? 0
                                                                         : 1);
    }
    tp__cma_peer peer;
    // The child has exited (not reaped): its connection waits with the
    // token.
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    TP_CHECK(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) == 0);
    TP_CHECK_OK(tp__cma_side_accept(&s, &peer, &err), err);
    TP_CHECK_EQ(peer.cp_pid, pid);
    TP_CHECK_EQ(peer.cp_uid, geteuid());
    TP_CHECK_EQ(peer.cp_gid, getegid());
    TP_CHECK_EQ(s.cs_fd, -1); // closed once used
    int st = 0;
    TP_CHECK(waitpid(pid, &st, 0) == pid);
    TP_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (peer.cp_pidfd >= 0) {
        TP_CHECK(!tp__cma_peer_alive(&peer));
    }
    tp__cma_peer_fini(&peer);
    tp__cma_peer_fini(&peer);

    // Only hex names: no connecting to other abstract sockets.
    char bad[TP_CMA_SIDE_NAME_LEN];
    memset(bad, 'z', sizeof(bad));
    TP_CHECK_EQ(tp__cma_side_connect(bad, wrong, &err), TP_EPROTO);
    tp_error_unref(err);
    err = NULL;

    // No connection at all.
    TP_CHECK_OK(tp__cma_side_listen(&s, &err), err);
    TP_CHECK_EQ(tp__cma_side_accept(&s, &peer, &err), TP_EPROTO);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "token");
    tp_error_unref(err);
    tp__cma_side_close(&s);
    tp__cma_side_close(&s);

    // Ourselves: alive.
    TP_CHECK_OK(tp__cma_side_listen(&s, &err), err);
    TP_CHECK_OK(tp__cma_side_connect(s.cs_name, s.cs_token, &err), err);
    TP_CHECK_OK(tp__cma_side_accept(&s, &peer, &err), err);
    TP_CHECK_EQ(peer.cp_pid, getpid());
    TP_CHECK(tp__cma_peer_alive(&peer));
    tp__cma_peer_fini(&peer);
}

// The peer's side socket is gone (the peer exited, say): only cma tensors
// depend on it. A message without one is read; the next cma tensor fails,
// naming the peer, and the pipe with it.
static void
side_socket_gone(void)
{
    need_cma();
    tp_context *a = ctx_new("agent");
    tp_pipe_listener *l = listen_lo(a);
    raw r;
    mallory_open(&r, l, SIDE_GONE);
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    mallory_send_plain(&r);
    op o;
    op_init(&o, WAIT_MS);
    tp_pipe_read_descriptor(p, o.aio);
    op_wait(&o, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(o.aio), tp_aio_error(o.aio));
    tp_message *in = tp_aio_get_output(o.aio, 0);
    TP_CHECK_EQ(in->ntensors, 0);
    atomic_store(&o.done, 0);
    tp_pipe_read(p, in, o.aio);
    op_wait(&o, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(o.aio), tp_aio_error(o.aio));
    TP_CHECK(memcmp(in->payloads[0].data, "PING", 4) == 0);
    op_fini(&o);
    tp_message_destroy(in);
    mallory_send(&r, getpid(), 4096);
    tp_error *err = NULL;
    in = NULL;
    TP_CHECK(agent_read(p, &in, &err) != TP_OK);
    const char *msg = tp_error_message(err);
    TP_CHECK_STR_CONTAINS(msg, "mallory");
    TP_CHECK_STR_CONTAINS(msg, "side connection");
    tp_error_unref(err);
    tp_message_destroy(in);
    tp_pipe_unref(p);
    mallory_close(&r);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(a);
}

// A refused handshake tells the peer why, but not our domain descriptor
// (boot id, namespace ids, uids): those stay in our log.
static void
refusal_hides_domains(void)
{
    need_cma();
    tp_context *a = ctx_new("agent");
    tp_pipe_listener *l = listen_lo(a);
    char ours[TP_CMA_DOMAIN_MAX + 32];
    tp_config cfg;
    tp__config_defaults(&cfg);
    tp_error *err = NULL;
    TP_CHECK_OK(tp__channel_find("cma")->domain(&cfg, ours, sizeof(ours), &err),
                err);
    raw r;
    raw_start(&r, l);
    tp__answer *ans = raw_brochure(&r, "cma:mallory-boot:uid=0/0/0");
    TP_CHECK(!ans->a_accepted);
    TP_CHECK_STR_CONTAINS(ans->a_reason, "no channel both ends can use");
    TP_CHECK_STR_CONTAINS(ans->a_reason, "channel cma: domain descriptors "
                                         "differ");
    TP_CHECK(strstr(ans->a_reason, "mallory-boot") == NULL);
    TP_CHECK(strstr(ans->a_reason, "pidns=") == NULL);
    TP_CHECK(strstr(ans->a_reason, "uid=") == NULL);
    char boot[40];
    snprintf(boot, sizeof(boot), "%.36s", ours + 4); // "cma:<boot id>:"
    TP_CHECK(strstr(ans->a_reason, boot) == NULL);
    free(ans);
    tp__conn_close(r.c);
    tp__conn_unref(r.c);
    tp__transport_destroy(r.t);
    tp__loop_destroy(r.loop);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(a);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(descriptor_names_other_process),
    TP_TEST_CASE(descriptor_names_peer),
    TP_TEST_CASE(side_without_token),
    TP_TEST_CASE(side_from_other_uid),
    TP_TEST_CASE(side_socket),
    TP_TEST_CASE(side_socket_gone),
    TP_TEST_CASE(refusal_hides_domains),
};

TP_TEST_MAIN(cases)
