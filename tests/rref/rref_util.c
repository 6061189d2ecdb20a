// SPDX-License-Identifier: Apache-2.0
// rref_util.c - what the RRef tests share (rref_util.h): values, the
// functions and the remote type every worker registers, joining and
// leaving, counters, and running a job of workers.

#include "tp_test.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/log.h>
#include <tpipe/rpc.h>
#include <tpipe/rref.h>
#include <tpipe/tensor.h>

#include "rref_util.h"
#include "tp_test_job.h"

const char *const k_names[4] = {"alpha", "bravo", "charlie", "delta"};

int g_rank = -1;
tp_rref *_Atomic g_kept[8];  // RRefs kept by "t.keep"
atomic_int g_objects;        // live "t.linear" objects here
atomic_int g_leak_reports;   // TP-RREF-LEAK log lines here
static atomic_int g_release; // set by "t.release"

// ---- values ----------------------------------------------------------------

tp_tensor *
f32_tensor(float v)
{
    int64_t shape[1] = {NVALS};
    tp_tensor *t = NULL;
    TP_CHECK_OK(tp_tensor_empty(TP_F32, 1, shape, &t, NULL), NULL);
    float *p = tp_tensor_data(t);
    for (int i = 0; i < NVALS; i++) {
        p[i] = v + (float)i;
    }
    return t;
}

// Checks that @t holds f32_tensor(@v).
void
check_tensor(const tp_tensor *t, float v)
{
    TP_CHECKF(t != NULL && tp_tensor_dtype(t) == TP_F32 &&
                  tp_tensor_numel(t) == NVALS,
              "rank %d: not a tensor of %d f32", g_rank, NVALS);
    const float *p = tp_tensor_data((tp_tensor *)t);
    for (int i = 0; i < NVALS; i++) {
        TP_CHECKF(p[i] == v + (float)i, "rank %d: value[%d] = %g, want %g",
                  g_rank, i, (double)p[i], (double)(v + (float)i));
    }
}

tp_args *
args_i64(int64_t v)
{
    tp_args *x = NULL;
    TP_CHECK_OK(tp_args_create(&v, sizeof(v), &x), NULL);
    return x;
}

int64_t
get_i64(const tp_args *x)
{
    size_t n = 0;
    const void *p = tp_args_bytes(x, &n);
    int64_t v = 0;
    TP_CHECKF(p != NULL && n == sizeof(v), "rank %d: not an int64 (%zu bytes)",
              g_rank, n);
    memcpy(&v, p, sizeof(v));
    return v;
}

// Args with @r (a handle is taken) and optionally an int64.
tp_args *
args_rref(tp_rref *r, int64_t v)
{
    tp_args *x = args_i64(v);
    TP_CHECK_OK(tp_args_add_rref(x, r), NULL);
    return x;
}

// ---- functions the workers run ---------------------------------------------

// "t.make": bytes "made" + f32_tensor(in as int64).
static tp_status
fn_make(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)err_p;
    int64_t v = get_i64(in);
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create("made", 4, &out), NULL);
    tp_tensor *t = f32_tensor((float)v);
    TP_CHECK_OK(tp_args_add_tensor(out, t), NULL);
    tp_tensor_unref(t);
    *out_p = out;
    return TP_OK;
}

static tp_status
fn_fail(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)out_p;
    *err_p = tp_error_create(TP_EINVAL, NULL, "bad thing 42");
    return TP_EINVAL;
}

// "t.sleep": sleeps (in) ms, returns it.
static tp_status
fn_sleep(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)err_p;
    int64_t ms = get_i64(in);
    tp_job_sleep_ms(ms);
    *out_p = args_i64(ms);
    return TP_OK;
}

// "t.keep": keeps RRef 0 in slot (in as int64).
static tp_status
fn_keep(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)out_p;
    (void)err_p;
    int64_t slot = get_i64(in);
    TP_CHECK(slot >= 0 && slot < 8 && tp_args_nrrefs(in) == 1);
    tp_rref *old =
        atomic_exchange(&g_kept[slot], tp_rref_ref(tp_args_rref(in, 0)));
    tp_rref_unref(old);
    return TP_OK;
}

// "t.drop": lets go of slot (in).
static tp_status
fn_drop(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)out_p;
    (void)err_p;
    int64_t slot = get_i64(in);
    tp_rref_unref(atomic_exchange(&g_kept[slot], NULL));
    return TP_OK;
}

// "t.here": to_here of RRef 0; returns the value's first float and whether
// this worker owns it (value * 2 + owner).
static tp_status
fn_here(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    tp_rref *r = tp_args_rref(in, 0);
    TP_CHECK(r != NULL);
    tp_args *v = NULL;
    tp_status st = tp_rref_to_here(r, WAIT_MS, &v, err_p);
    if (st != TP_OK) {
        return st;
    }
    const float *p = tp_tensor_data(tp_args_tensor(v, 0));
    int64_t out = (int64_t)p[0] * 2 + (tp_rref_is_owner(r) ? 1 : 0);
    if (tp_rref_is_owner(r)) {
        // The owner's own RRef: its value is right here.
        tp_args *lv = NULL;
        TP_CHECK_OK(tp_rref_local_value(r, WAIT_MS, &lv, err_p), *err_p);
        check_tensor(tp_args_tensor(lv, 0), p[0]);
        // to_here gave a copy, not the value itself.
        TP_CHECK(tp_args_tensor(lv, 0) != tp_args_tensor(v, 0));
    }
    tp_args_unref(v);
    *out_p = args_i64(out);
    return TP_OK;
}

// "t.pass": passes RRef 0 to rank (in) with "t.here" and returns its
// answer: a fork of a fork.
static tp_status
fn_pass(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    int64_t to = get_i64(in);
    tp_args *a = args_rref(tp_args_rref(in, 0), 0);
    tp_status st = tp_rpc_sync_rank(call->agent, (int)to, "t.here", a, WAIT_MS,
                                    out_p, err_p);
    tp_args_unref(a);
    return st;
}

// "t.mkref": a local RRef of f32_tensor(in), returned as the result.
static tp_status
fn_mkref(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    tp_args *v = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &v), NULL);
    tp_tensor *t = f32_tensor((float)get_i64(in));
    TP_CHECK_OK(tp_args_add_tensor(v, t), NULL);
    tp_tensor_unref(t);
    tp_rref *r = NULL;
    tp_status st = tp_rref_create(call->agent, v, &r, err_p);
    tp_args_unref(v);
    if (st != TP_OK) {
        return st;
    }
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
    TP_CHECK_OK(tp_args_add_rref(out, r), NULL);
    tp_rref_unref(r);
    *out_p = out;
    return TP_OK;
}

// "t.sum": on the owner of RRef 0 (a proxy call): the sum of its tensor
// plus the int64 argument.
static tp_status
fn_sum(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    tp_rref *r = tp_args_rref(in, 0);
    TP_CHECK(r != NULL && tp_rref_is_owner(r));
    tp_args *v = NULL;
    tp_status st = tp_rref_local_value(r, WAIT_MS, &v, err_p);
    if (st != TP_OK) {
        return st;
    }
    const float *p = tp_tensor_data(tp_args_tensor(v, 0));
    double s = 0;
    for (int i = 0; i < NVALS; i++) {
        s += p[i];
    }
    *out_p = args_i64((int64_t)s + get_i64(in));
    return TP_OK;
}

// "t.scale": multiplies the tensor of RRef 0's value in place by (in).
static tp_status
fn_scale(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)out_p;
    tp_args *v = NULL;
    tp_status st = tp_rref_local_value(tp_args_rref(in, 0), WAIT_MS, &v, err_p);
    if (st != TP_OK) {
        return st;
    }
    float *p = tp_tensor_data(tp_args_tensor(v, 0));
    for (int i = 0; i < NVALS; i++) {
        p[i] *= (float)get_i64(in);
    }
    return TP_OK;
}

// "t.stats": this worker's RRef counters, and its live objects.
static tp_status
fn_stats(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    (void)in;
    (void)arg;
    int64_t v[8];
    tp_rref_stats s;
    TP_CHECK_OK(tp_rref_get_stats(call->agent, &s), NULL);
    v[0] = (int64_t)s.owners;
    v[1] = (int64_t)s.users;
    v[2] = (int64_t)s.forks;
    v[3] = (int64_t)s.pending_forks;
    v[4] = (int64_t)s.pending_users;
    v[5] = (int64_t)s.pending_messages;
    v[6] = atomic_load(&g_objects);
    v[7] = (int64_t)s.created;
    (void)err_p;
    return tp_args_create(v, sizeof(v), out_p);
}

static tp_status
fn_pid(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)err_p;
    *out_p = args_i64((int64_t)getpid());
    return TP_OK;
}

static tp_status
fn_release(const tp_rpc_call_info *call, const tp_args *in, void *arg,
           tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)out_p;
    (void)err_p;
    atomic_store(&g_release, 1);
    return TP_OK;
}

void
wait_release(void)
{
    int64_t dl = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    while (atomic_load(&g_release) == 0) {
        TP_CHECKF(tp_job_now_ms() < dl, "rank %d: never released", g_rank);
        tp_job_sleep_ms(2);
    }
}

// ---- a remote type: "t.linear" ---------------------------------------------

typedef struct linear {
    tp_tensor *w;
    tp_rref *w_rref; // an RRef to the parameter, owned here
} linear;

static tp_status
linear_create(const tp_rpc_call_info *call, const tp_args *in, void *arg,
              void **state_p, tp_error **err_p)
{
    (void)arg;
    int64_t v = get_i64(in);
    if (v < 0) {
        *err_p = tp_error_create(TP_EINVAL, NULL, "negative init");
        return TP_EINVAL;
    }
    linear *l = calloc(1, sizeof(*l));
    TP_CHECK(l != NULL);
    l->w = f32_tensor((float)v);
    tp_args *val = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &val), NULL);
    TP_CHECK_OK(tp_args_add_tensor(val, l->w), NULL);
    TP_CHECK_OK(tp_rref_create(call->agent, val, &l->w_rref, err_p), *err_p);
    tp_args_unref(val);
    atomic_fetch_add(&g_objects, 1);
    *state_p = l;
    return TP_OK;
}

static void
linear_destroy(void *state, void *arg)
{
    (void)arg;
    linear *l = state;
    tp_rref_unref(l->w_rref);
    tp_tensor_unref(l->w);
    free(l);
    atomic_fetch_sub(&g_objects, 1);
}

// forward: the dot product of w with f32_tensor(in).
static tp_status
linear_forward(const tp_rpc_call_info *call, void *state, const tp_args *in,
               void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)err_p;
    linear *l = state;
    const tp_tensor *x = tp_args_tensor(in, 0);
    TP_CHECK(x != NULL && tp_tensor_numel(x) == NVALS);
    const float *w = tp_tensor_data(l->w);
    const float *p = tp_tensor_data((tp_tensor *)x);
    double s = 0;
    for (int i = 0; i < NVALS; i++) {
        s += (double)w[i] * p[i];
    }
    *out_p = args_i64((int64_t)llround(s));
    return TP_OK;
}

// parameters: RRefs to the parameter tensors (RemoteModule's
// remote_parameters).
static tp_status
linear_parameters(const tp_rpc_call_info *call, void *state, const tp_args *in,
                  void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)err_p;
    linear *l = state;
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
    TP_CHECK_OK(tp_args_add_rref(out, l->w_rref), NULL);
    *out_p = out;
    return TP_OK;
}

static tp_status
linear_to_args(void *state, void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    (void)err_p;
    linear *l = state;
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create("linear", 6, &out), NULL);
    TP_CHECK_OK(tp_args_add_tensor(out, l->w), NULL);
    *out_p = out;
    return TP_OK;
}

static const tp_remote_method k_linear_methods[] = {
    {"forward", linear_forward},
    {"parameters", linear_parameters},
};

// ---- workers ---------------------------------------------------------------

static void
log_sink(tp_log_level level, const char *id, const char *msg, void *arg)
{
    (void)arg;
    if (strcmp(id, "TP-RREF-LEAK") == 0) {
        atomic_fetch_add(&g_leak_reports, 1);
    }
    if (level <= TP_LOG_LEVEL_WARN) {
        fprintf(stderr, "rank %d: [%s] %s\n", g_rank, id, msg);
    }
}

void
setup(int rank)
{
    g_rank = rank;
    tp_log_set_handler(log_sink, NULL);
    tp_log_set_level(TP_LOG_LEVEL_WARN);
    static const struct {
        const char *name;
        tp_rpc_fn fn;
    } fns[] = {
        {"t.make", fn_make},       {"t.fail", fn_fail},   {"t.sleep", fn_sleep},
        {"t.keep", fn_keep},       {"t.drop", fn_drop},   {"t.here", fn_here},
        {"t.pass", fn_pass},       {"t.mkref", fn_mkref}, {"t.sum", fn_sum},
        {"t.scale", fn_scale},     {"t.stats", fn_stats}, {"t.pid", fn_pid},
        {"t.release", fn_release},
    };
    tp_error *err = NULL;
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        TP_CHECK_OK(tp_rpc_register(fns[i].name, fns[i].fn, NULL, &err), err);
    }
    tp_remote_type t = {
        .size = sizeof(t),
        .name = "t.linear",
        .create = linear_create,
        .destroy = linear_destroy,
        .methods = k_linear_methods,
        .nmethods = 2,
        .to_args = linear_to_args,
        .serialize = true,
    };
    // Only ranks 0..2 know the type: rank 3 refuses to create one.
    if (rank < 3) {
        TP_CHECK_OK(tp_remote_type_register(&t, &err), err);
    }
}

tp_agent *
join(int rank, int world, const char *url)
{
    return tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, 0);
}

void
leave(tp_agent *a)
{
    for (int i = 0; i < 8; i++) {
        tp_rref_unref(atomic_exchange(&g_kept[i], NULL));
    }
    tp_job_rpc_leave(a, g_rank);
}

// The counters of rank @r (fn_stats' layout).
void
stats_of(tp_agent *a, int r, int64_t v[8])
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_sync_rank(a, r, "t.stats", NULL, WAIT_MS, &out, &err),
                err);
    size_t n = 0;
    const void *p = tp_args_bytes(out, &n);
    TP_CHECK(n == 8 * sizeof(int64_t));
    memcpy(v, p, n);
    tp_args_unref(out);
}

// Waits until every worker of @world has no RRef state left (owners,
// users, forks, pending anything) and @objects live objects.
void
wait_settled(tp_agent *a, int world, int objects)
{
    int64_t dl = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    for (int r = 0; r < world; r++) {
        int64_t v[8];
        for (;;) {
            stats_of(a, r, v);
            bool zero = v[0] == 0 && v[1] == 0 && v[2] == 0 && v[3] == 0 &&
                        v[4] == 0 && v[5] == 0 && v[6] == objects;
            if (zero) {
                break;
            }
            TP_CHECKF(tp_job_now_ms() < dl,
                      "rank %d: rank %d still has owners %lld users %lld "
                      "forks %lld pending forks %lld pending users %lld "
                      "queued %lld objects %lld",
                      g_rank, r, (long long)v[0], (long long)v[1],
                      (long long)v[2], (long long)v[3], (long long)v[4],
                      (long long)v[5], (long long)v[6]);
            tp_job_sleep_ms(5);
        }
    }
}

tp_rref *
remote_ok(tp_agent *a, const char *to, const char *fn, int64_t v)
{
    tp_args *in = args_i64(v);
    tp_rref *r = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_remote(a, to, fn, in, WAIT_MS, &r, &err), err);
    tp_args_unref(in);
    return r;
}

tp_args *
here_ok(tp_rref *r)
{
    tp_args *v = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rref_to_here(r, WAIT_MS, &v, &err);
    TP_CHECKF(st == TP_OK, "rank %d: to_here: %s", g_rank,
              tp_error_message(err));
    return v;
}

int64_t
call_i64(tp_agent *a, int to, const char *fn, const tp_args *in)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync_rank(a, to, fn, in, WAIT_MS, &out, &err);
    TP_CHECKF(st == TP_OK, "rank %d: %s on rank %d: %s", g_rank, fn, to,
              tp_error_message(err));
    int64_t v = get_i64(out);
    tp_args_unref(out);
    return v;
}

void
run(int world, tp_job_fn fn, void *arg)
{
    tp_job j;
    tp_job_tcp(&j, world, fn, arg);
    j.setup = setup;
    j.names = k_names;
    tp_job_run(&j);
}
