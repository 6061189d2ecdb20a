// SPDX-License-Identifier: Apache-2.0
// cuda_loop_test.c - the CUDA work of a pipe runs off the context's loop
// thread (pipe_write.c wop_prep, pipe_read.c rop_copy_job): while a CUDA
// tensor's staging copy is held (the fake runtime's copy gate: a GPU still
// busy, a slow copy), the context's other pipes go on; messages keep
// their order; a pipe closed under a held copy completes its write only
// once the copy let go of the user's buffer. Two contexts of one process,
// two pipes between them, channel basic (CUDA tensors staged).

#include "tp_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <tpipe/pipe.h>
#include <unistd.h>

#include "core/platform.h"
#include "cuda_bufs.h"
#include "cuda_env.h"
#include "tp_test_pipe.h"

#define WAIT_MS 20000

// Waits until a copy is held at the gate.
static void
gate_wait_held(void)
{
    uint64_t dl = tp__deadline_after_ms(WAIT_MS);
    while (cuda_env_copy_gate(-1) == 0 && tp__now_ns() < dl) {
        usleep(1000);
    }
    TP_CHECK_EQ(cuda_env_copy_gate(-1), 1);
}

typedef struct two_pipes {
    tp_context *a, *b; // a reads, b writes
    tp_pipe_listener *l;
    tp_pipe *ra[2], *wb[2]; // pipe k: wb[k] (on b) -> ra[k] (on a)
} two_pipes;

static void
two_open(two_pipes *t)
{
    static bool setup; // once per case (each runs in its own process)
    if (!setup) {
        cuda_env_setup();
        setup = true;
    }
    if (!cuda_env_fake()) {
        tp_test_skip("needs the fake runtime (its copy gate)");
    }
    t->a = tp_test_ctx("reader", "tcp", "basic");
    t->b = tp_test_ctx("writer", "tcp", "basic");
    tp_error *err = NULL;
    const char *url = "tcp://127.0.0.1:0";
    TP_CHECK_OK(tp_context_listen(t->a, &url, 1, &t->l, &err), err);
    for (int k = 0; k < 2; k++) {
        TP_CHECK_OK(tp_context_connect(t->b, tp_pipe_listener_addr(t->l, NULL),
                                       &t->wb[k], &err),
                    err);
        t->ra[k] = op_pipe_accept(t->l, WAIT_MS);
        TP_CHECK_OK(tp_pipe_wait_ready(t->wb[k], WAIT_MS, &err), err);
    }
}

static void
two_close(two_pipes *t)
{
    for (int k = 0; k < 2; k++) {
        tp_pipe_unref(t->ra[k]);
        tp_pipe_unref(t->wb[k]);
    }
    tp_pipe_listener_destroy(t->l);
    tp_context_destroy(t->b);
    tp_context_destroy(t->a);
}

// A message of one tensor: @n bytes of pattern @seed on @dev.
static tp_message *
msg_one(tp_device dev, size_t n, unsigned seed, void **base_p)
{
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] =
        (tp_msg_buf){cuda_buf_make(dev, 0, n, seed, base_p), n, dev, false};
    return m;
}

// Frees what msg_one made (@m's tensor on its device, then @m).
static void
msg_free(tp_message *m, void *base)
{
    cuda_buf_free(m->tensors[0].device, base);
    tp_message_destroy(m);
}

// Writes @m on pipe 0 with the fake's gate closed (@timeout_ms: the
// write's own timeout) and waits until its staging copy is held there.
static void
held_write(two_pipes *t, tp_message *m, op *w, int64_t timeout_ms)
{
    TP_CHECK_EQ(cuda_env_copy_gate(1), 0);
    op_init(w, timeout_ms);
    tp_pipe_write(t->wb[0], m, w->aio);
    gate_wait_held();
}

// A CPU message goes both ways of pipe 1 and arrives, in time: the loops
// of both contexts are free.
static void
cpu_round_trip(two_pipes *t, unsigned seed)
{
    void *base;
    tp_message *m = msg_one(cpu, 5000, seed, &base);
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(t->wb[1], m, w.aio);
    tp_message *r = cuda_read_desc(t->ra[1]);
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(t->ra[1], r, &err), err);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    TP_CHECK(cuda_buf_ok(cpu, r->tensors[0].data, 5000, seed));
    tp_message_destroy(r);
    msg_free(m, base);
}

// The writer's staging copy is held: the writer's context still moves
// the other pipe's messages; once the copy goes, the CUDA tensor arrives.
static void
write_staging_off_loop(void)
{
    two_pipes t;
    two_open(&t);
    size_t n = 300000;
    void *base;
    tp_message *m = msg_one(gpu(0), n, 3, &base);
    op w;
    held_write(&t, m, &w, WAIT_MS);
    cpu_round_trip(&t, 4);
    TP_CHECK_EQ(cuda_env_copy_gate(-1), 1); // still held meanwhile
    TP_CHECK(!op_wait_for(&w, 0));
    TP_CHECK_EQ(cuda_env_copy_gate(0), 1);
    tp_message *r = cuda_read_desc(t.ra[0]);
    TP_CHECK(r->tensors[0].device.type == TP_DEVICE_CUDA);
    r->tensors[0].device = cpu;
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(t.ra[0], r, &err), err);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    TP_CHECK(cuda_buf_ok(cpu, r->tensors[0].data, n, 3));
    tp_message_destroy(r);
    msg_free(m, base);
    two_close(&t);
}

// The reader's host-to-device copy is held: the reader's context still
// moves the other pipe's messages; the read completes once the copy went.
static void
read_copy_off_loop(void)
{
    two_pipes t;
    two_open(&t);
    size_t n = 300000;
    void *base;
    tp_message *m = msg_one(cpu, n, 5, &base);
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(t.wb[0], m, w.aio);
    tp_message *r = cuda_read_desc(t.ra[0]);
    r->tensors[0].device = gpu(1); // staged in, then host-to-device
    TP_CHECK_EQ(cuda_env_copy_gate(1), 0);
    op rd;
    op_init(&rd, WAIT_MS);
    tp_pipe_read(t.ra[0], r, rd.aio);
    gate_wait_held();
    cpu_round_trip(&t, 6);
    TP_CHECK(!op_wait_for(&rd, 0)); // not before its copy
    TP_CHECK_EQ(cuda_env_copy_gate(0), 1);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(rd.aio), tp_aio_error(rd.aio));
    op_fini(&rd);
    op_wait(&w, WAIT_MS);
    op_fini(&w);
    TP_CHECK(cuda_buf_ok(gpu(1), r->tensors[0].data, n, 5));
    tp_message_destroy(r);
    msg_free(m, base);
    two_close(&t);
}

// A CPU message written after a CUDA one whose staging is held does not
// overtake it: the reader's first descriptor is the CUDA message's.
static void
order_kept(void)
{
    two_pipes t;
    two_open(&t);
    void *b0, *b1;
    tp_message *m0 = msg_one(gpu(0), 70000, 7, &b0);
    tp_message *m1 = msg_one(cpu, 10, 8, &b1);
    TP_CHECK_EQ(cuda_env_copy_gate(1), 0);
    op w0, w1, d;
    op_init(&w0, WAIT_MS);
    op_init(&w1, WAIT_MS);
    tp_pipe_write(t.wb[0], m0, w0.aio);
    tp_pipe_write(t.wb[0], m1, w1.aio);
    gate_wait_held();
    op_init(&d, WAIT_MS);
    tp_pipe_read_descriptor(t.ra[0], d.aio);
    TP_CHECK(!op_wait_for(&d, 200)); // nothing overtook the held one
    TP_CHECK_EQ(cuda_env_copy_gate(0), 1);
    op_wait(&d, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(d.aio), tp_aio_error(d.aio));
    tp_message *r0 = tp_aio_get_output(d.aio, 0);
    op_fini(&d);
    TP_CHECK(r0->tensors[0].device.type == TP_DEVICE_CUDA);
    TP_CHECK_EQ(r0->tensors[0].len, 70000);
    r0->tensors[0].device = cpu;
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(t.ra[0], r0, &err), err);
    tp_message *r1 = cuda_read_desc(t.ra[0]);
    TP_CHECK_EQ(r1->tensors[0].len, 10);
    TP_CHECK_OK(cuda_read_data(t.ra[0], r1, &err), err);
    op_wait(&w0, WAIT_MS);
    op_wait(&w1, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w0.aio), tp_aio_error(w0.aio));
    TP_CHECK_OK(tp_aio_status(w1.aio), tp_aio_error(w1.aio));
    op_fini(&w0);
    op_fini(&w1);
    TP_CHECK(cuda_buf_ok(cpu, r0->tensors[0].data, 70000, 7));
    TP_CHECK(cuda_buf_ok(cpu, r1->tensors[0].data, 10, 8));
    tp_message_destroy(r0);
    tp_message_destroy(r1);
    msg_free(m0, b0);
    msg_free(m1, b1);
    two_close(&t);
}

// The pipe closes while a write's staging copy is held: the write fails,
// but only once the copy let go of its buffer (the user may free it
// then); nothing leaks (ASan).
static void
close_under_held_copy(void)
{
    two_pipes t;
    two_open(&t);
    void *base;
    tp_message *m = msg_one(gpu(1), 300000, 9, &base);
    op w;
    held_write(&t, m, &w, WAIT_MS);
    tp_pipe_close(t.wb[0]);
    TP_CHECK(!op_wait_for(&w, 200)); // the copy still reads the buffer
    TP_CHECK_EQ(cuda_env_copy_gate(0), 1);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_ECLOSED);
    op_fini(&w);
    msg_free(m, base);
    cpu_round_trip(&t, 10); // the other pipe is untouched
    two_close(&t);
}

// A write times out while its staging copy is held: nothing of it went
// out, so it fails alone (TP_ETIMEDOUT, once the copy let go of its
// buffer) and the pipe goes on: the next write on it arrives, and it is
// the first message the reader sees.
static void
timeout_while_staging(void)
{
    two_pipes t;
    two_open(&t);
    void *b0, *b1;
    tp_message *m0 = msg_one(gpu(0), 300000, 11, &b0);
    tp_message *m1 = msg_one(cpu, 100, 12, &b1);
    TP_CHECK_EQ(cuda_env_copy_gate(1), 0);
    op w0;
    op_init(&w0, 100); // the write's own timeout
    tp_pipe_write(t.wb[0], m0, w0.aio);
    gate_wait_held();
    TP_CHECK(!op_wait_for(&w0, 400)); // timed out, but the copy reads on
    TP_CHECK_EQ(cuda_env_copy_gate(0), 1);
    op_wait(&w0, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w0.aio), TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w0.aio)),
                          "write timed out");
    op_fini(&w0);
    op w1;
    op_init(&w1, WAIT_MS);
    tp_pipe_write(t.wb[0], m1, w1.aio);
    tp_message *r = tp_test_read_desc(t.ra[0], WAIT_MS);
    TP_CHECK_EQ(r->tensors[0].len, 100);
    TP_CHECK(r->tensors[0].device.type == TP_DEVICE_CPU);
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(t.ra[0], r, &err), err);
    op_wait(&w1, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w1.aio), tp_aio_error(w1.aio));
    op_fini(&w1);
    TP_CHECK(cuda_buf_ok(cpu, r->tensors[0].data, 100, 12));
    tp_message_destroy(r);
    msg_free(m0, b0);
    msg_free(m1, b1);
    two_close(&t);
}

// The reader's pipe closes while its host-to-device copy is held: the read
// fails (TP_ECLOSED) only once the copy returned; the other pipe goes on.
static void
read_close_during_copy(void)
{
    two_pipes t;
    two_open(&t);
    void *base;
    tp_message *m = msg_one(cpu, 300000, 13, &base);
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(t.wb[0], m, w.aio);
    tp_message *r = tp_test_read_desc(t.ra[0], WAIT_MS);
    r->tensors[0].device = gpu(0);
    TP_CHECK_EQ(cuda_env_copy_gate(1), 0);
    op rd;
    op_init(&rd, WAIT_MS);
    tp_pipe_read(t.ra[0], r, rd.aio);
    gate_wait_held();
    tp_pipe_close(t.ra[0]);
    TP_CHECK(!op_wait_for(&rd, 200)); // the copy still writes its buffer
    TP_CHECK_EQ(cuda_env_copy_gate(0), 1);
    op_wait(&rd, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(rd.aio), TP_ECLOSED);
    op_fini(&rd);
    op_wait(&w, WAIT_MS);
    op_fini(&w);
    cpu_round_trip(&t, 14);
    tp_message_destroy(r);
    msg_free(m, base);
    two_close(&t);
}

static void *
open_gate_later(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    cuda_env_copy_gate(0);
    return NULL;
}

// The writer's context is destroyed while a staging copy is held: the
// destroy waits for the copy (opened 300 ms later), the write fails with
// TP_ECLOSED, and nothing leaks (ASan).
static void
destroy_during_staging(void)
{
    two_pipes t;
    two_open(&t);
    void *base;
    tp_message *m = msg_one(gpu(1), 300000, 15, &base);
    op w;
    held_write(&t, m, &w, WAIT_MS);
    pthread_t th;
    TP_CHECK(pthread_create(&th, NULL, open_gate_later, NULL) == 0);
    for (int k = 0; k < 2; k++) {
        tp_pipe_unref(t.wb[k]);
    }
    tp_context_destroy(t.b);
    TP_CHECK(pthread_join(th, NULL) == 0);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_ECLOSED);
    op_fini(&w);
    msg_free(m, base);
    for (int k = 0; k < 2; k++) {
        tp_pipe_unref(t.ra[k]);
    }
    tp_pipe_listener_destroy(t.l);
    tp_context_destroy(t.a);
}

// One CUDA tensor of @n bytes from cuda:0 to cuda:1 over pipe 0 (staged
// out and in); *@pool_p / *@loop_p: the pipes' copies on the copy pools
// and on the loop threads.
static void
cuda_round(two_pipes *t, size_t n, long *pool_p, long *loop_p)
{
    void *base;
    tp_message *m = msg_one(gpu(0), n, 21, &base);
    long before[3], after[3];
    TP_CHECK(cuda_env_copy_threads(before));
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(t->wb[0], m, w.aio);
    tp_message *r = tp_test_read_desc(t->ra[0], WAIT_MS);
    r->tensors[0].device = gpu(1);
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(t->ra[0], r, &err), err);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    TP_CHECK(cuda_env_copy_threads(after));
    *pool_p = after[0] - before[0];
    *loop_p = after[1] - before[1];
    TP_CHECK(cuda_buf_ok(gpu(1), r->tensors[0].data, n, 21));
    tp_message_destroy(r);
    msg_free(m, base);
}

// By default both staging copies (device-to-host at the writer,
// host-to-device at the reader) run on the copy pools; with
// TP_PIPE_CUDA_LOOP_MAX, messages up to that size copy on the loop
// threads, larger ones still on the pools.
static void
loop_max_chooses_the_thread(void)
{
    two_pipes t;
    two_open(&t);
    long pool, loop;
    cuda_round(&t, 65536, &pool, &loop);
    TP_CHECK_EQ(pool, 2);
    TP_CHECK_EQ(loop, 0);
    two_close(&t);
    setenv("TP_PIPE_CUDA_LOOP_MAX", "64K", 1);
    two_open(&t);
    unsetenv("TP_PIPE_CUDA_LOOP_MAX");
    cuda_round(&t, 65536, &pool, &loop);
    TP_CHECK_EQ(pool, 0);
    TP_CHECK_EQ(loop, 2);
    cuda_round(&t, 65537, &pool, &loop);
    TP_CHECK_EQ(pool, 2);
    TP_CHECK_EQ(loop, 0);
    two_close(&t);
}

// The contexts keep their page-locked staging buffers
// (TP_PIPE_CUDA_PINNED_CACHE): the same message staged out and in three
// times makes two cudaMallocHost calls, one per context, and those two
// buffers stay until the contexts go. With the cache off, every message
// allocates its two and frees them after.
static void
pinned_buffers_reused(void)
{
    long c[7], pool, loop;
    two_pipes t;
    two_open(&t);
    TP_CHECK(cuda_env_counters(c));
    long live0 = c[1], allocs0 = cuda_env_host_allocs();
    for (int i = 0; i < 3; i++) {
        cuda_round(&t, 300000, &pool, &loop);
        TP_CHECK(cuda_env_counters(c));
        TP_CHECK_EQ(c[1] - live0, 2);
    }
    TP_CHECK_EQ(cuda_env_host_allocs() - allocs0, 2);
    two_close(&t);
    TP_CHECK(cuda_env_counters(c));
    TP_CHECK_EQ(c[1], live0);
    setenv("TP_PIPE_CUDA_PINNED_CACHE", "0", 1);
    two_open(&t);
    unsetenv("TP_PIPE_CUDA_PINNED_CACHE");
    allocs0 = cuda_env_host_allocs();
    for (int i = 0; i < 2; i++) {
        cuda_round(&t, 300000, &pool, &loop);
    }
    TP_CHECK_EQ(cuda_env_host_allocs() - allocs0, 4);
    TP_CHECK_EQ(cuda_env_pinned_settle(live0, WAIT_MS), live0);
    two_close(&t);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(write_staging_off_loop, 60),
    TP_TEST_CASE_T(read_copy_off_loop, 60),
    TP_TEST_CASE_T(order_kept, 60),
    TP_TEST_CASE_T(close_under_held_copy, 60),
    TP_TEST_CASE_T(timeout_while_staging, 60),
    TP_TEST_CASE_T(read_close_during_copy, 60),
    TP_TEST_CASE_T(destroy_during_staging, 60),
    TP_TEST_CASE_T(loop_max_chooses_the_thread, 60),
    TP_TEST_CASE_T(pinned_buffers_reused, 60),
};

TP_TEST_MAIN(cases)
