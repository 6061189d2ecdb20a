// SPDX-License-Identifier: Apache-2.0
// pipe_harness_test.c - the pipe tests' helpers (tests/harness/
// tp_test_pipe.h) do what the tests rely on: a line goes down to a forked
// peer and up from one; a peer that fails, is killed or outlives its
// deadline fails the waiting process; a line that never comes, or an end
// of file, gives up in time; a pipe pair carries a message both ways.

#include "tp_test.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/pipe.h>

#include "core/platform.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

#define WAIT_MS 20000

static void
child_expect_line(tp_test_peer *self, void *arg)
{
    char line[64];
    if (!tp_test_peer_recv(self, line, sizeof(line), WAIT_MS)) {
        _exit(5);
    }
    _exit(strcmp(line, arg) == 0 ? 0 : 6);
}

static void
child_send_line(tp_test_peer *self, void *arg)
{
    tp_test_peer_send(self, arg);
}

static void
child_exit_code(tp_test_peer *self, void *arg)
{
    (void)self;
    _exit(*(const int *)arg);
}

static void
child_hang(tp_test_peer *self, void *arg)
{
    (void)self;
    (void)arg;
    for (;;) {
        pause();
    }
}

// Waits for a grandchild that exits with the code *@arg: the child itself
// must fail (exit 1) unless that code is 0.
static void
child_waits_for(tp_test_peer *self, void *arg)
{
    (void)self;
    tp_test_peer inner;
    tp_test_peer_fork(&inner, "inner", TP_TEST_PEER_DOWN, child_exit_code, arg);
    tp_test_peer_wait(&inner, WAIT_MS);
}

// Waits 100 ms for a grandchild that never exits.
static void
child_waits_for_hang(tp_test_peer *self, void *arg)
{
    (void)self;
    (void)arg;
    tp_test_peer inner;
    tp_test_peer_fork(&inner, "inner", TP_TEST_PEER_DOWN, child_hang, NULL);
    tp_test_peer_wait(&inner, 100);
}

static int
exit_code(int status)
{
    TP_CHECKF(WIFEXITED(status), "status 0x%x: not an exit", (unsigned)status);
    return WEXITSTATUS(status);
}

static void
line_down_and_up(void)
{
    tp_test_peer down, up;
    tp_test_peer_fork(&down, "down", TP_TEST_PEER_DOWN, child_expect_line,
                      "tcp://127.0.0.1:4242");
    tp_test_peer_fork(&up, "up", TP_TEST_PEER_UP, child_send_line, "shm://abc");
    tp_test_peer_send(&down, "tcp://127.0.0.1:4242");
    TP_CHECK_EQ(down.fd, -1);
    char line[64];
    TP_CHECK(tp_test_peer_recv(&up, line, sizeof(line), WAIT_MS));
    TP_CHECK(strcmp(line, "shm://abc") == 0);
    TP_CHECK_EQ(up.fd, -1);
    tp_test_peer_wait(&down, WAIT_MS);
    tp_test_peer_wait(&up, WAIT_MS);
}

// A line too long for the buffer is not taken for a shorter one.
static void
line_too_long_refused(void)
{
    tp_test_peer up;
    tp_test_peer_fork(&up, "up", TP_TEST_PEER_UP, child_send_line,
                      "tcp://127.0.0.1:4242");
    char line[8];
    TP_CHECK(!tp_test_peer_recv(&up, line, sizeof(line), WAIT_MS));
    TP_CHECK_EQ(line[0], '\0');
    tp_test_peer_wait(&up, WAIT_MS);
}

// No line: at the deadline from a peer that holds its end open, at once
// from one that exits.
static void
recv_gives_up(void)
{
    tp_test_peer hang, gone;
    tp_test_peer_fork(&hang, "hang", TP_TEST_PEER_UP, child_hang, NULL);
    static const int zero = 0;
    tp_test_peer_fork(&gone, "gone", TP_TEST_PEER_UP, child_exit_code,
                      (void *)&zero);
    char line[64];
    uint64_t t0 = tp__now_ns();
    TP_CHECK(!tp_test_peer_recv(&hang, line, sizeof(line), 200));
    uint64_t ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(ms >= 150 && ms < 10000, "gave up after %llu ms",
              (unsigned long long)ms);
    TP_CHECK(!tp_test_peer_recv(&gone, line, sizeof(line), WAIT_MS));
    tp_test_peer_wait(&gone, WAIT_MS);
    tp_test_peer_kill(&hang);
    TP_CHECK_EQ(hang.pid, 0);
}

// tp_test_peer_wait fails the process that waits unless the peer exited
// 0, and kills a peer past its deadline.
static void
wait_checks_the_exit(void)
{
    static const int codes[] = {0, 3, 77};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        tp_test_peer outer;
        tp_test_peer_fork(&outer, "outer", TP_TEST_PEER_DOWN, child_waits_for,
                          (void *)&codes[i]);
        TP_CHECK_EQ(exit_code(tp_test_peer_wait_status(&outer, WAIT_MS)),
                    codes[i] == 0 ? 0 : 1);
    }
    tp_test_peer outer;
    uint64_t t0 = tp__now_ns();
    tp_test_peer_fork(&outer, "outer", TP_TEST_PEER_DOWN, child_waits_for_hang,
                      NULL);
    TP_CHECK_EQ(exit_code(tp_test_peer_wait_status(&outer, WAIT_MS)), 1);
    uint64_t ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(ms < 10000, "the 100 ms wait took %llu ms",
              (unsigned long long)ms);
    // A peer killed by a signal.
    tp_test_peer hang;
    tp_test_peer_fork(&hang, "hang", TP_TEST_PEER_DOWN, child_hang, NULL);
    TP_CHECK(kill(hang.pid, SIGTERM) == 0);
    int st = tp_test_peer_wait_status(&hang, WAIT_MS);
    TP_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
}

// A pair of one process carries a message both ways.
static void
pair_round_trip(void)
{
    tp_test_pair pr;
    tp_context *a = tp_test_ctx("alice", "tcp", "basic");
    tp_context *b = tp_test_ctx("bob", "tcp", "basic");
    tp_test_pair_open(&pr, a, b, "tcp://127.0.0.1:0", WAIT_MS);
    TP_CHECK(pr.a == a && pr.b == b && pr.l != NULL);
    TP_CHECK(strcmp(tp_pipe_channel(pr.pa), "basic") == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pr.pb), "basic") == 0);
    tp_pipe *ends[2][2] = {{pr.pb, pr.pa}, {pr.pa, pr.pb}};
    for (int i = 0; i < 2; i++) {
        char meta[] = "hello";
        tp_message *m = NULL;
        TP_CHECK_OK(tp_message_create(0, 0, &m), NULL);
        m->metadata = meta;
        m->metadata_len = 5;
        op w;
        op_init(&w, WAIT_MS);
        tp_pipe_write(ends[i][0], m, w.aio);
        tp_message *r = tp_test_read_desc(ends[i][1], WAIT_MS);
        TP_CHECK_EQ(r->metadata_len, 5);
        TP_CHECK(memcmp(r->metadata, "hello", 5) == 0);
        op rd;
        op_init(&rd, WAIT_MS);
        tp_pipe_read(ends[i][1], r, rd.aio);
        op_wait(&rd, WAIT_MS);
        TP_CHECK_OK(tp_aio_status(rd.aio), tp_aio_error(rd.aio));
        op_fini(&rd);
        op_wait(&w, WAIT_MS);
        TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
        op_fini(&w);
        tp_message_destroy(r);
        m->metadata = NULL;
        m->metadata_len = 0;
        tp_message_destroy(m);
    }
    tp_test_pair_close(&pr);
    TP_CHECK(pr.a == NULL && pr.pa == NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(line_down_and_up), TP_TEST_CASE(line_too_long_refused),
    TP_TEST_CASE(recv_gives_up),    TP_TEST_CASE(wait_checks_the_exit),
    TP_TEST_CASE(pair_round_trip),
};

TP_TEST_MAIN(cases)
