// SPDX-License-Identifier: Apache-2.0
// pipe_test_errors.c - pipe_test's cases on close and failure within one
// process: pending operations on close, a read timeout, contexts destroyed
// with operations pending, bad user input, options naming unknown
// backends, and no channel in common.

#include "tp_test.h"

#include <tpipe/pipe.h>

#include "pipe_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

// Closing a pipe fails its pending reads and writes, each once, and the
// other end sees the pipe fail; another pipe of the same contexts works.
void
test_close_pending(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    // A second pipe between the same contexts.
    tp_pipe *pc = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_context_connect(pr.b, tp_pipe_listener_addr(pr.l, NULL), &pc, &err),
        err);
    tp_pipe *pd = op_pipe_accept(pr.l, WAIT_MS);

    op rd[3];
    for (int i = 0; i < 3; i++) {
        op_init(&rd[i], WAIT_MS);
        tp_pipe_read_descriptor(pr.pb, rd[i].aio);
    }
    op peer_rd;
    op_init(&peer_rd, WAIT_MS);
    tp_pipe_read_descriptor(pr.pa, peer_rd.aio);
    tp_pipe_close(pr.pb);
    for (int i = 0; i < 3; i++) {
        op_wait(&rd[i], WAIT_MS);
        TP_CHECK_EQ(tp_aio_status(rd[i].aio), TP_ECLOSED);
        op_fini(&rd[i]);
    }
    op_wait(&peer_rd, WAIT_MS);
    TP_CHECK(tp_aio_status(peer_rd.aio) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(peer_rd.aio)), "bob");
    op_fini(&peer_rd);
    // A write after close fails at once with the same error.
    uint64_t one = 10;
    tp_message *m = make_msg(0, NULL, 1, &one, 9);
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_ECLOSED);
    op_fini(&w);
    // The other pipe still works.
    send_recv(pc, pd, m, 0, NULL, 1, &one, 9);
    free_sent(m);
    tp_pipe_unref(pc);
    tp_pipe_unref(pd);
    tp_test_pair_close(&pr);
}

// A descriptor read with a timeout and nothing to read times out without
// hurting the pipe.
void
test_read_timeout_keeps_pipe(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    op rd;
    op_init(&rd, 100);
    tp_pipe_read_descriptor(pr.pa, rd.aio);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(rd.aio), TP_ETIMEDOUT);
    op_fini(&rd);
    uint64_t sz = 1000;
    tp_message *m = make_msg(0, NULL, 1, &sz, 3);
    send_recv(pr.pb, pr.pa, m, 0, NULL, 1, &sz, 3);
    free_sent(m);
    tp_test_pair_close(&pr);
}

// Destroying contexts with pipes and operations pending completes them.
void
test_destroy_with_pending(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    op rd;
    op_init(&rd, 0);
    tp_pipe_read_descriptor(pr.pa, rd.aio);
    tp_context_destroy(pr.a);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(rd.aio), TP_ECLOSED);
    op_fini(&rd);
    tp_pipe_unref(pr.pa);
    tp_pipe_unref(pr.pb);
    tp_pipe_listener_destroy(NULL);
    tp_context_destroy(pr.b);
}

// Bad input from the user: a clear error, the pipe keeps working.
void
test_bad_user_input(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0].len = 10; // data NULL
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)), "tensor 0");
    op_fini(&w);
    // tp_pipe_read without a descriptor.
    op r;
    op_init(&r, WAIT_MS);
    tp_pipe_read(pr.pa, m, r.aio);
    op_wait(&r, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(r.aio), TP_EINVAL);
    op_fini(&r);
    tp_message_destroy(m);
    uint64_t sz = 77;
    tp_message *ok = make_msg(0, NULL, 1, &sz, 4);
    send_recv(pr.pb, pr.pa, ok, 0, NULL, 1, &sz, 4);
    free_sent(ok);
    tp_test_pair_close(&pr);
}

void
test_options_errors(void)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = "tcp,carrier-pigeon";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_context_create(&o, &ctx, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "carrier-pigeon");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "known: shm, tcp");
    tp_error_unref(err);
    err = NULL;
    tp_context_options_init(&o);
    o.channels = "basic,warp";
    TP_CHECK_EQ(tp_context_create(&o, &ctx, &err), TP_EINVAL);
    // Every channel built, best first (cuda_ipc too, with CUDA).
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "(known: xth, ");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "cma, mpt, basic)");
    tp_error_unref(err);
}

// The refusal names why: both ends allow nothing in common.
void
test_no_common_channel(void)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = "tcp";
    o.channels = "basic";
    o.name = "alice";
    tp_context *a = NULL, *b = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&o, &a, &err), err);
    o.channels = "mpt";
    o.name = "bob";
    TP_CHECK_OK(tp_context_create(&o, &b, &err), err);
    const char *url = "tcp://127.0.0.1:0";
    tp_pipe_listener *l = NULL;
    TP_CHECK_OK(tp_context_listen(a, &url, 1, &l, &err), err);
    tp_pipe *p = NULL;
    TP_CHECK_OK(
        tp_context_connect(b, tp_pipe_listener_addr(l, "tcp"), &p, &err), err);
    TP_CHECK(tp_pipe_wait_ready(p, WAIT_MS, &err) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "no channel");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "alice");
    tp_error_unref(err);
    tp_pipe_unref(p);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(b);
    tp_context_destroy(a);
}
