// SPDX-License-Identifier: Apache-2.0
// rpc_demo.c - the RPC agent in one page: every worker calls its right
// neighbour.
//
//   tpipe run -n 3 build/examples/rpc_demo
//
// `tpipe run` starts N copies with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set; tp_rpc_init's default init method (env://) reads them.
// Each worker registers a function of its own ("demo.scale"), joins the
// job as "worker<rank>", then calls its right neighbour: the builtin
// "tp.echo", "demo.scale" synchronously, a few "demo.scale" calls in flight
// at once, and a function nobody registered (to show the error). Then
// RRefs: remote() runs "demo.scale" on the neighbour and keeps the result
// there; to_here fetches a copy; "demo.total" runs where the value is
// (rref.rpc_sync). It prints one line per result, its counters per peer,
// and shuts down gracefully (waiting for the others). Any failure: the
// message on stderr, exit 1.

// clock_gettime with -std=c11.
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tpipe/tpipe.h>

#define N_FLOATS 1024
#define N_ASYNC  4

static int g_rank = -1;

// Prints what failed (with the library's message, which names the
// function, the worker and the cause) and exits.
static void
die(const char *what, tp_status st, tp_error *err)
{
    fprintf(stderr, "rpc_demo: worker%d: %s: %s (%s)\n", g_rank, what,
            err != NULL ? tp_error_message(err) : "failed", tp_status_name(st));
    tp_error_unref(err);
    exit(1);
}

static double
now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

// "demo.scale": the arguments are a float factor (the bytes) and one
// float32 tensor; the result is the tensor times the factor. It runs on a
// pool thread of the callee's agent; an error it returns reaches the
// caller with its message.
static tp_status
demo_scale(const tp_rpc_call_info *call, const tp_args *in, void *arg,
           tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    size_t len = 0;
    const void *bytes = tp_args_bytes(in, &len);
    tp_tensor *x = tp_args_ntensors(in) == 1 ? tp_args_tensor(in, 0) : NULL;
    if (len != sizeof(float) || x == NULL || tp_tensor_dtype(x) != TP_F32 ||
        !tp_tensor_is_contiguous(x)) {
        *err_p = tp_error_create(TP_EINVAL, NULL,
                                 "%s from %s: want a float factor and one "
                                 "contiguous float32 tensor",
                                 call->fn_name, call->caller->name);
        return TP_EINVAL;
    }
    float factor;
    memcpy(&factor, bytes, sizeof(factor));

    tp_tensor *y = NULL;
    tp_status st = tp_tensor_empty(TP_F32, tp_tensor_ndim(x),
                                   tp_tensor_shape(x), &y, err_p);
    if (st != TP_OK) {
        return st;
    }
    const float *xs = tp_tensor_data(x);
    float *ys = tp_tensor_data(y);
    for (int64_t i = 0; i < tp_tensor_numel(x); i++) {
        ys[i] = xs[i] * factor;
    }
    // The result owns its own reference to y.
    if ((st = tp_args_create(NULL, 0, out_p)) == TP_OK &&
        (st = tp_args_add_tensor(*out_p, y)) != TP_OK) {
        tp_args_unref(*out_p);
    }
    tp_tensor_unref(y);
    return st;
}

// The arguments of demo.scale: @factor and the tensor @x (referenced).
// "demo.total": runs on the owner of RRef 0 of its arguments (a proxy
// call, tp_rref_rpc_sync): the sum of the tensor that RRef holds, as a
// double, computed where the value lives.
static tp_status
demo_total(const tp_rpc_call_info *call, const tp_args *in, void *arg,
           tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    tp_args *v = NULL;
    tp_status st = tp_rref_local_value(tp_args_rref(in, 0), 1000, &v, err_p);
    if (st != TP_OK) {
        return st;
    }
    const tp_tensor *t = tp_args_tensor(v, 0);
    const float *p = tp_tensor_data((tp_tensor *)t);
    double sum = 0;
    for (int64_t i = 0; i < tp_tensor_numel(t); i++) {
        sum += p[i];
    }
    return tp_args_create(&sum, sizeof(sum), out_p);
}

static tp_args *
scale_args(float factor, tp_tensor *x)
{
    tp_args *a = NULL;
    tp_status st = tp_args_create(&factor, sizeof(factor), &a);
    if (st != TP_OK || (st = tp_args_add_tensor(a, x)) != TP_OK) {
        die("building the arguments", st, NULL);
    }
    return a;
}

// Checks that @out holds @x * @factor.
static void
check_scaled(const tp_args *out, const tp_tensor *x, float factor)
{
    const tp_tensor *y =
        tp_args_ntensors(out) == 1 ? tp_args_tensor(out, 0) : NULL;
    if (y == NULL || tp_tensor_numel(y) != tp_tensor_numel(x)) {
        die("demo.scale returned the wrong tensor", TP_EPROTO, NULL);
    }
    const float *xs = tp_tensor_data(x), *ys = tp_tensor_data(y);
    for (int64_t i = 0; i < tp_tensor_numel(x); i++) {
        if (ys[i] != xs[i] * factor) {
            die("demo.scale returned a wrong value", TP_EPROTO, NULL);
        }
    }
}

// "shm/cma": the transport and channel of the pipe to @rank.
static const char *
pipe_name(tp_agent *a, int rank, char *buf, size_t len)
{
    tp_rpc_peer_stats ps;
    if (tp_rpc_get_peer_stats(a, rank, &ps) != TP_OK) {
        return "?";
    }
    snprintf(buf, len, "%s/%s", ps.transport, ps.channel);
    return buf;
}

int
main(void)
{
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    if (r == NULL || w == NULL) {
        fprintf(stderr, "rpc_demo: RANK and WORLD_SIZE are not set; run "
                        "me with `tpipe run -n 3 rpc_demo`\n");
        return 2;
    }
    int rank = atoi(r), world = atoi(w);
    g_rank = rank;
    tp_error *err = NULL;

    // 1. Register the functions this worker serves before joining, so that
    // no call can arrive before its function exists.
    tp_status st = tp_rpc_register("demo.scale", demo_scale, NULL, &err);
    if (st != TP_OK) {
        die("tp_rpc_register(demo.scale)", st, err);
    }
    if ((st = tp_rpc_register("demo.total", demo_total, NULL, &err)) != TP_OK) {
        die("tp_rpc_register(demo.total)", st, err);
    }

    // 2. Join: blocks until all WORLD_SIZE workers have joined. Options
    // come from the environment (TP_INIT_METHOD, TP_RPC_TIMEOUT_MS, ...,
    // docs/rpc.md); the init method defaults to env://.
    tp_agent_options o;
    tp_agent_options_init(&o);
    char me[32], right[32], via[40];
    int peer = (rank + 1) % world;
    snprintf(me, sizeof(me), "worker%d", rank);
    snprintf(right, sizeof(right), "worker%d", peer);
    tp_agent *a = NULL;
    if ((st = tp_rpc_init(me, rank, world, &o, &a, &err)) != TP_OK) {
        die("tp_rpc_init", st, err);
    }

    // 3. A tensor to send: 0, 1, ..., 1023.
    tp_tensor *x = NULL;
    st = tp_tensor_arange(TP_F32, 0, N_FLOATS, 1, &x, &err);
    if (st != TP_OK) {
        die("tp_tensor_arange", st, err);
    }

    // 4. tp.echo (a builtin) returns its arguments: bytes and tensors.
    const char hello[] = "hello";
    tp_args *in = NULL, *out = NULL;
    if (tp_args_create(hello, sizeof(hello), &in) != TP_OK ||
        tp_args_add_tensor(in, x) != TP_OK) {
        die("building the arguments", TP_ENOMEM, NULL);
    }
    double t0 = now_us();
    st = tp_rpc_sync(a, right, "tp.echo", in, TP_TIMEOUT_DEFAULT, &out, &err);
    double us = now_us() - t0;
    if (st != TP_OK) {
        die("rpc_sync(tp.echo)", st, err);
    }
    size_t len = 0;
    const void *back = tp_args_bytes(out, &len);
    if (len != sizeof(hello) || memcmp(back, hello, len) != 0) {
        die("tp.echo returned other bytes", TP_EPROTO, NULL);
    }
    check_scaled(out, x, 1.0f); // the same tensor
    printf("%s: %s echoed \"%s\" and %d floats in %.0f us over %s\n", me, right,
           hello, N_FLOATS, us, pipe_name(a, peer, via, sizeof(via)));
    tp_args_unref(out);
    tp_args_unref(in);

    // 5. demo.scale, synchronously: the neighbour runs our function.
    in = scale_args(2.0f, x);
    t0 = now_us();
    st =
        tp_rpc_sync(a, right, "demo.scale", in, TP_TIMEOUT_DEFAULT, &out, &err);
    us = now_us() - t0;
    if (st != TP_OK) {
        die("rpc_sync(demo.scale)", st, err);
    }
    check_scaled(out, x, 2.0f);
    printf("%s: %s scaled %d floats by 2.0 in %.0f us over %s\n", me, right,
           N_FLOATS, us, pipe_name(a, peer, via, sizeof(via)));
    tp_args_unref(out);
    tp_args_unref(in);

    // 6. Several calls in flight: rpc_async returns a future at once; the
    // arguments must stay unchanged until their future resolves.
    tp_args *ins[N_ASYNC];
    tp_future *fs[N_ASYNC];
    t0 = now_us();
    for (int i = 0; i < N_ASYNC; i++) {
        ins[i] = scale_args((float)(i + 3), x);
        fs[i] =
            tp_rpc_async(a, right, "demo.scale", ins[i], TP_TIMEOUT_DEFAULT);
        if (fs[i] == NULL) {
            die("rpc_async(demo.scale)", TP_ENOMEM, NULL);
        }
    }
    for (int i = 0; i < N_ASYNC; i++) {
        // 0: no limit of our own; the call's timeout still applies.
        if ((st = tp_rpc_wait(fs[i], 0, &out, &err)) != TP_OK) {
            die("rpc_async(demo.scale) result", st, err);
        }
        check_scaled(out, x, (float)(i + 3));
        printf("%s: %s scaled %d floats by %.1f (call %d of %d in flight, "
               "done after %.0f us)\n",
               me, right, N_FLOATS, (double)(i + 3), i + 1, N_ASYNC,
               now_us() - t0);
        tp_args_unref(out);
        tp_future_unref(fs[i]);
        tp_args_unref(ins[i]);
    }

    // 7. A function the neighbour never registered: an error that names
    // it, not a crash or a hang.
    st = tp_rpc_sync(a, right, "demo.missing", NULL, TP_TIMEOUT_DEFAULT, NULL,
                     &err);
    if (st != TP_ENOENT) {
        die("rpc_sync(demo.missing) should fail with TP_ENOENT", st, err);
    }
    printf("%s: %s has no demo.missing, as expected: %s\n", me, right,
           tp_error_message(err));
    tp_error_unref(err);
    err = NULL;

    // 8. RRefs: remote() returns at once; the result of demo.scale stays
    // on the neighbour (its owner). to_here fetches a copy; demo.total
    // runs on the owner with the value as RRef 0; dropping the RRef lets
    // the owner free the value.
    in = scale_args(5.0f, x);
    tp_rref *rr = NULL;
    t0 = now_us();
    st = tp_remote(a, right, "demo.scale", in, TP_TIMEOUT_DEFAULT, &rr, &err);
    if (st != TP_OK) {
        die("remote(demo.scale)", st, err);
    }
    if ((st = tp_rref_to_here(rr, TP_TIMEOUT_DEFAULT, &out, &err)) != TP_OK) {
        die("rref to_here", st, err);
    }
    us = now_us() - t0;
    check_scaled(out, x, 5.0f);
    tp_args_unref(out);
    if ((st = tp_rref_rpc_sync(rr, "demo.total", NULL, TP_TIMEOUT_DEFAULT, &out,
                               &err)) != TP_OK) {
        die("rref rpc_sync(demo.total)", st, err);
    }
    double total = 0;
    const void *tb = tp_args_bytes(out, &len);
    if (len != sizeof(total)) {
        die("demo.total returned other bytes", TP_EPROTO, NULL);
    }
    memcpy(&total, tb, sizeof(total));
    printf("%s: %s owns an RRef to %d floats scaled by 5.0 (remote + "
           "to_here in %.0f us); their sum, computed there: %.0f\n",
           me, tp_rref_owner_name(rr), N_FLOATS, us, total);
    tp_args_unref(out);
    tp_rref_unref(rr);
    tp_args_unref(in);
    tp_tensor_unref(x);

    // 9. Counters per peer (calls, bytes, latency, the pipe used) and of
    // the RRef protocol.
    char *info = tp_rpc_get_debug_info(a);
    if (info != NULL) {
        printf("%s", info);
        if (info[0] != '\0' && info[strlen(info) - 1] != '\n') {
            printf("\n");
        }
        free(info);
    }

    // 10. Graceful shutdown: waits until every worker is done calling.
    if ((st = tp_rpc_shutdown(a, true, &err)) != TP_OK) {
        die("tp_rpc_shutdown", st, err);
    }
    printf("%s: done\n", me);
    return 0;
}
