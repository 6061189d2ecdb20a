// SPDX-License-Identifier: Apache-2.0
// pipe_proto_test.c - a pipe facing a peer that breaks the protocol: a
// raw tcp connection (the transport below the pipe, driven by hand) sends
// corrupted or truncated brochures, descriptors and answers. Each time the
// affected pipe (or the half-open connection) fails with a protocol error
// naming the peer, nothing crashes, and another pipe of the same contexts
// keeps working. Also: the handshake upgrades a tcp URL to shm when both
// ends can use it, and the report says why each other choice was refused.

#include "tp_test.h"

#include <tpipe/pipe.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"
#include "transport/transport.h"

#define WAIT_MS 20000

typedef struct raw {
    tp_config cfg;
    tp_loop *loop;
    tp_transport *t;
    tp_conn *c;
} raw;

static void
raw_init(raw *r)
{
    tp_error *err = NULL;
    memset(r, 0, sizeof(*r));
    tp__config_defaults(&r->cfg);
    TP_CHECK_OK(tp__loop_create(&r->cfg, "raw", &r->loop, &err), err);
    TP_CHECK_OK(tp__transport_create("tcp", r->loop, &r->cfg, &r->t, &err),
                err);
}

static void
raw_connect(raw *r, const char *url)
{
    op o;
    op_init(&o, WAIT_MS);
    tp__transport_connect(r->t, url, o.aio);
    op_wait(&o, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(o.aio), tp_aio_error(o.aio));
    r->c = tp_aio_get_output(o.aio, 0);
    op_fini(&o);
}

static void
raw_io(raw *r, bool write, void *buf, uint64_t len, tp_status *st_p)
{
    op o;
    op_init(&o, WAIT_MS);
    tp_iov iov = {buf, len};
    tp_aio_set_iov(o.aio, 1, &iov);
    if (write) {
        tp__conn_write(r->c, o.aio);
    } else {
        tp__conn_read(r->c, o.aio);
    }
    op_wait(&o, WAIT_MS);
    if (st_p != NULL) {
        *st_p = tp_aio_status(o.aio);
    } else {
        TP_CHECK_OK(tp_aio_status(o.aio), tp_aio_error(o.aio));
    }
    op_fini(&o);
}

static void
raw_fini(raw *r)
{
    if (r->c != NULL) {
        tp__conn_close(r->c);
        tp__conn_unref(r->c);
    }
    tp__transport_destroy(r->t);
    tp__loop_destroy(r->loop);
}

static void
raw_frame(raw *r, uint8_t type, uint8_t version, uint64_t body_len,
          const void *body, uint64_t send_len)
{
    uint8_t *buf = malloc(TP_FRAME_HDR_LEN + send_len + 1);
    tp__frame_hdr h = {type, version, 0, body_len};
    tp__frame_hdr_encode(buf, &h);
    if (send_len > 0) {
        memcpy(buf + TP_FRAME_HDR_LEN, body, send_len);
    }
    raw_io(r, true, buf, TP_FRAME_HDR_LEN + send_len, NULL);
    free(buf);
}

// Sends a valid brochure (tcp + basic, context "mallory") and reads the
// answer.
static void
raw_handshake(raw *r)
{
    tp__brochure *b = calloc(1, sizeof(*b));
    snprintf(b->b_ctxname, sizeof(b->b_ctxname), "mallory");
    b->b_ntransports = 1;
    snprintf(b->b_transports[0].be_name, sizeof(b->b_transports[0].be_name),
             "tcp");
    snprintf(b->b_transports[0].be_domain, sizeof(b->b_transports[0].be_domain),
             "tcp");
    b->b_nchannels = 1;
    snprintf(b->b_channels[0].be_name, sizeof(b->b_channels[0].be_name),
             "basic");
    snprintf(b->b_channels[0].be_domain, sizeof(b->b_channels[0].be_domain),
             "any");
    size_t n = tp__brochure_size(b);
    uint8_t *body = malloc(n);
    TP_CHECK_EQ(tp__brochure_encode(b, body, n), n);
    raw_frame(r, TP_FRAME_BROCHURE, TP_PIPE_WIRE_VERSION, n, body, n);
    free(body);
    free(b);
    uint8_t hdr[TP_FRAME_HDR_LEN];
    raw_io(r, false, hdr, sizeof(hdr), NULL);
    tp__frame_hdr h;
    TP_CHECK_OK(tp__frame_hdr_decode(hdr, &h, NULL), NULL);
    TP_CHECK_EQ(h.fh_type, TP_FRAME_ANSWER);
    uint8_t *abody = malloc(h.fh_body_len);
    raw_io(r, false, abody, h.fh_body_len, NULL);
    tp__answer *a = calloc(1, sizeof(*a));
    tp_error *err = NULL;
    TP_CHECK_OK(tp__answer_decode(abody, h.fh_body_len, a, &err), err);
    TP_CHECK(a->a_accepted);
    TP_CHECK_EQ(a->a_transport_reg_id, 0);
    TP_CHECK(strcmp(a->a_channel, "basic") == 0);
    free(a);
    free(abody);
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

// A proper pipe between @ctx's listener and a new context moves a message.
static void
check_other_pipe_works(tp_pipe_listener *l)
{
    tp_context *b = tp_test_ctx("bob", "tcp", "basic");
    tp_pipe *pb = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_context_connect(b, tp_pipe_listener_addr(l, "tcp"), &pb, &err), err);
    tp_pipe *pa = op_pipe_accept(l, WAIT_MS);
    TP_CHECK_STR_CONTAINS(tp_pipe_peer(pa), "bob");
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(1, 0, &m), NULL);
    char hello[] = "hello";
    m->payloads[0].data = hello;
    m->payloads[0].len = sizeof(hello);
    op w, r;
    op_init(&w, WAIT_MS);
    op_init(&r, WAIT_MS);
    tp_pipe_write(pb, m, w.aio);
    tp_pipe_read_descriptor(pa, r.aio);
    op_wait(&r, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    tp_message *in = tp_aio_get_output(r.aio, 0);
    atomic_store(&r.done, 0);
    tp_pipe_read(pa, in, r.aio);
    op_wait(&r, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    TP_CHECK(memcmp(in->payloads[0].data, hello, sizeof(hello)) == 0);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    tp_message_destroy(in);
    m->payloads[0].data = NULL;
    tp_message_destroy(m);
    op_fini(&w);
    op_fini(&r);
    tp_pipe_unref(pa);
    tp_pipe_unref(pb);
    tp_context_destroy(b);
}

// The accepted pipe of a raw peer; a descriptor read is pending on it.
typedef struct victim {
    tp_context *a;
    tp_pipe_listener *l;
    raw r;
    tp_pipe *p;
    op rd;
} victim;

static void
victim_open(victim *v)
{
    v->a = tp_test_ctx("alice", "tcp", "basic");
    v->l = listen_lo(v->a);
    raw_init(&v->r);
    raw_connect(&v->r, tp_pipe_listener_addr(v->l, "tcp"));
    raw_handshake(&v->r);
    v->p = op_pipe_accept(v->l, WAIT_MS);
    TP_CHECK_STR_CONTAINS(tp_pipe_peer(v->p), "mallory");
    op_init(&v->rd, WAIT_MS);
    tp_pipe_read_descriptor(v->p, v->rd.aio);
}

// The pending read fails with @st, naming the peer and @what.
static void
victim_check(victim *v, tp_status st, const char *what)
{
    op_wait(&v->rd, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(v->rd.aio), st);
    const char *msg = tp_error_message(tp_aio_error(v->rd.aio));
    TP_CHECK_STR_CONTAINS(msg, "mallory");
    TP_CHECK_STR_CONTAINS(msg, what);
    op_fini(&v->rd);
    // The pipe stays failed: a new read fails at once, same error.
    op again;
    op_init(&again, WAIT_MS);
    tp_pipe_read_descriptor(v->p, again.aio);
    op_wait(&again, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(again.aio), st);
    op_fini(&again);
    check_other_pipe_works(v->l);
}

static void
victim_close(victim *v)
{
    tp_pipe_unref(v->p);
    raw_fini(&v->r);
    tp_pipe_listener_destroy(v->l);
    tp_context_destroy(v->a);
}

static void
test_bad_frame_version(void)
{
    victim v;
    victim_open(&v);
    raw_frame(&v.r, TP_FRAME_MESSAGE, 99, 0, NULL, 0);
    victim_check(&v, TP_EPROTO, "version");
    victim_close(&v);
}

static void
test_unexpected_frame_type(void)
{
    victim v;
    victim_open(&v);
    uint8_t body[TP_JOIN_LEN] = {1};
    raw_frame(&v.r, TP_FRAME_JOIN, TP_PIPE_WIRE_VERSION, sizeof(body), body,
              sizeof(body));
    victim_check(&v, TP_EPROTO, "protocol error");
    victim_close(&v);
}

// A descriptor larger than the limits allow is refused before anything
// is allocated (2^60 bytes would not fit anywhere).
static void
test_descriptor_too_large(void)
{
    victim v;
    victim_open(&v);
    raw_frame(&v.r, TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, 1ull << 60, NULL,
              0);
    victim_check(&v, TP_EPROTO, "at most");
    victim_close(&v);
}

// Counts above the configured limits.
static void
test_descriptor_counts(void)
{
    victim v;
    victim_open(&v);
    uint8_t body[16] = {0};
    tp__put_u64le(body, 0);              // metadata_len
    tp__put_u32le(body + 8, 0);          // npayloads
    tp__put_u32le(body + 12, 100000000); // ntensors
    raw_frame(&v.r, TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, sizeof(body), body,
              sizeof(body));
    victim_check(&v, TP_EPROTO, "tensor");
    victim_close(&v);
}

// A tensor length above TP_PIPE_MAX_BUF_BYTES.
static void
test_descriptor_huge_tensor(void)
{
    victim v;
    victim_open(&v);
    uint8_t body[16 + 11] = {0}; // one tensor entry: 11 bytes
    tp__put_u32le(body + 12, 1);
    tp__put_u64le(body + 16, 1ull << 62);
    raw_frame(&v.r, TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, sizeof(body), body,
              sizeof(body));
    victim_check(&v, TP_EPROTO, "TP_PIPE_MAX_BUF_BYTES");
    victim_close(&v);
}

// Random bytes as a descriptor body.
static void
test_descriptor_garbage(void)
{
    victim v;
    victim_open(&v);
    uint8_t body[64];
    for (size_t i = 0; i < sizeof(body); i++) {
        body[i] = (uint8_t)(i * 37 + 11);
    }
    raw_frame(&v.r, TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, sizeof(body), body,
              sizeof(body));
    victim_check(&v, TP_EPROTO, "protocol error");
    victim_close(&v);
}

// A descriptor cut short by the peer closing: the read fails with the
// connection error, naming the peer.
static void
test_descriptor_truncated(void)
{
    victim v;
    victim_open(&v);
    uint8_t body[8] = {0};
    raw_frame(&v.r, TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, 40, body,
              sizeof(body));
    tp__conn_close(v.r.c);
    victim_check(&v, TP_ECONNRESET, "read");
    victim_close(&v);
}

// Garbage and truncated brochures: the listener drops those connections
// and keeps serving.
static void
test_bad_brochures(void)
{
    tp_context *a = tp_test_ctx("alice", "tcp", "basic");
    tp_pipe_listener *l = listen_lo(a);
    static const uint8_t garbage[] = {0xff, 0xfe, 0, 1, 2, 3, 4, 5, 6, 7};
    for (int k = 0; k < 4; k++) {
        raw r;
        raw_init(&r);
        raw_connect(&r, tp_pipe_listener_addr(l, "tcp"));
        if (k == 0) {
            raw_frame(&r, TP_FRAME_BROCHURE, TP_PIPE_WIRE_VERSION,
                      sizeof(garbage), garbage, sizeof(garbage));
        } else if (k == 1) {
            raw_frame(&r, TP_FRAME_BROCHURE, TP_PIPE_WIRE_VERSION, 1000,
                      garbage, sizeof(garbage)); // then close: truncated
        } else if (k == 2) {
            raw_frame(&r, TP_FRAME_BROCHURE, TP_PIPE_WIRE_VERSION, 1u << 30,
                      NULL, 0); // above the handshake bound
        } else {
            uint8_t join[TP_JOIN_LEN] = {0};
            tp__put_u64le(join, 12345); // names no pipe
            raw_frame(&r, TP_FRAME_JOIN, TP_PIPE_WIRE_VERSION, sizeof(join),
                      join, sizeof(join));
        }
        if (k != 1) {
            // The listener closes on us.
            uint8_t b;
            tp_status st;
            raw_io(&r, false, &b, 1, &st);
            TP_CHECK(st != TP_OK);
        }
        raw_fini(&r);
    }
    check_other_pipe_works(l);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(a);
}

// A raw tcp listener (@srv, *tl_p) and a pipe of a new context "bob"
// (*b_p, *p_p) connected to it; srv->c is the accepted connection.
static void
raw_server(raw *srv, tp_listener **tl_p, tp_context **b_p, tp_pipe **p_p)
{
    raw_init(srv);
    tp_error *err = NULL;
    TP_CHECK_OK(tp__transport_listen(srv->t, "tcp://127.0.0.1:0", tl_p, &err),
                err);
    *b_p = tp_test_ctx("bob", "tcp", "basic");
    TP_CHECK_OK(tp_context_connect(*b_p, tp__listener_addr(*tl_p), p_p, &err),
                err);
    op acc;
    op_init(&acc, WAIT_MS);
    tp__listener_accept(*tl_p, acc.aio);
    op_wait(&acc, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    srv->c = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
}

static void
raw_server_close(raw *srv, tp_listener *tl, tp_context *b, tp_pipe *p)
{
    tp_pipe_unref(p);
    tp_context_destroy(b);
    tp__listener_destroy(tl);
    raw_fini(srv);
}

// A listener that answers with garbage: the connecting pipe fails with a
// protocol error naming the address.
static void
test_bad_answer(void)
{
    raw srv;
    tp_listener *tl = NULL;
    tp_context *b = NULL;
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    raw_server(&srv, &tl, &b, &p);
    uint8_t hdr[TP_FRAME_HDR_LEN];
    raw_io(&srv, false, hdr, sizeof(hdr), NULL);
    tp__frame_hdr h;
    TP_CHECK_OK(tp__frame_hdr_decode(hdr, &h, NULL), NULL);
    uint8_t *body = malloc(h.fh_body_len);
    raw_io(&srv, false, body, h.fh_body_len, NULL);
    free(body);
    static const uint8_t garbage[] = {1, 200, 'x'};
    raw_frame(&srv, TP_FRAME_ANSWER, TP_PIPE_WIRE_VERSION, sizeof(garbage),
              garbage, sizeof(garbage));
    TP_CHECK_EQ(tp_pipe_wait_ready(p, WAIT_MS, &err), TP_EPROTO);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "127.0.0.1");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "answer");
    tp_error_unref(err);
    raw_server_close(&srv, tl, b, p);
}

// A handshake that never gets its answer times out, naming the peer.
static void
test_silent_listener(void)
{
    setenv("TP_HANDSHAKE_TIMEOUT_MS", "300", 1);
    raw srv;
    tp_listener *tl = NULL;
    tp_context *b = NULL;
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    raw_server(&srv, &tl, &b, &p);
    uint64_t t0 = tp__now_ns();
    TP_CHECK_EQ(tp_pipe_wait_ready(p, WAIT_MS, &err), TP_ETIMEDOUT);
    TP_CHECK((tp__now_ns() - t0) / 1000000u < 15000);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_HANDSHAKE_TIMEOUT_MS");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "127.0.0.1");
    tp_error_unref(err);
    raw_server_close(&srv, tl, b, p);
}

// Both ends can use shm and tcp: connecting to the tcp URL ends on shm
// (the upgrade through a join), and the report says why tcp was not used.
static void
test_upgrade_to_shm(void)
{
    char why[256];
    if (!tp__transport_find("shm")->is_viable(NULL, why, sizeof(why))) {
        tp_test_skip("shm not viable here: %s", why);
    }
    tp_context *a = tp_test_ctx("alice", "shm,tcp", "basic");
    tp_context *b = tp_test_ctx("bob", "shm,tcp", "basic");
    tp_pipe_listener *l = listen_lo(a);
    TP_CHECK(tp_pipe_listener_addr(l, "shm") != NULL);
    tp_pipe *pb = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_context_connect(b, tp_pipe_listener_addr(l, "tcp"), &pb, &err), err);
    tp_pipe *pa = op_pipe_accept(l, WAIT_MS);
    TP_CHECK_OK(tp_pipe_wait_ready(pb, WAIT_MS, &err), err);
    TP_CHECK(strcmp(tp_pipe_transport(pa), "shm") == 0);
    TP_CHECK(strcmp(tp_pipe_transport(pb), "shm") == 0);
    char *rep = tp_pipe_report(pa);
    TP_CHECK_STR_CONTAINS(rep, "transport tcp: usable, lower priority than "
                               "shm");
    TP_CHECK_STR_CONTAINS(rep, "channel cma: not allowed by the options");
    free(rep);
    rep = tp_pipe_report(pb);
    TP_CHECK_STR_CONTAINS(rep, "transport shm: chosen");
    TP_CHECK_STR_CONTAINS(rep, "peer alice notes");
    free(rep);
    tp_pipe_unref(pa);
    tp_pipe_unref(pb);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(b);
    tp_context_destroy(a);
}

// Different TP_MPT_SPLIT_MIN on the two ends: mpt is refused with the
// reason (domains differ) and basic is used.
static void
test_mpt_domain_mismatch(void)
{
    tp_context *a = tp_test_ctx("alice", "tcp", "mpt,basic");
    setenv("TP_MPT_SPLIT_MIN", "1M", 1);
    tp_context *b = tp_test_ctx("bob", "tcp", "mpt,basic");
    unsetenv("TP_MPT_SPLIT_MIN");
    tp_pipe_listener *l = listen_lo(a);
    tp_pipe *pb = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_context_connect(b, tp_pipe_listener_addr(l, "tcp"), &pb, &err), err);
    tp_pipe *pa = op_pipe_accept(l, WAIT_MS);
    TP_CHECK(strcmp(tp_pipe_channel(pa), "basic") == 0);
    char *rep = tp_pipe_report(pa);
    TP_CHECK_STR_CONTAINS(rep, "channel mpt: domain descriptors differ");
    free(rep);
    tp_pipe_unref(pa);
    tp_pipe_unref(pb);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(b);
    tp_context_destroy(a);
}

// mpt's lanes take the context's first transport that reaches other
// hosts (TP_TRANSPORT_PROP_NETWORK), never a name: with tcp, the lanes are
// tcp and say so; with shm only, mpt is left out and the report says why,
// and a context that allows only mpt over shm is refused.
static void
test_mpt_lanes_by_property(void)
{
    char why[256];
    tp_context *a = tp_test_ctx("alice", "shm,tcp", "mpt,basic");
    char *rep = tp_context_report(a);
    TP_CHECK_STR_CONTAINS(rep, "over tcp");
    TP_CHECK_STR_CONTAINS(rep, ":lanes=tcp");
    free(rep);
    tp_context_destroy(a);
    if (!tp__transport_find("shm")->is_viable(NULL, why, sizeof(why))) {
        tp_test_skip("shm not viable here: %s", why);
    }
    tp_context *b = tp_test_ctx("bob", "shm", "mpt,basic");
    rep = tp_context_report(b);
    TP_CHECK_STR_CONTAINS(rep, "channel mpt: its lanes need a transport that "
                               "reaches other hosts (network property; "
                               "built: tcp");
    TP_CHECK(strstr(rep, "mpt lanes") == NULL);
    free(rep);
    tp_context_destroy(b);
    tp_context_options o;
    tp_context_options_init(&o);
    o.name = "carol";
    o.transports = "shm";
    o.channels = "mpt";
    tp_context *c = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_context_create(&o, &c, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "needs a transport that reaches other hosts");
    tp_error_unref(err);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_bad_frame_version),
    TP_TEST_CASE(test_unexpected_frame_type),
    TP_TEST_CASE(test_descriptor_too_large),
    TP_TEST_CASE(test_descriptor_counts),
    TP_TEST_CASE(test_descriptor_huge_tensor),
    TP_TEST_CASE(test_descriptor_garbage),
    TP_TEST_CASE(test_descriptor_truncated),
    TP_TEST_CASE(test_bad_brochures),
    TP_TEST_CASE(test_bad_answer),
    TP_TEST_CASE(test_silent_listener),
    TP_TEST_CASE(test_upgrade_to_shm),
    TP_TEST_CASE(test_mpt_domain_mismatch),
    TP_TEST_CASE(test_mpt_lanes_by_property),
};

TP_TEST_MAIN(cases)
