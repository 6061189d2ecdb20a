// SPDX-License-Identifier: Apache-2.0
// ibv_device_test.c - the ibv transport on a real RDMA device: a round
// trip over loopback through the device. Skips (77), printing why, where
// there is no device (the reason `tpipe info` shows too).

#include <string.h>

#include "core/config.h"
#include "core/loop.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "transport/ibv/verbs.h"
#include "transport/transport.h"

static void
device_round_trip(void)
{
    // The real verbs, even if TP_IBV_FAKE=1 installed the fake.
    tp__ibv_verbs_override(NULL);
    tp_config cfg;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    const tp_transport_ops *ops = tp__transport_find("ibv");
    TP_CHECK(ops != NULL);
    char why[512] = "";
    if (!ops->is_viable(&cfg, why, sizeof(why))) {
        tp_test_skip("ibv: no usable RDMA device here: %s", why);
    }
    tp_loop *loop;
    TP_CHECK_OK(tp__loop_create(&cfg, "ibvdev", &loop, &err), err);
    tp_transport *t;
    TP_CHECK_OK(tp__transport_create("ibv", loop, &cfg, &t, &err), err);
    tp_listener *l;
    TP_CHECK_OK(tp__transport_listen(t, "ibv://127.0.0.1:0", &l, &err), err);
    op acc, con;
    op_init(&acc, 10000);
    op_init(&con, 10000);
    tp__listener_accept(l, acc.aio);
    tp__transport_connect(t, tp__listener_addr(l), con.aio);
    op_wait(&con, 15000);
    op_wait(&acc, 15000);
    TP_CHECK_OK(tp_aio_status(con.aio), tp_aio_error(con.aio));
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    tp_conn *c = tp_aio_get_output(con.aio, 0);
    tp_conn *s = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    op_fini(&con);
    // 8 MiB: several trips around the 2 MiB rings.
    size_t n = 8u << 20;
    uint8_t *out = malloc(n), *in = malloc(n);
    for (size_t i = 0; i < n; i++) {
        out[i] = (uint8_t)(i * 7 + 1);
    }
    op w, r;
    op_init(&w, 10000);
    op_init(&r, 10000);
    tp_iov wi = {out, n}, ri = {in, n};
    tp_aio_set_iov(w.aio, 1, &wi);
    tp_aio_set_iov(r.aio, 1, &ri);
    tp__conn_read(s, r.aio);
    tp__conn_write(c, w.aio);
    op_wait(&w, 15000);
    op_wait(&r, 15000);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    TP_CHECK(memcmp(out, in, n) == 0);
    op_fini(&w);
    op_fini(&r);
    free(out);
    free(in);
    tp__conn_unref(c);
    tp__conn_unref(s);
    tp__listener_destroy(l);
    tp__transport_destroy(t);
    tp__loop_destroy(loop);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(device_round_trip),
};

TP_TEST_MAIN(cases)
