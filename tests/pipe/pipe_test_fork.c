// SPDX-License-Identifier: Apache-2.0
// pipe_test_fork.c - pipe_test's cases across processes (fork): an echo
// peer, and a peer killed mid-message while the listener keeps working.

#include "tp_test.h"

#include <unistd.h>

#include <tpipe/pipe.h>

#include "pipe_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

typedef struct child_job {
    void (*fn)(tp_pipe *p);
} child_job;

// The child: waits for the URL, connects to it, then runs the job.
static void
child_main(tp_test_peer *self, void *arg)
{
    const child_job *job = arg;
    char url[512];
    if (!tp_test_peer_recv(self, url, sizeof(url), WAIT_MS)) {
        _exit(4);
    }
    tp_context *ctx = make_ctx("child");
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    if (tp_context_connect(ctx, url, &p, &err) != TP_OK ||
        tp_pipe_wait_ready(p, WAIT_MS, &err) != TP_OK) {
        fprintf(stderr, "child: %s\n", tp_error_message(err));
        _exit(3);
    }
    job->fn(p);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
}

// Forks a child (before this process starts any thread: TSan does not
// support threads after a multi-threaded fork) that waits for a URL
// (tp_test_peer_send), connects to it, then runs @fn.
static void
spawn_child(tp_test_peer *child, void (*fn)(tp_pipe *p))
{
    child_job job = {fn};
    tp_test_peer_fork(child, "child", TP_TEST_PEER_DOWN, child_main, &job);
}

static void
child_echo(tp_pipe *p)
{
    // Echo messages until the pipe closes.
    for (;;) {
        tp_aio *aio = NULL;
        op rd;
        op_init(&rd, 0);
        aio = rd.aio;
        tp_pipe_read_descriptor(p, aio);
        if (!op_wait_for(&rd, WAIT_MS) || tp_aio_status(aio) != TP_OK) {
            op_fini(&rd);
            return;
        }
        tp_message *m = tp_aio_get_output(aio, 0);
        atomic_store(&rd.done, 0);
        tp_pipe_read(p, m, aio);
        if (!op_wait_for(&rd, WAIT_MS) || tp_aio_status(aio) != TP_OK) {
            op_fini(&rd);
            return;
        }
        atomic_store(&rd.done, 0);
        tp_pipe_write(p, m, aio);
        if (!op_wait_for(&rd, WAIT_MS) || tp_aio_status(aio) != TP_OK) {
            op_fini(&rd);
            return;
        }
        tp_message_destroy(m);
        op_fini(&rd);
    }
}

void
test_cross_process_echo(void)
{
    if (in_process_only()) {
        tp_test_skip("channel xth works only within one process");
    }
    tp_test_peer child;
    spawn_child(&child, child_echo);
    tp_context *ctx = make_ctx("parent");
    tp_pipe_listener *l = make_listener(ctx);
    tp_test_peer_send(&child, tp_pipe_listener_addr(l, NULL));
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    TP_CHECK(strcmp(tp_pipe_channel(p), ch_name()) == 0);
    static const uint64_t sizes[] = {
        0, 1, 64, 4096, 262145, 1 << 20, (64u << 20) + 3};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint64_t psz[1] = {33};
        tp_message *m = make_msg(1, psz, 1, &sizes[i], (uint32_t)i + 1);
        send_recv(p, p, m, 1, psz, 1, &sizes[i], (uint32_t)i + 1);
        free_sent(m);
    }
    tp_pipe_unref(p);
    tp_test_peer_wait(&child, WAIT_MS);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
}

static void
child_read_then_hang(tp_pipe *p)
{
    // Read one descriptor, never the data: the parent's write stays
    // pending until we are killed.
    op rd;
    op_init(&rd, 0);
    tp_pipe_read_descriptor(p, rd.aio);
    (void)op_wait_for(&rd, WAIT_MS);
    pause();
}

// A peer killed while a 64 MiB message is in flight: the write fails
// promptly with an error naming the peer; the listener keeps working.
void
test_peer_killed(void)
{
    if (in_process_only()) {
        tp_test_skip("channel xth works only within one process");
    }
    tp_test_peer hang, echo;
    spawn_child(&hang, child_read_then_hang);
    spawn_child(&echo, child_echo);
    tp_context *ctx = make_ctx("parent");
    tp_pipe_listener *l = make_listener(ctx);
    tp_test_peer_send(&hang, tp_pipe_listener_addr(l, NULL));
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    uint64_t sz = 64u << 20;
    tp_message *m = make_msg(0, NULL, 1, &sz, 5);
    op w;
    op_init(&w, 0);
    tp_pipe_write(p, m, w.aio);
    op rd;
    op_init(&rd, 0);
    tp_pipe_read_descriptor(p, rd.aio);
    usleep(200000);
    tp_test_peer_kill(&hang);
    uint64_t t0 = tp__now_ns();
    op_wait(&w, WAIT_MS);
    op_wait(&rd, WAIT_MS);
    uint64_t ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(ms < 5000, "failure took %llu ms", (unsigned long long)ms);
    TP_CHECK(tp_aio_status(w.aio) != TP_OK);
    TP_CHECK(tp_aio_status(rd.aio) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)), "child");
    op_fini(&w);
    op_fini(&rd);
    free_sent(m);
    tp_pipe_unref(p);
    // The listener still accepts.
    tp_test_peer_send(&echo, tp_pipe_listener_addr(l, NULL));
    p = op_pipe_accept(l, WAIT_MS);
    uint64_t one = 100;
    tp_message *m2 = make_msg(0, NULL, 1, &one, 6);
    send_recv(p, p, m2, 0, NULL, 1, &one, 6);
    free_sent(m2);
    tp_pipe_unref(p);
    tp_test_peer_wait(&echo, WAIT_MS);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
}
