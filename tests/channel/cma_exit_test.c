// SPDX-License-Identifier: Apache-2.0
// cma_exit_test.c - a peer that reads its message and exits at once does
// not fail the write (docs/channel-cma.md, "When a write completes").
//
// Two processes, a new pipe that negotiates cma: the parent ("alice")
// connects and writes one message at once, the child ("bob") accepts,
// reads it and exits right away (_exit, or after destroying its context).
// The write must complete OK, whether its tensor went by cma, inline on
// the pipe's connection, or there was none: the cma channel may still be
// in its handshake (hello, side socket, ready) when bob goes, and a
// failure of the channel's side connections after bob has the message is
// not the write's. A child that exits before reading a cma tensor makes
// the write fail, naming the peer. Each case runs ROUNDS times (the bug
// was a race), over tcp and over shm (a tcp URL upgraded, as collectives
// do).

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <tpipe/pipe.h>

#include "channel/cma/cma_probe.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

#define WAIT_MS 20000
#define ROUNDS  50
#define PAYLOAD 16u

enum what {
    MSG_NONE,  // a payload, no tensor
    MSG_SMALL, // a tensor on the pipe's connection (<= TP_CMA_INLINE_MAX)
    MSG_LARGE, // a tensor by cma
};

enum child_mode {
    READ_EXIT,    // read the message, _exit at once
    READ_DESTROY, // read it, destroy the context, then exit
    NO_READ,      // read the descriptor only, _exit
};

static void
need_cma(void)
{
    char why[512];
    if (!tp__cma_viable(why, sizeof(why))) {
        tp_test_skip("cma not viable: %s", why);
    }
}

static uint64_t
tensor_len(enum what w, unsigned round)
{
    switch (w) {
    case MSG_SMALL:
        return 64;
    case MSG_LARGE: // one copy, or split in parts (above CMA_INLINE_COPY)
        return round % 2 ? (1u << 20) + 3 : 64u * 1024u;
    default:
        return 0;
    }
}

static uint8_t
byte_at(uint64_t i)
{
    return (uint8_t)(i * 7u + 3u);
}

// What bob does in a round.
typedef struct child_args {
    const char *transports;
    enum what w;
    unsigned round;
    enum child_mode mode;
} child_args;

// The child: listens, sends its tcp URL up, accepts one pipe and reads
// one message as the mode says. Exits 0 if all went as expected.
static void
child_run(tp_test_peer *self, void *arg)
{
    const child_args *a = arg;
    enum what w = a->w;
    unsigned round = a->round;
    enum child_mode mode = a->mode;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    tp_context *ctx = tp_test_ctx("bob", a->transports, "cma");
    const char *url = "tcp://127.0.0.1:0";
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_listen(ctx, &url, 1, &l, &err), err);
    const char *addr = tp_pipe_listener_addr(l, "tcp");
    TP_CHECK(addr != NULL);
    tp_test_peer_send(self, addr);
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    tp_message *in = tp_test_read_desc(p, WAIT_MS);
    uint64_t tl = tensor_len(w, round);
    TP_CHECK_EQ(in->ntensors, tl > 0 ? 1u : 0u);
    if (mode == NO_READ) {
        _exit(0);
    }
    op o;
    op_init(&o, WAIT_MS);
    tp_pipe_read(p, in, o.aio);
    op_wait(&o, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(o.aio), tp_aio_error(o.aio));
    op_fini(&o);
    TP_CHECK_EQ(in->npayloads, 1u);
    TP_CHECK_EQ(in->payloads[0].len, PAYLOAD);
    for (uint64_t i = 0; i < tl; i++) {
        TP_CHECKF(((const uint8_t *)in->tensors[0].data)[i] == byte_at(i),
                  "tensor byte %llu differs", (unsigned long long)i);
    }
    if (mode == READ_EXIT) {
        _exit(0); // at once: no close, no flush
    }
    tp_message_destroy(in);
    tp_pipe_unref(p);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
    _exit(0);
}

// One round: fork bob, connect, write at once, check the write's status
// and bob's exit.
static void
round_run(const char *transports, enum what w, unsigned round,
          enum child_mode mode)
{
    child_args args = {transports, w, round, mode};
    tp_test_peer bob;
    tp_test_peer_fork(&bob, "bob", TP_TEST_PEER_UP, child_run, &args);
    char url[256];
    TP_CHECK(tp_test_peer_recv(&bob, url, sizeof(url), WAIT_MS));

    tp_context *ctx = tp_test_ctx("alice", transports, "cma");
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url, &p, &err), err);
    uint64_t tl = tensor_len(w, round);
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(1, tl > 0 ? 1 : 0, &m), NULL);
    uint8_t pay[PAYLOAD];
    memset(pay, 0x5a, sizeof(pay));
    m->payloads[0].data = pay;
    m->payloads[0].len = sizeof(pay);
    uint8_t *buf = NULL;
    if (tl > 0) {
        buf = malloc(tl);
        TP_CHECK(buf != NULL);
        for (uint64_t i = 0; i < tl; i++) {
            buf[i] = byte_at(i);
        }
        m->tensors[0].data = buf;
        m->tensors[0].len = tl;
    }
    // At once: the pipe (and its cma channel) are still in their
    // handshakes.
    op o;
    op_init(&o, WAIT_MS);
    tp_pipe_write(p, m, o.aio);
    op_wait(&o, WAIT_MS);
    tp_status st = tp_aio_status(o.aio);
    const char *msg = tp_error_message(tp_aio_error(o.aio));
    const char *chan = tp_pipe_channel(p);
    TP_CHECKF(chan != NULL && strcmp(chan, "cma") == 0,
              "%s: channel %s, not cma", transports, chan ? chan : "(none)");
    if (mode == NO_READ) {
        TP_CHECKF(st != TP_OK,
                  "%s round %u: write of a cma tensor the peer never "
                  "read succeeded",
                  transports, round);
        TP_CHECK_STR_CONTAINS(msg, "pipe to bob");
    } else {
        TP_CHECKF(st == TP_OK,
                  "%s, %s, round %u, child %s: the peer read the message, "
                  "yet the write failed: %s: %s",
                  transports,
                  w == MSG_NONE    ? "no tensor"
                  : w == MSG_SMALL ? "inline tensor"
                                   : "cma tensor",
                  round, mode == READ_EXIT ? "exits" : "destroys",
                  tp_status_name(st), msg);
    }
    op_fini(&o);
    tp_test_peer_wait(&bob, WAIT_MS);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
    m->payloads[0].data = NULL;
    if (tl > 0) {
        m->tensors[0].data = NULL;
    }
    tp_message_destroy(m);
    free(buf);
}

static unsigned
rounds(void)
{
    const char *s = getenv("TP_CMA_EXIT_ROUNDS");
    int n = s != NULL ? atoi(s) : 0;
    return n > 0 ? (unsigned)n : ROUNDS;
}

static void
reader_exits(const char *transports)
{
    need_cma();
    unsigned n = rounds();
    for (unsigned r = 0; r < n; r++) {
        enum child_mode mode = r % 2 ? READ_DESTROY : READ_EXIT;
        round_run(transports, MSG_NONE, r, mode);
        round_run(transports, MSG_SMALL, r, mode);
        round_run(transports, MSG_LARGE, r, mode);
    }
}

static void
reader_exits_tcp(void)
{
    reader_exits("tcp");
}

static void
reader_exits_shm(void)
{
    reader_exits("tcp,shm");
}

// Bob exits without reading the cma tensor: alice's write fails, naming
// bob.
static void
unread_fails(void)
{
    need_cma();
    for (unsigned r = 0; r < 10; r++) {
        round_run(r % 2 ? "tcp,shm" : "tcp", MSG_LARGE, r, NO_READ);
    }
}

static const tp_test_case k_cases[] = {
    TP_TEST_CASE_T(reader_exits_tcp, 120),
    TP_TEST_CASE_T(reader_exits_shm, 120),
    TP_TEST_CASE_T(unread_fails, 60),
};

TP_TEST_MAIN(k_cases)
