// SPDX-License-Identifier: Apache-2.0
// cuda_pipe_test.c - CUDA tensors through pipes (the cuda_basic path:
// staging through host memory on the CPU channel), for every device pair
// (CUDA->CUDA, CPU->CUDA, CUDA->CPU) over each CPU channel usable here,
// small (inline) and large (channel) tensors, and the refusals. Against
// the fake runtime by default (cuda_env.h), against the real one with
// TP_TEST_CUDA=real (the *_gpu test).

#include <tpipe/pipe.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/cuda.h"
#include "cuda_bufs.h"
#include "cuda_env.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

#define WAIT_MS 20000

// A pipe over tcp with channel @ch; false if @ch is not usable here.
static bool
pair_open(tp_test_pair *pr, const char *ch)
{
    memset(pr, 0, sizeof(*pr));
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = "tcp";
    o.channels = ch;
    tp_error *err = NULL;
    o.name = "alice";
    tp_context *a = NULL;
    if (tp_context_create(&o, &a, &err) != TP_OK) {
        tp_error_unref(err);
        return false;
    }
    tp_context *b = tp_test_ctx("bob", "tcp", ch);
    char *rep = tp_context_report(a);
    char line[64];
    snprintf(line, sizeof(line), "channel %s: usable", ch);
    bool ok = strstr(rep, line) != NULL;
    free(rep);
    if (!ok) {
        tp_context_destroy(a);
        tp_context_destroy(b);
        return false;
    }
    tp_test_pair_open(pr, a, b, "tcp://127.0.0.1:0", WAIT_MS);
    TP_CHECK_STR_CONTAINS(tp_pipe_channel(pr->pb), ch);
    return true;
}

// A buffer of @n bytes with pattern @seed on @dev (its own allocation).
static void *
make_buf(tp_device dev, size_t n, unsigned seed)
{
    void *base;
    return cuda_buf_make(dev, 0, n, seed, &base);
}

static void
write_async(tp_pipe *p, tp_message *m, op *w)
{
    op_init(w, WAIT_MS);
    tp_pipe_write(p, m, w->aio);
}

// One message of 3 tensors (4 bytes: inline on every channel; 100 KiB
// and 1 MiB + 3: on the channel where it has one) from @src on the
// connecting side to @dst on the accepting side, once into buffers the
// pipe allocates and once into the reader's own.
static void
send_pair(tp_test_pair *pr, tp_device src, tp_device dst)
{
    static const size_t sz[3] = {4, 100 << 10, (1 << 20) + 3};
    for (int own = 0; own < 2; own++) {
        tp_message *m = NULL;
        TP_CHECK_OK(tp_message_create(1, 3, &m), NULL);
        char meta[] = "cuda";
        m->metadata = meta;
        m->metadata_len = 4;
        uint8_t pay[16];
        cuda_fill(pay, sizeof(pay), 99);
        m->payloads[0] = (tp_msg_buf){pay, sizeof(pay), cpu, false};
        for (int i = 0; i < 3; i++) {
            m->tensors[i] = (tp_msg_buf){make_buf(src, sz[i], (unsigned)i),
                                         sz[i], src, false};
        }
        op w;
        write_async(pr->pb, m, &w);
        tp_message *r = cuda_read_desc(pr->pa);
        TP_CHECK_EQ(r->ntensors, 3);
        void *mine[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) {
            // The descriptor says where the tensor comes from.
            TP_CHECK_EQ(r->tensors[i].device.type, src.type);
            TP_CHECK_EQ(r->tensors[i].device.index, src.index);
            TP_CHECK_EQ(r->tensors[i].len, sz[i]);
            r->tensors[i].device = dst;
            if (own) {
                mine[i] = make_buf(dst, sz[i], 200);
                r->tensors[i].data = mine[i];
            }
        }
        tp_error *err = NULL;
        TP_CHECK_OK(cuda_read_data(pr->pa, r, &err), err);
        op_wait(&w, WAIT_MS);
        TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
        op_fini(&w);
        TP_CHECK(memcmp(r->payloads[0].data, pay, sizeof(pay)) == 0);
        for (int i = 0; i < 3; i++) {
            TP_CHECKF(cuda_buf_ok(dst, r->tensors[i].data, sz[i], (unsigned)i),
                      "tensor %d (%zu bytes) from %s:%d to %s:%d differs", i,
                      sz[i], src.type ? "cuda" : "cpu", src.index,
                      dst.type ? "cuda" : "cpu", dst.index);
            TP_CHECK_EQ(r->tensors[i].pipe_owned, !own);
            cuda_buf_free(src, m->tensors[i].data);
            cuda_buf_free(dst, mine[i]);
        }
        tp_message_destroy(r); // frees the pipe's device buffers
        m->metadata = NULL;
        m->metadata_len = 0;
        tp_message_destroy(m);
    }
}

// Nothing the pipe allocated on a device or in pinned memory is left.
static void
check_fake_leaks(long dev_before)
{
    long c[7];
    if (cuda_env_counters(c)) {
        TP_CHECK_EQ(c[0], dev_before);
        TP_CHECK_EQ(cuda_env_pinned_settle(0, WAIT_MS), 0); // freed on the pool
    }
}

static void
device_matrix_each_channel(void)
{
    cuda_env_setup();
    static const char *const chans[] = {"basic", "cma", "mpt", "xth"};
    int ran = 0;
    for (size_t c = 0; c < sizeof(chans) / sizeof(chans[0]); c++) {
        tp_test_pair pr;
        if (!pair_open(&pr, chans[c])) {
            fprintf(stderr, "channel %s: not usable here, left out\n",
                    chans[c]);
            continue;
        }
        int last = tp__cuda_device_count() - 1;
        send_pair(&pr, gpu(0), gpu(last)); // CUDA -> CUDA
        send_pair(&pr, gpu(0), gpu(0));
        send_pair(&pr, cpu, gpu(last)); // CPU -> CUDA
        send_pair(&pr, gpu(last), cpu); // CUDA -> CPU
        send_pair(&pr, cpu, cpu);
        tp_test_pair_close(&pr);
        ran++;
    }
    TP_CHECK(ran > 0);
    check_fake_leaks(0);
    long cnt[7];
    if (cuda_env_counters(cnt)) {
        // Staged both ways, never device to device; each staging after
        // the source device was synchronised.
        TP_CHECK(cnt[2] > 0 && cnt[3] > 0);
        TP_CHECK(cnt[6] > 0);
    }
}

// A CUDA tensor on a device that does not exist is refused at once, with
// what and why; the pipe goes on.
static void
write_refuses_missing_device(void)
{
    cuda_env_setup();
    tp_test_pair pr;
    TP_CHECK(pair_open(&pr, "basic"));
    uint8_t byte = 1;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] = (tp_msg_buf){&byte, 1, gpu(40), false};
    op w;
    write_async(pr.pb, m, &w);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)),
                          "tensor 0 on cuda:40: no such device");
    op_fini(&w);
    tp_message_destroy(m);
    send_pair(&pr, gpu(0), cpu);
    tp_test_pair_close(&pr);
    check_fake_leaks(0);
}

// A destination device the reader cannot use fails that read (once the
// bytes are in), not the pipe: the next message arrives.
static void
read_to_missing_device_fails_only_the_read(void)
{
    cuda_env_setup();
    tp_test_pair pr;
    TP_CHECK(pair_open(&pr, "basic"));
    static const size_t n = 300 << 10;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 2, &m), NULL);
    m->tensors[0] = (tp_msg_buf){make_buf(gpu(0), n, 1), n, gpu(0), false};
    m->tensors[1] = (tp_msg_buf){make_buf(cpu, 8, 2), 8, cpu, false};
    op w;
    write_async(pr.pb, m, &w);
    tp_message *r = cuda_read_desc(pr.pa);
    r->tensors[0].device = gpu(33);
    tp_error *err = NULL;
    TP_CHECK_EQ(cuda_read_data(pr.pa, r, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "pipe to ");
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "tensor 0 on cuda:33: no such device");
    tp_error_unref(err);
    TP_CHECK(r->tensors[0].data == NULL);
    TP_CHECK(cuda_buf_ok(cpu, r->tensors[1].data, 8, 2));
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    tp_message_destroy(r);
    cuda_buf_free(gpu(0), m->tensors[0].data);
    cuda_buf_free(cpu, m->tensors[1].data);
    tp_message_destroy(m);
    send_pair(&pr, cpu, gpu(0));
    tp_test_pair_close(&pr);
    check_fake_leaks(0);
}

// Payloads stay host memory: a payload on a device is refused.
static void
payload_on_device_refused(void)
{
    cuda_env_setup();
    tp_test_pair pr;
    TP_CHECK(pair_open(&pr, "basic"));
    uint8_t byte = 1;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(1, 0, &m), NULL);
    m->payloads[0] = (tp_msg_buf){&byte, 1, gpu(0), false};
    op w;
    write_async(pr.pb, m, &w);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)),
                          "payload 0: 1 bytes");
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)),
                          "a CPU device");
    op_fini(&w);
    tp_message_destroy(m);
    tp_test_pair_close(&pr);
}

// Without a usable runtime, a CUDA tensor is refused with the reason.
static void
no_device_refused_with_reason(void)
{
    if (!cuda_env_fake()) {
        tp_test_skip("needs the fake runtime (FAKE_CUDA_DEVICES=0)");
    }
    setenv("FAKE_CUDA_DEVICES", "0", 1);
    TP_CHECK(tp__cuda_testing_use_runtime(TP_FAKE_CUDART));
    char why[256];
    TP_CHECK(!tp__cuda_available(why, sizeof(why)));
    tp_test_pair pr;
    TP_CHECK(pair_open(&pr, "basic"));
    uint8_t byte = 1;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] = (tp_msg_buf){&byte, 1, gpu(0), false};
    op w;
    write_async(pr.pb, m, &w);
    op_wait(&w, WAIT_MS);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_ENOTSUP);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)),
                          "tensor 0 on cuda:0: CUDA is not usable here");
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)),
                          "no CUDA-capable device");
    op_fini(&w);
    tp_message_destroy(m);
    tp_test_pair_close(&pr);
}

// Page-locked memory refused (the fake's FAKE_CUDA_NO_PINNED): both ends
// stage through pageable memory, and the bytes arrive.
static void
pinned_refused_stages_pageable(void)
{
    if (!cuda_env_fake()) {
        tp_test_skip("needs the fake runtime (FAKE_CUDA_NO_PINNED)");
    }
    setenv("FAKE_CUDA_NO_PINNED", "1", 1);
    cuda_env_setup();
    tp_test_pair pr;
    TP_CHECK(pair_open(&pr, "basic"));
    static const size_t n = 100003;
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0] = (tp_msg_buf){make_buf(gpu(0), n, 9), n, gpu(0), false};
    long before[7], after[7];
    TP_CHECK(cuda_env_counters(before));
    op w;
    write_async(pr.pb, m, &w);
    tp_message *r = cuda_read_desc(pr.pa);
    r->tensors[0].device = gpu(1);
    tp_error *err = NULL;
    TP_CHECK_OK(cuda_read_data(pr.pa, r, &err), err);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    TP_CHECK(cuda_env_counters(after));
    TP_CHECK_EQ(after[3] - before[3], 1); // staged out, device-to-host
    TP_CHECK_EQ(after[2] - before[2], 1); // staged in, host-to-device
    TP_CHECK_EQ(after[1], 0);             // never a pinned buffer
    TP_CHECK(cuda_buf_ok(gpu(1), r->tensors[0].data, n, 9));
    tp_message_destroy(r);
    cuda_buf_free(gpu(0), m->tensors[0].data);
    tp_message_destroy(m);
    tp_test_pair_close(&pr);
}

enum { XP_N = (3 << 20) + 5 };

// The writer: connects to the URL it is sent, writes XP_N bytes from its
// last device and 3 from cuda:0.
static void
cross_writer(tp_test_peer *self, void *arg)
{
    (void)arg;
    static const size_t n = XP_N;
    char url[256];
    if (!tp_test_peer_recv(self, url, sizeof(url), WAIT_MS)) {
        _exit(3);
    }
    cuda_env_setup();
    tp_context *ctx = tp_test_ctx("writer", NULL, NULL);
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url, &p, &err), err);
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 2, &m), NULL);
    int last = tp__cuda_device_count() - 1;
    m->tensors[0] =
        (tp_msg_buf){make_buf(gpu(last), n, 5), n, gpu(last), false};
    m->tensors[1] = (tp_msg_buf){make_buf(gpu(0), 3, 6), 3, gpu(0), false};
    op w;
    write_async(p, m, &w);
    op_wait(&w, WAIT_MS);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    op_fini(&w);
    cuda_buf_free(gpu(last), m->tensors[0].data);
    cuda_buf_free(gpu(0), m->tensors[1].data);
    tp_message_destroy(m);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
    check_fake_leaks(0);
}

// Across processes (the channels a real job uses: shm with cma where the
// host allows it): the writer, a forked child with its own runtime and
// context, sends from its cuda:1; the reader receives on its cuda:0.
static void
cross_process(void)
{
    static const size_t n = XP_N;
    tp_test_peer writer;
    tp_test_peer_fork(&writer, "writer", TP_TEST_PEER_DOWN, cross_writer, NULL);
    tp_context *ctx = tp_test_ctx("reader", NULL, NULL);
    tp_error *err = NULL;
    tp_pipe_listener *l = NULL;
    const char *lo = "tcp://127.0.0.1:0"; // loopback; shm as it is
    TP_CHECK_OK(tp_context_listen(ctx, &lo, 1, &l, &err), err);
    tp_test_peer_send(&writer, tp_pipe_listener_addr(l, NULL));
    cuda_env_setup();
    tp_pipe *p = op_pipe_accept(l, WAIT_MS);
    tp_message *r = cuda_read_desc(p);
    TP_CHECK_EQ(r->ntensors, 2);
    int last = tp__cuda_device_count() - 1;
    TP_CHECK_EQ(r->tensors[0].device.type, TP_DEVICE_CUDA);
    TP_CHECK_EQ(r->tensors[0].device.index, last);
    r->tensors[0].device = gpu(0);
    r->tensors[1].device = cpu;
    TP_CHECK_OK(cuda_read_data(p, r, &err), err);
    TP_CHECK(cuda_buf_ok(gpu(0), r->tensors[0].data, n, 5));
    TP_CHECK(cuda_buf_ok(cpu, r->tensors[1].data, 3, 6));
    fprintf(stderr, "cross-process: %s + %s\n", tp_pipe_transport(p),
            tp_pipe_channel(p));
    tp_message_destroy(r);
    tp_test_peer_wait(&writer, WAIT_MS);
    tp_pipe_unref(p);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
    check_fake_leaks(0);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(device_matrix_each_channel, 90),
    TP_TEST_CASE(write_refuses_missing_device),
    TP_TEST_CASE(read_to_missing_device_fails_only_the_read),
    TP_TEST_CASE(payload_on_device_refused),
    TP_TEST_CASE(no_device_refused_with_reason),
    TP_TEST_CASE(pinned_refused_stages_pageable),
    TP_TEST_CASE_T(cross_process, 60),
};

TP_TEST_MAIN(cases)
