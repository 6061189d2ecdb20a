// SPDX-License-Identifier: Apache-2.0
// cuda_ipc_chan_test.c - the cuda_ipc channel, the pipes' device channel:
// chosen beside the CPU channel when both ends have it; CUDA tensors go
// through it with no host staging, to a CUDA or a host destination,
// across processes (memory handles, a tensor inside a larger allocation)
// and within one (two contexts: the sender's pointer by its token); the
// write completes on the reader's ack; a reader that dies fails the write
// promptly, naming it; a peer without it leaves CUDA tensors staged; the
// info from the peer is checked field by field. Against the fake runtime
// by default (cuda_env.h), the real one with TP_TEST_CUDA=real.

#include <tpipe/pipe.h>
#include <unistd.h>

#include "channel/cuda_ipc/cuda_ipc_impl.h"
#include "core/alloc.h"
#include "core/cuda.h"
#include "cuda_bufs.h"
#include "cuda_env.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

#define WAIT_MS 20000

static void
report_has(tp_pipe *p, const char *needle)
{
    char *rep = tp_pipe_report(p);
    TP_CHECK(rep != NULL);
    TP_CHECK_STR_CONTAINS(rep, needle);
    free(rep);
}

// ---- the info --------------------------------------------------------------

static void
info_round_trip_and_rejects(void)
{
    tp__cipc_info in = {3,    4242,    UINT64_C(0x1122334455667788),
                        4096, 1 << 20, {0}};
    for (unsigned i = 0; i < TP_CUDA_IPC_HANDLE_LEN; i++) {
        in.ci_handle[i] = (uint8_t)(i * 7 + 1);
    }
    tp__chan_info ci;
    memset(&ci, 0, sizeof(ci));
    tp__cipc_info_encode(&in, &ci);
    TP_CHECK_EQ(ci.ci_len, 96);
    tp__cipc_info out;
    char why[160];
    TP_CHECK(
        tp__cipc_info_decode(&ci, (1 << 20) - 4096, &out, why, sizeof(why)));
    TP_CHECK(memcmp(&in, &out, sizeof(in)) == 0);
    // One byte past the allocation; an offset past it; a wrapping length.
    TP_CHECK(
        !tp__cipc_info_decode(&ci, (1 << 20) - 4095, &out, why, sizeof(why)));
    TP_CHECK_STR_CONTAINS(why, "1044481 bytes at offset 4096 pass the end of "
                               "their allocation (1048576 bytes)");
    in.ci_offset = (1 << 20) + 1;
    tp__cipc_info_encode(&in, &ci);
    TP_CHECK(!tp__cipc_info_decode(&ci, 0, &out, why, sizeof(why)));
    in.ci_offset = 16;
    tp__cipc_info_encode(&in, &ci);
    TP_CHECK(
        !tp__cipc_info_decode(&ci, UINT64_MAX - 8, &out, why, sizeof(why)));
    // Every shorter length, a longer one, a version, the reserved field.
    tp__cipc_info_encode(&in, &ci);
    for (unsigned n = 0; n < 96; n++) {
        ci.ci_len = (uint8_t)n;
        TP_CHECK(!tp__cipc_info_decode(&ci, 1, &out, why, sizeof(why)));
        TP_CHECK_STR_CONTAINS(why, "info bytes, expected 96");
    }
    ci.ci_len = 97;
    TP_CHECK(!tp__cipc_info_decode(&ci, 1, &out, why, sizeof(why)));
    ci.ci_len = 96;
    ci.ci_bytes[0] = 2;
    TP_CHECK(!tp__cipc_info_decode(&ci, 1, &out, why, sizeof(why)));
    TP_CHECK_STR_CONTAINS(why, "info version 2 reserved 0x0000 (want 1, 0)");
    ci.ci_bytes[0] = 1;
    ci.ci_bytes[3] = 0x80;
    TP_CHECK(!tp__cipc_info_decode(&ci, 1, &out, why, sizeof(why)));
    TP_CHECK_STR_CONTAINS(why, "reserved 0x8000");
}

// ---- across processes ------------------------------------------------------

// A writer process and this reader, across a fork: the child loads the
// runtime (a real one cannot cross a fork), makes its context (so cuda_ipc
// is viable there), connects to the reader's listener, runs @write on its
// pipe and exits 0; this process does the same on its side and accepts.
typedef struct xp {
    tp_test_peer x_writer;
    tp_context *x_ctx;
    tp_pipe_listener *x_l;
    tp_pipe *x_p; // the reader's end
} xp;

typedef struct xp_job {
    void (*write)(tp_pipe *p);
} xp_job;

static void
xp_writer(tp_test_peer *self, void *arg)
{
    const xp_job *job = arg;
    char url[256];
    if (!tp_test_peer_recv(self, url, sizeof(url), WAIT_MS)) {
        _exit(3);
    }
    cuda_env_setup();
    tp_context *ctx = tp_test_ctx("writer", "tcp", NULL);
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url, &p, &err), err);
    job->write(p);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
}

static void
xp_start(xp *x, void (*write)(tp_pipe *p))
{
    xp_job job = {write};
    tp_test_peer_fork(&x->x_writer, "writer", TP_TEST_PEER_DOWN, xp_writer,
                      &job);
    cuda_env_setup();
    x->x_ctx = tp_test_ctx("reader", "tcp", NULL);
    tp_error *err = NULL;
    const char *lo = "tcp://127.0.0.1:0";
    TP_CHECK_OK(tp_context_listen(x->x_ctx, &lo, 1, &x->x_l, &err), err);
    tp_test_peer_send(&x->x_writer, tp_pipe_listener_addr(x->x_l, NULL));
    x->x_p = op_pipe_accept(x->x_l, WAIT_MS);
}

// The writer exited 0; the reader's end goes.
static void
xp_finish(xp *x)
{
    tp_test_peer_wait(&x->x_writer, WAIT_MS);
    tp_pipe_unref(x->x_p);
    tp_pipe_listener_destroy(x->x_l);
    tp_context_destroy(x->x_ctx);
}

static void
write_one(tp_pipe *p, tp_message *m)
{
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(p, m, w.aio);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
}

enum { XP_N = (2 << 20) + 3, XP_OFF = 4096 + 7 };

// Three tensors: from the last device at an offset inside its allocation,
// from cuda:0 (3 bytes), from the host; none staged at the writer.
static void
xp_write3(tp_pipe *p)
{
    int last = tp__cuda_device_count() - 1;
    void *b0, *b1, *b2;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 3, &m), NULL);
    m->tensors[0] = (tp_msg_buf){cuda_buf_make(gpu(last), XP_OFF, XP_N, 1, &b0),
                                 XP_N, gpu(last), false};
    m->tensors[1] =
        (tp_msg_buf){cuda_buf_make(gpu(0), 0, 3, 2, &b1), 3, gpu(0), false};
    m->tensors[2] =
        (tp_msg_buf){cuda_buf_make(cpu, 0, 70000, 3, &b2), 70000, cpu, false};
    long before[7], after[7], xb[4], xa[4];
    bool counted = cuda_env_counters(before) && cuda_env_ipc_counters(xb);
    write_one(p, m);
    if (counted) {
        cuda_env_counters(after);
        cuda_env_ipc_counters(xa);
        // No staging: no device-to-host copy, no pinned buffer.
        TP_CHECK_EQ(after[3], before[3]);
        TP_CHECK_EQ(after[1], before[1]);
        // Each CUDA tensor's handle asked for once (accepts, then send).
        TP_CHECK_EQ(xa[3] - xb[3], 2);
    }
    report_has(p, "cuda tensors by cuda_ipc");
    cuda_buf_free(gpu(last), b0);
    cuda_buf_free(gpu(0), b1);
    cuda_buf_free(cpu, b2);
    tp_message_destroy(m);
}

static void
ipc_cross_process(void)
{
    xp x;
    xp_start(&x, xp_write3);
    tp_pipe *p = x.x_p;
    tp_error *err = NULL;
    report_has(p, "channel cuda_ipc: chosen for cuda tensors");
    tp_message *r = cuda_read_desc(p);
    TP_CHECK_EQ(r->ntensors, 3);
    int last = tp__cuda_device_count() - 1;
    TP_CHECK_EQ(r->tensors[0].device.index, last);
    r->tensors[0].device = gpu(0);    // CUDA -> CUDA, by the handle
    r->tensors[1].device = cpu;       // CUDA -> host, by the handle
    r->tensors[2].device = gpu(last); // host -> CUDA: staged
    long before[7], after[7], sb[4], sa[4];
    bool counted = cuda_env_counters(before) && cuda_env_ipc_counters(sb);
    TP_CHECK_OK(cuda_read_data(p, r, &err), err);
    if (counted) {
        cuda_env_counters(after);
        cuda_env_ipc_counters(sa);
        // The copies into a device have finished before the read completes
        // (cudaMemcpy returns before a device-to-device copy is done).
        TP_CHECK_EQ(sa[2] - sb[2], 2);        // d2d and h2d: waited for
        TP_CHECK_EQ(after[4] - before[4], 1); // d2d: tensor 0
        TP_CHECK_EQ(after[3] - before[3], 1); // d2h: tensor 1
        TP_CHECK_EQ(after[2] - before[2], 1); // h2d: tensor 2's staging
        // Tensor 2's page-locked staging buffer is kept by the context
        // for the next message (TP_PIPE_CUDA_PINNED_CACHE), no other.
        // (Not kept, it would be freed on the pool within the wait.)
        TP_CHECK_EQ(cuda_env_pinned_settle(before[1], 300), before[1] + 1);
    }
    TP_CHECK(cuda_buf_ok(gpu(0), r->tensors[0].data, XP_N, 1));
    TP_CHECK(cuda_buf_ok(cpu, r->tensors[1].data, 3, 2));
    TP_CHECK(cuda_buf_ok(gpu(last), r->tensors[2].data, 70000, 3));
    tp_message_destroy(r);
    xp_finish(&x);
}

// The reader: listens, sends its URL up, accepts, reads one descriptor
// and exits holding it.
static void
dying_reader(tp_test_peer *self, void *arg)
{
    (void)arg;
    cuda_env_setup();
    tp_context *ctx = tp_test_ctx("reader", "tcp", NULL);
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    const char *lo = "tcp://127.0.0.1:0";
    TP_CHECK_OK(tp_context_listen(ctx, &lo, 1, &l, &err), err);
    tp_test_peer_send(self, tp_pipe_listener_addr(l, NULL));
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    tp_message *r = cuda_read_desc(p);
    (void)r;
    _exit(0); // dies holding the descriptor
}

// A reader that dies before it reads the data: the write, waiting for its
// ack, fails promptly and names the peer.
static void
ipc_reader_dies(void)
{
    tp_test_peer reader;
    tp_test_peer_fork(&reader, "reader", TP_TEST_PEER_UP, dying_reader, NULL);
    cuda_env_setup();
    char url[256];
    TP_CHECK(tp_test_peer_recv(&reader, url, sizeof(url), WAIT_MS));
    tp_context *ctx = tp_test_ctx("writer", "tcp", NULL);
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url, &p, &err), err);
    void *base;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] = (tp_msg_buf){cuda_buf_make(gpu(0), 0, 1 << 20, 4, &base),
                                 1 << 20, gpu(0), false};
    op w;
    op_init(&w, 10000);
    tp_pipe_write(p, m, w.aio);
    TP_CHECK(op_wait_for(&w, 10000)); // not the 20 s of any deadline
    TP_CHECK(tp_aio_status(w.aio) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)), "reader at");
    fprintf(stderr, "the write: %s\n", tp_error_message(tp_aio_error(w.aio)));
    op_fini(&w);
    tp_test_peer_wait(&reader, WAIT_MS);
    cuda_buf_free(gpu(0), base);
    tp_message_destroy(m);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
}

// The handle cache: the writer sends 3 tensors from one allocation (at
// 3 offsets) and 1 from another, one message each. With TP_CUDA_IPC_CACHE
// (default 64) the reader opens each allocation once and keeps both open
// until its pipe goes; with 0 it opens one per tensor and keeps none.
static void
cache_write(tp_pipe *p)
{
    void *ba, *bb;
    uint8_t *a = cuda_buf_make(gpu(0), 0, 3 * 4096, 11, &ba);
    uint8_t *b = cuda_buf_make(gpu(1), 64, 4096, 12, &bb);
    uint8_t *src[4] = {a, a + 4096, a + 8192, b};
    for (int i = 0; i < 4; i++) {
        tp_message *m = NULL;
        TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
        m->tensors[0] = (tp_msg_buf){src[i], 4096, gpu(i < 3 ? 0 : 1), false};
        write_one(p, m);
        tp_message_destroy(m);
    }
    cuda_buf_free(gpu(0), ba);
    cuda_buf_free(gpu(1), bb);
}

static void
cache_run(const char *cache, long want_opens, long want_live)
{
    setenv("TP_CUDA_IPC_CACHE", cache, 1);
    xp x;
    xp_start(&x, cache_write);
    tp_pipe *p = x.x_p;
    tp_error *err = NULL;
    long before[4], after[4];
    bool counted = cuda_env_ipc_counters(before);
    for (int i = 0; i < 4; i++) {
        tp_message *r = cuda_read_desc(p);
        r->tensors[0].device = gpu(1);
        TP_CHECK_OK(cuda_read_data(p, r, &err), err);
        // The pattern of its allocation, from where the tensor starts.
        uint8_t want[4096], got[4096];
        uint8_t *full = tp__alloc(3 * 4096);
        cuda_fill(full, 3 * 4096, 11);
        if (i < 3) {
            memcpy(want, full + 4096 * i, 4096);
        } else {
            cuda_fill(want, 4096, 12);
        }
        tp__free(full);
        TP_CHECK_OK(tp__cuda_copy(got, -1, r->tensors[0].data, 1, 4096, &err),
                    err);
        TP_CHECKF(memcmp(want, got, 4096) == 0, "message %d: wrong bytes", i);
        tp_message_destroy(r);
    }
    if (counted) {
        cuda_env_ipc_counters(after);
        TP_CHECK_EQ(after[0] - before[0], want_opens);
        TP_CHECK_EQ(after[1] - before[1], want_live);
    }
    xp_finish(&x);
    if (counted) {
        cuda_env_ipc_counters(after);
        TP_CHECK_EQ(after[1] - before[1], 0); // closed with the pipe
    }
}

static void
ipc_handles_cached(void)
{
    cache_run("64", 2, 2);
}

static void
ipc_handles_not_cached(void)
{
    cache_run("0", 4, 0);
}

// ---- one process: two contexts ---------------------------------------------

static void
pair_open(tp_test_pair *pr, const char *b_channels)
{
    tp_context *a = tp_test_ctx("alice", "tcp", NULL);
    tp_context *b = tp_test_ctx("bob", "tcp", b_channels);
    tp_test_pair_open(pr, a, b, "tcp://127.0.0.1:0", WAIT_MS);
}

// The runtime cannot open a handle of its own process: the receiver finds
// the sender's pointer by its token. The write completes only once the
// reader copied (its ack).
static void
ipc_same_process_and_ack(void)
{
    cuda_env_setup();
    if (tp__cuda_device_count() < 2) {
        tp_test_skip("needs 2 CUDA devices");
    }
    tp_test_pair pr;
    pair_open(&pr, NULL);
    report_has(pr.pb, "cuda tensors by cuda_ipc");
    void *base;
    size_t n = (1 << 20) + 11;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] =
        (tp_msg_buf){cuda_buf_make(gpu(1), 512, n, 7, &base), n, gpu(1), false};
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    tp_message *r = cuda_read_desc(pr.pa);
    TP_CHECK(!op_wait_for(&w, 300)); // no ack before the read
    r->tensors[0].device = gpu(0);
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(pr.pa, r, &err), err);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    TP_CHECK(cuda_buf_ok(gpu(0), r->tensors[0].data, n, 7));
    tp_message_destroy(r);
    cuda_buf_free(gpu(1), base);
    tp_message_destroy(m);
    tp_test_pair_close(&pr);
}

// A reader in the writer's own process whose copy hangs (held at the
// fake's gate) when the writer's pipe closes: the write completes once
// TP_CUDA_IPC_READER_WAIT_MS passed, with the copy still held, rather than
// holding the writer's loop thread until the copy returns; the copy then
// frees the table entry the send left it (ASan: no leak, no use after
// free).
static void
ipc_same_process_hung_reader(void)
{
    if (!cuda_env_fake()) {
        tp_test_skip("needs the fake runtime (its copy gate)");
    }
    cuda_env_setup();
    setenv("TP_CUDA_IPC_READER_WAIT_MS", "200", 1);
    tp_test_pair pr;
    pair_open(&pr, NULL);
    unsetenv("TP_CUDA_IPC_READER_WAIT_MS");
    report_has(pr.pb, "cuda tensors by cuda_ipc");
    void *base;
    size_t n = 70000;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] =
        (tp_msg_buf){cuda_buf_make(gpu(1), 64, n, 9, &base), n, gpu(1), false};
    op w, rd;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    tp_message *r = cuda_read_desc(pr.pa);
    r->tensors[0].device = gpu(0);
    TP_CHECK_EQ(cuda_env_copy_gate(1), 0);
    op_init(&rd, WAIT_MS);
    tp_pipe_read(pr.pa, r, rd.aio);
    uint64_t dl = tp__deadline_after_ms(WAIT_MS);
    while (cuda_env_copy_gate(-1) == 0 && tp__now_ns() < dl) {
        usleep(1000);
    }
    TP_CHECK_EQ(cuda_env_copy_gate(-1), 1); // the reader's copy is held
    tp_pipe_close(pr.pb);
    TP_CHECK(op_wait_for(&w, WAIT_MS)); // not held by the copy
    TP_CHECK(tp_aio_status(w.aio) != TP_OK);
    TP_CHECK_EQ(cuda_env_copy_gate(-1), 1); // the copy was still held
    TP_CHECK_EQ(cuda_env_copy_gate(0), 1);
    op_wait(&rd, WAIT_MS);
    op_fini(&rd);
    op_fini(&w);
    tp_message_destroy(r);
    cuda_buf_free(gpu(1), base);
    tp_message_destroy(m);
    tp_test_pair_close(&pr);
}

// Memory cuda_ipc cannot share (the fake's FAKE_CUDA_NO_IPC_EXPORT, as
// VMM allocations): that tensor is staged through host memory beside the
// device channel, the write and the read succeed, the pipe keeps its
// device channel.
static void
ipc_unshareable_memory_staged(void)
{
    if (!cuda_env_fake()) {
        tp_test_skip("needs the fake runtime (FAKE_CUDA_NO_IPC_EXPORT)");
    }
    cuda_env_setup();
    tp_test_pair pr;
    pair_open(&pr, NULL);
    report_has(pr.pb, "cuda tensors by cuda_ipc");
    setenv("FAKE_CUDA_NO_IPC_EXPORT", "1", 1);
    void *b0, *b1;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 2, &m), NULL);
    m->tensors[0] = (tp_msg_buf){cuda_buf_make(gpu(0), 0, 300000, 13, &b0),
                                 300000, gpu(0), false};
    m->tensors[1] =
        (tp_msg_buf){cuda_buf_make(gpu(1), 0, 7, 14, &b1), 7, gpu(1), false};
    long before[7], after[7];
    TP_CHECK(cuda_env_counters(before));
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    tp_message *r = cuda_read_desc(pr.pa);
    r->tensors[0].device = gpu(1);
    r->tensors[1].device = cpu;
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(pr.pa, r, &err), err);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    TP_CHECK(cuda_env_counters(after));
    TP_CHECK_EQ(after[3] - before[3], 2); // both staged out
    TP_CHECK_EQ(after[2] - before[2], 1); // tensor 0 staged in
    TP_CHECK_EQ(after[4] - before[4], 0); // no device-to-device copy
    unsetenv("FAKE_CUDA_NO_IPC_EXPORT");
    TP_CHECK(cuda_buf_ok(gpu(1), r->tensors[0].data, 300000, 13));
    TP_CHECK(cuda_buf_ok(cpu, r->tensors[1].data, 7, 14));
    tp_message_destroy(r);
    cuda_buf_free(gpu(0), b0);
    cuda_buf_free(gpu(1), b1);
    tp_message_destroy(m);
    tp_test_pair_close(&pr);
}

// One end without cuda_ipc: no device channel, CUDA tensors staged (a
// device-to-host copy at the writer), the bytes arrive all the same.
static void
ipc_staged_when_peer_lacks_it(void)
{
    cuda_env_setup();
    tp_test_pair pr;
    pair_open(&pr, "basic");
    char *rep = tp_pipe_report(pr.pa);
    TP_CHECK(rep != NULL);
    TP_CHECK(strstr(rep, "cuda tensors by") == NULL);
    TP_CHECK_STR_CONTAINS(rep, "channel cuda_ipc: the peer does not offer it");
    free(rep);
    void *base;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] = (tp_msg_buf){cuda_buf_make(gpu(0), 0, 5000, 8, &base), 5000,
                                 gpu(0), false};
    long before[7], after[7];
    bool counted = cuda_env_counters(before);
    op w;
    op_init(&w, WAIT_MS);
    tp_pipe_write(pr.pb, m, w.aio);
    tp_message *r = cuda_read_desc(pr.pa);
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(pr.pa, r, &err), err);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    if (counted) {
        cuda_env_counters(after);
        TP_CHECK_EQ(after[3] - before[3], 1); // staged device-to-host
    }
    TP_CHECK(cuda_buf_ok(gpu(0), r->tensors[0].data, 5000, 8));
    tp_message_destroy(r);
    cuda_buf_free(gpu(0), base);
    tp_message_destroy(m);
    tp_test_pair_close(&pr);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(info_round_trip_and_rejects),
    TP_TEST_CASE_T(ipc_cross_process, 60),
    TP_TEST_CASE_T(ipc_reader_dies, 60),
    TP_TEST_CASE_T(ipc_handles_cached, 60),
    TP_TEST_CASE_T(ipc_handles_not_cached, 60),
    TP_TEST_CASE_T(ipc_same_process_and_ack, 60),
    TP_TEST_CASE_T(ipc_same_process_hung_reader, 60),
    TP_TEST_CASE_T(ipc_staged_when_peer_lacks_it, 60),
    TP_TEST_CASE_T(ipc_unshareable_memory_staged, 60),
};

TP_TEST_MAIN(cases)
