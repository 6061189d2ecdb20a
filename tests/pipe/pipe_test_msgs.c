// SPDX-License-Identifier: Apache-2.0
// pipe_test_msgs.c - pipe_test's cases on what a pipe carries: the
// negotiated pair, messages of every shape and many parts, 256 MiB and
// above 2 GiB, and ordering of many writes in flight.

#include "tp_test.h"

#include <tpipe/pipe.h>

#include "pipe_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

void
test_negotiates_pair(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    TP_CHECK(strcmp(tp_pipe_transport(pr.pb), tr_name()) == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pr.pb), ch_name()) == 0);
    TP_CHECK(strcmp(tp_pipe_transport(pr.pa), tr_name()) == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pr.pa), ch_name()) == 0);
    char *ra = tp_pipe_report(pr.pa);
    char *rb = tp_pipe_report(pr.pb);
    TP_CHECK(ra != NULL && rb != NULL);
    TP_CHECK_STR_CONTAINS(ra, "pipe from bob");
    TP_CHECK_STR_CONTAINS(rb, "pipe to alice");
    TP_CHECK_STR_CONTAINS(rb, "not allowed by the options");
    free(ra);
    free(rb);
    TP_CHECK_STR_CONTAINS(tp_pipe_peer(pr.pa), "bob");
    tp_test_pair_close(&pr);
}

// Messages of many shapes both ways, while the pipe alternates directions.
void
test_shapes(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    static const struct {
        uint32_t np;
        uint64_t psz[3];
        uint32_t nt;
        uint64_t tsz[4];
    } shapes[] = {
        {0, {0}, 0, {0}},
        {1, {5}, 0, {0}},
        {0, {0}, 1, {0}},
        {0, {0}, 1, {1}},
        {2, {0, 100}, 3, {64, 0, 4097}},
        {3, {70000, 3, 1}, 2, {1 << 20, 3}},
        {1, {1}, 4, {300000, 262144, 262143, 7}},
        {0, {0}, 1, {(16u << 20) + 5}},
    };
    for (uint32_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        for (int dir = 0; dir < 2; dir++) {
            tp_pipe *tx = dir ? pr.pa : pr.pb;
            tp_pipe *rx = dir ? pr.pb : pr.pa;
            tp_message *m = make_msg(shapes[k].np, shapes[k].psz, shapes[k].nt,
                                     shapes[k].tsz, k + 1);
            send_recv(tx, rx, m, shapes[k].np, shapes[k].psz, shapes[k].nt,
                      shapes[k].tsz, k + 1);
            free_sent(m);
        }
    }
    tp_test_pair_close(&pr);
}

// Many payloads and tensors in one message: more buffers than one
// connection operation carries (8 iovs), a mix of sizes on the channel
// and inline.
void
test_many_parts(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    enum { NP = 40, NT = 30 };
    uint64_t psz[NP], tsz[NT];
    for (int i = 0; i < NP; i++) {
        psz[i] = (i % 5 == 0) ? 0 : (uint64_t)(i * 997 % 70000);
    }
    for (int i = 0; i < NT; i++) {
        tsz[i] = (i % 4 == 0)   ? 0
                 : (i % 7 == 0) ? (uint64_t)(300000 + i)
                                : (uint64_t)(i * 31);
    }
    for (int k = 0; k < 3; k++) {
        tp_message *m = make_msg(NP, psz, NT, tsz, (uint32_t)k + 70);
        send_recv(pr.pb, pr.pa, m, NP, psz, NT, tsz, (uint32_t)k + 70);
        free_sent(m);
    }
    tp_test_pair_close(&pr);
}

// The largest size of the suite within one process (xth's only way),
// with a payload beside it.
void
test_256mib_in_process(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    uint64_t psz[1] = {1000};
    uint64_t tsz[2] = {256u << 20, 5};
    tp_message *m = make_msg(1, psz, 2, tsz, 80);
    send_recv(pr.pb, pr.pa, m, 1, psz, 2, tsz, 80);
    free_sent(m);
    tp_test_pair_close(&pr);
}

// Many writes in flight at once complete in order and arrive in order.
void
test_ordering(void)
{
    tp_test_pair pr;
    pair_open(&pr);
    enum { N = 200 };
    static op w[N];
    static tp_message *m[N];
    static uint64_t tsz[N];
    uint64_t psz[1] = {16};
    for (int i = 0; i < N; i++) {
        tsz[i] = (i % 7 == 0) ? (uint64_t)(300000 + i) : (uint64_t)(i * 13);
        m[i] = make_msg(1, psz, 1, &tsz[i], (uint32_t)i + 1);
        op_init(&w[i], WAIT_MS);
        tp_pipe_write(pr.pb, m[i], w[i].aio);
    }
    for (int i = 0; i < N; i++) {
        recv_check(pr.pa, 1, psz, 1, &tsz[i], (uint32_t)i + 1);
    }
    for (int i = 0; i < N; i++) {
        op_wait(&w[i], WAIT_MS);
        TP_CHECK_OK(tp_aio_status(w[i].aio), tp_aio_error(w[i].aio));
        op_fini(&w[i]);
        free_sent(m[i]);
    }
    tp_test_pair_close(&pr);
}

// One tensor above 2 GiB (lengths are 64-bit end to end; cma splits its
// reads below 2 GiB). Runs with TP_PIPE_HUGE=1 (label slow: 4+ GiB).
void
test_above_2gib(void)
{
    if (getenv("TP_PIPE_HUGE") == NULL) {
        tp_test_skip("set TP_PIPE_HUGE=1 (needs 4.1 GiB of memory)");
    }
    tp_test_pair pr;
    pair_open(&pr);
    uint64_t n = (2ull << 30) + (1u << 20) + 7;
    uint8_t *src = malloc(n);
    uint8_t *dst = malloc(n);
    TP_CHECK(src != NULL && dst != NULL);
    // Every 4 KiB page carries its index; the rest is a constant.
    memset(src, 0x5a, n);
    memset(dst, 0, n);
    for (uint64_t off = 0; off + 8 <= n; off += 4096) {
        memcpy(src + off, &off, 8);
    }
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(0, 1, &m), NULL);
    m->tensors[0].data = src;
    m->tensors[0].len = n;
    op w, r;
    op_init(&w, 120000);
    op_init(&r, 120000);
    tp_pipe_write(pr.pb, m, w.aio);
    tp_pipe_read_descriptor(pr.pa, r.aio);
    op_wait(&r, 120000);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    tp_message *in = tp_aio_get_output(r.aio, 0);
    TP_CHECK_EQ(in->tensors[0].len, n);
    in->tensors[0].data = dst;
    atomic_store(&r.done, 0);
    tp_pipe_read(pr.pa, in, r.aio);
    op_wait(&r, 120000);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    op_wait(&w, 120000);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    TP_CHECK(memcmp(src, dst, n) == 0);
    tp_message_destroy(in);
    tp_message_destroy(m);
    op_fini(&w);
    op_fini(&r);
    free(src);
    free(dst);
    tp_test_pair_close(&pr);
}
