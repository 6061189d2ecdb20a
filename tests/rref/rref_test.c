// SPDX-License-Identifier: Apache-2.0
// rref_test.c - RRefs, remote() and remote objects (rref.h) across 2 to 4
// worker processes on loopback: creation and to_here (remote and local
// owners), errors of the owner's function, creation and to_here
// timeouts, fork chains A -> B -> C -> owner, RRefs as arguments and
// results, 10 000 RRefs created and released with every worker's counters
// back to zero, a deletion racing a fork in flight, the owner or a user
// killed, graceful shutdown with RRefs alive, proxies, remote objects
// with two methods and their parameters.
//
// Every worker is a forked child (tp_test_job.h); each registers the test
// functions and types, then calls tp_rpc_init. Every wait has a deadline.

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

#include "tp_test_job.h"

#define WAIT_MS 20000
#define NVALS   16

static const char *const k_names[] = {"alpha", "bravo", "charlie", "delta"};

static int g_rank = -1;
static tp_agent *g_agent;
static tp_rref *_Atomic g_kept[8]; // RRefs kept by "t.keep"
static atomic_int g_objects;       // live "t.linear" objects here
static atomic_int g_leak_reports;  // TP-RREF-LEAK log lines here
static atomic_int g_release;       // set by "t.release"

// ---- values
// -------------------------------------------------------------------

static tp_tensor *
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
static void
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

static tp_args *
args_i64(int64_t v)
{
    tp_args *x = NULL;
    TP_CHECK_OK(tp_args_create(&v, sizeof(v), &x), NULL);
    return x;
}

static int64_t
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
static tp_args *
args_rref(tp_rref *r, int64_t v)
{
    tp_args *x = args_i64(v);
    TP_CHECK_OK(tp_args_add_rref(x, r), NULL);
    return x;
}

// ---- functions the workers run
// --------------------------------------------------

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

static void
wait_release(void)
{
    int64_t dl = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    while (atomic_load(&g_release) == 0) {
        TP_CHECKF(tp_job_now_ms() < dl, "rank %d: never released", g_rank);
        tp_job_sleep_ms(2);
    }
}

// ---- a remote type: "t.linear"
// ----------------------------------------------------

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

// ---- workers
// ---------------------------------------------------------------------

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

static void
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

static tp_agent *
join(int rank, int world, const char *url)
{
    tp_agent_options o;
    tp_agent_options_init(&o);
    o.init_method = url;
    o.init_timeout_ms = tp_test_ms(WAIT_MS);
    o.shutdown_timeout_ms = tp_test_ms(WAIT_MS);
    o.num_worker_threads = 4;
    tp_agent *a = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_init(k_names[rank], rank, world, &o, &a, &err);
    TP_CHECKF(st == TP_OK, "rank %d: init: %s", rank, tp_error_message(err));
    g_agent = a;
    return a;
}

static void
leave(tp_agent *a)
{
    for (int i = 0; i < 8; i++) {
        tp_rref_unref(atomic_exchange(&g_kept[i], NULL));
    }
    tp_error *err = NULL;
    tp_status st = tp_rpc_shutdown(a, true, &err);
    TP_CHECKF(st == TP_OK, "rank %d: graceful shutdown: %s", g_rank,
              tp_error_message(err));
}

// The counters of rank @r (fn_stats' layout).
static void
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
static void
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

static tp_rref *
remote_ok(tp_agent *a, const char *to, const char *fn, int64_t v)
{
    tp_args *in = args_i64(v);
    tp_rref *r = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_remote(a, to, fn, in, WAIT_MS, &r, &err), err);
    tp_args_unref(in);
    return r;
}

static tp_args *
here_ok(tp_rref *r)
{
    tp_args *v = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rref_to_here(r, WAIT_MS, &v, &err);
    TP_CHECKF(st == TP_OK, "rank %d: to_here: %s", g_rank,
              tp_error_message(err));
    return v;
}

static int64_t
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

static void
run(int world, tp_job_fn fn, void *arg)
{
    tp_job j;
    tp_job_tcp(&j, world, fn, arg);
    j.setup = setup;
    j.names = k_names;
    tp_job_run(&j);
}

// ---- cases
// ---------------------------------------------------------------------

// remote() to another worker and to self, to_here, local values, RRef(v).
static void
w_basic(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        tp_rref *r = remote_ok(a, "bravo", "t.make", 7);
        TP_CHECK(!tp_rref_is_owner(r));
        TP_CHECK(strcmp(tp_rref_owner_name(r), "bravo") == 0);
        tp_worker_info wi;
        TP_CHECK_OK(tp_rref_owner(r, &wi), NULL);
        TP_CHECK_EQ(wi.rank, 1);
        tp_args *v = here_ok(r);
        size_t n = 0;
        const void *b = tp_args_bytes(v, &n);
        TP_CHECK(n == 4 && memcmp(b, "made", 4) == 0);
        check_tensor(tp_args_tensor(v, 0), 7);
        tp_args_unref(v);
        TP_CHECK_OK(tp_rref_wait_created(r, WAIT_MS, &err), err);
        TP_CHECK(tp_rref_confirmed_by_owner(r));
        TP_CHECK(tp_rref_error(r) == NULL);
        // local_value is the owner's only, and says who owns it.
        tp_args *lv = NULL;
        TP_CHECK_EQ(tp_rref_local_value(r, WAIT_MS, &lv, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "owned by bravo (rank 1)");
        tp_error_unref(err);
        err = NULL;
        // Twice: a second fetch of the same value.
        v = here_ok(r);
        check_tensor(tp_args_tensor(v, 0), 7);
        tp_args_unref(v);
        tp_rref_unref(r);

        // Owned here: remote() to self.
        r = remote_ok(a, "alpha", "t.make", 3);
        TP_CHECK(tp_rref_is_owner(r));
        TP_CHECK(tp_rref_confirmed_by_owner(r));
        v = here_ok(r);
        TP_CHECK_OK(tp_rref_local_value(r, WAIT_MS, &lv, &err), err);
        check_tensor(tp_args_tensor(lv, 0), 3);
        check_tensor(tp_args_tensor(v, 0), 3);
        TP_CHECK(tp_args_tensor(v, 0) != tp_args_tensor(lv, 0)); // a copy
        tp_args_unref(v);
        tp_rref_unref(r);

        // RRef(value), and its to_here_async.
        tp_args *val = args_i64(99);
        TP_CHECK_OK(tp_rref_create(a, val, &r, &err), err);
        tp_args_unref(val);
        tp_future *f = tp_rref_to_here_async(r, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &v, &err), err);
        TP_CHECK_EQ(get_i64(v), 99);
        tp_args_unref(v);
        tp_future_unref(f);
        tp_rref_unref(r);

        // to_here_async of a user RRef.
        r = remote_ok(a, "bravo", "t.make", 5);
        f = tp_rref_to_here_async(r, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &v, &err), err);
        check_tensor(tp_args_tensor(v, 0), 5);
        tp_args_unref(v);
        tp_future_unref(f);
        tp_rref_unref(r);

        char *info = tp_rpc_get_debug_info(a);
        TP_CHECK_STR_CONTAINS(info, "rrefs: owners");
        free(info);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_basic(void)
{
    run(2, w_basic, NULL);
}

// An error of the owner's function, creation and to_here timeouts, and
// unknown functions.
static void
w_errors(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        tp_args *v = NULL;
        tp_rref *r = remote_ok(a, "bravo", "t.fail", 0);
        tp_status st = tp_rref_to_here(r, WAIT_MS, &v, &err);
        TP_CHECK_EQ(st, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bad thing 42");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_EQ(tp_rref_wait_created(r, WAIT_MS, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bad thing 42");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK(tp_rref_error(r) != NULL);
        TP_CHECK_STR_CONTAINS(tp_error_message(tp_rref_error(r)), "bravo");
        tp_rref_unref(r);

        // Unknown function: named, with the worker.
        r = remote_ok(a, "bravo", "t.nope", 0);
        TP_CHECK_EQ(tp_rref_to_here(r, WAIT_MS, &v, &err), TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "t.nope");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        tp_error_unref(err);
        err = NULL;
        tp_rref_unref(r);

        // to_here's own timeout: which RRef, which owner, how long.
        tp_args *in = args_i64(1500);
        TP_CHECK_OK(tp_remote(a, "bravo", "t.sleep", in, WAIT_MS, &r, &err),
                    err);
        int64_t t0 = tp_job_now_ms();
        st = tp_rref_to_here(r, 200, &v, &err);
        TP_CHECK_EQ(st, TP_ETIMEDOUT);
        TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(1400));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "to_here of RRef");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "owned by bravo (rank 1)");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "200 ms");
        tp_error_unref(err);
        err = NULL;
        // ... and the value still comes once it exists.
        v = here_ok(r);
        TP_CHECK_EQ(get_i64(v), 1500);
        tp_args_unref(v);
        tp_rref_unref(r);

        // A creation that times out: to_here says so, at once.
        TP_CHECK_OK(tp_remote(a, "bravo", "t.sleep", in, 200, &r, &err), err);
        st = tp_rref_wait_created(r, WAIT_MS, &err);
        TP_CHECK_EQ(st, TP_ETIMEDOUT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "timed out");
        tp_error_unref(err);
        err = NULL;
        t0 = tp_job_now_ms();
        TP_CHECK_EQ(tp_rref_to_here(r, WAIT_MS, &v, &err), TP_ETIMEDOUT);
        TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(500));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "to_here of RRef");
        tp_error_unref(err);
        err = NULL;
        tp_args_unref(in);
        tp_rref_unref(r);
        // The late value on the owner goes too.
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_errors(void)
{
    run(2, w_errors, NULL);
}

// A fork chain alpha -> bravo -> charlie -> delta, delta owning the value:
// each to_here sees it, the owner gets its own RRef back.
static void
w_fork_chain(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "delta", "t.make", 11);
        // alpha -> bravo (keeps it in slot 0).
        tp_args *in = args_rref(r, 0);
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rpc_sync(a, "bravo", "t.keep", in, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(in);
        // bravo -> charlie -> (t.here) and charlie -> delta, the owner.
        // "t.pass" on bravo passes its fork to charlie, whose "t.here"
        // fetches: 11 * 2 + 0 (not the owner).
        in = args_rref(r, 2);
        TP_CHECK_EQ(call_i64(a, 1, "t.pass", in), 22);
        tp_args_unref(in);
        // bravo passes to delta, the owner: it sees its own RRef.
        in = args_rref(r, 3);
        TP_CHECK_EQ(call_i64(a, 1, "t.pass", in), 23);
        tp_args_unref(in);
        // alpha -> charlie directly, while bravo still holds its fork.
        in = args_rref(r, 2);
        TP_CHECK_EQ(call_i64(a, 2, "t.here", in), 22);
        tp_args_unref(in);
        // And alpha's own still works.
        tp_args *v = here_ok(r);
        check_tensor(tp_args_tensor(v, 0), 11);
        tp_args_unref(v);
        // Let go everywhere: bravo's slot, then ours.
        tp_args *slot = args_i64(0);
        TP_CHECK_OK(
            tp_rpc_sync(a, "bravo", "t.drop", slot, WAIT_MS, NULL, &err), err);
        tp_args_unref(slot);
        tp_rref_unref(r);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_fork_chain(void)
{
    run(4, w_fork_chain, NULL);
}

// An RRef as the result of a call (the owner's own, created there), as an
// argument to a third worker, inside a value (nested), and to self.
static void
w_arg_and_result(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_args *in = args_i64(4);
        tp_args *out = NULL;
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rpc_sync(a, "bravo", "t.mkref", in, WAIT_MS, &out, &err),
                    err);
        tp_args_unref(in);
        TP_CHECK_EQ(tp_args_nrrefs(out), 1);
        tp_rref *r = tp_rref_ref(tp_args_rref(out, 0));
        tp_args_unref(out);
        TP_CHECK(!tp_rref_is_owner(r));
        TP_CHECK(strcmp(tp_rref_owner_name(r), "bravo") == 0);
        // From the owner itself: confirmed at once.
        TP_CHECK(tp_rref_confirmed_by_owner(r));
        tp_args *v = here_ok(r);
        check_tensor(tp_args_tensor(v, 0), 4);
        tp_args_unref(v);
        // As an argument to charlie, which fetches it.
        in = args_rref(r, 0);
        TP_CHECK_EQ(call_i64(a, 2, "t.here", in), 8);
        // ... and back from a call: tp.echo returns the same RRef.
        TP_CHECK_OK(
            tp_rpc_sync(a, "charlie", "tp.echo", in, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(tp_args_nrrefs(out), 1);
        v = here_ok(tp_args_rref(out, 0));
        check_tensor(tp_args_tensor(v, 0), 4);
        tp_args_unref(v);
        tp_args_unref(out);
        // An RRef inside a value: remote() of "t.mkref" keeps on bravo a
        // value holding bravo's own RRef; to_here forks that one to us.
        tp_rref *outer = remote_ok(a, "bravo", "t.mkref", 6);
        tp_args *ov = here_ok(outer);
        TP_CHECK_EQ(tp_args_nrrefs(ov), 1);
        tp_rref *inner = tp_args_rref(ov, 0);
        TP_CHECK(strcmp(tp_rref_owner_name(inner), "bravo") == 0);
        v = here_ok(inner);
        check_tensor(tp_args_tensor(v, 0), 6);
        tp_args_unref(v);
        tp_args_unref(ov);
        tp_rref_unref(outer);
        // To self: the same handle, no fork.
        TP_CHECK_OK(tp_rpc_sync(a, "alpha", "tp.echo", in, WAIT_MS, &out, &err),
                    err);
        TP_CHECK(tp_args_rref(out, 0) == r);
        tp_args_unref(out);
        tp_args_unref(in);
        tp_rref_unref(r);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_arg_and_result(void)
{
    run(3, w_arg_and_result, NULL);
}

#define MANY     10000
#define INFLIGHT 256

// 10 000 RRefs created and released (some forked to a third worker),
// every counter back to zero on every worker.
static void
w_many(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *win[INFLIGHT];
        int made = 0;
        while (made < MANY) {
            int n = MANY - made < INFLIGHT ? MANY - made : INFLIGHT;
            for (int i = 0; i < n; i++) {
                tp_error *err = NULL;
                TP_CHECK_OK(tp_remote_rank(a, 1 + (made + i) % 2, "tp.noop",
                                           NULL, WAIT_MS, &win[i], &err),
                            err);
            }
            // One of each window goes to charlie and back.
            tp_args *in = args_rref(win[0], 0);
            tp_args *out = NULL;
            tp_error *err = NULL;
            TP_CHECK_OK(
                tp_rpc_sync(a, "charlie", "tp.echo", in, WAIT_MS, &out, &err),
                err);
            tp_args_unref(out);
            tp_args_unref(in);
            for (int i = 0; i < n; i++) {
                tp_rref_unref(win[i]);
            }
            made += n;
        }
        int64_t v[8];
        stats_of(a, 1, v);
        TP_CHECKF(v[7] >= MANY / 2, "bravo created only %lld values",
                  (long long)v[7]);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_many(void)
{
    run(3, w_many, NULL);
}

// A user lets go of its RRef while a fork of it is in flight: the owner
// keeps the value for the child.
static void
w_delete_races_fork(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        for (int round = 0; round < 50; round++) {
            tp_rref *r = remote_ok(a, "bravo", "t.make", round);
            tp_args *in = args_rref(r, 0);
            tp_future *f = tp_rpc_async(a, "charlie", "t.here", in, WAIT_MS);
            tp_args_unref(in);
            tp_rref_unref(r); // before charlie even has it
            tp_args *out = NULL;
            tp_error *err = NULL;
            TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &out, &err), err);
            TP_CHECK_EQ(get_i64(out), round * 2);
            tp_args_unref(out);
            tp_future_unref(f);
        }
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_delete_races_fork(void)
{
    run(3, w_delete_races_fork, NULL);
}

// The owner dies (SIGKILL) while a user waits in to_here: the wait fails
// within about a second naming it, and later calls fail at once.
static void
w_owner_killed(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 1) {
        // Dies by the SIGKILL below, in the middle of the job.
        for (;;) {
            tp_job_sleep_ms(1000);
        }
    }
    tp_args *in = args_i64(10000);
    tp_rref *slow = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_remote(a, "bravo", "t.sleep", in, WAIT_MS, &slow, &err),
                err);
    tp_args_unref(in);
    tp_rref *made = remote_ok(a, "bravo", "t.make", 1);
    tp_args *v = here_ok(made);
    tp_args_unref(v);
    pid_t victim = (pid_t)call_i64(a, 1, "t.pid", NULL);
    int64_t t0 = tp_job_now_ms();
    kill(victim, SIGKILL);
    tp_status st = tp_rref_to_here(slow, WAIT_MS, &v, &err);
    int64_t took = tp_job_now_ms() - t0;
    TP_CHECKF(st != TP_OK && TP_STATUS_IS_CONN(st), "to_here: %s",
              tp_status_name(st));
    TP_CHECKF(took < tp_test_ms(3000), "to_here failed after %lld ms",
              (long long)took);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
    tp_error_unref(err);
    err = NULL;
    // Later: at once, naming the owner.
    t0 = tp_job_now_ms();
    st = tp_rref_to_here(made, WAIT_MS, &v, &err);
    TP_CHECK(st != TP_OK);
    TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(2000));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
    tp_error_unref(err);
    tp_rref_unref(slow);
    tp_rref_unref(made);
    TP_CHECK_OK(tp_rpc_shutdown(a, false, NULL), NULL);
}

static void
test_owner_killed(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_owner_killed, NULL);
    j.setup = setup;
    j.names = k_names;
    j.expect_sig[1] = SIGKILL;
    tp_job_run(&j);
}

// A user dies holding forks: the owner drops them, and the value goes.
static void
w_user_killed(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 2) {
        for (;;) {
            tp_job_sleep_ms(1000);
        }
    }
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "bravo", "t.make", 2);
        tp_args *in = args_rref(r, 0);
        tp_error *err = NULL;
        TP_CHECK_OK(
            tp_rpc_sync(a, "charlie", "t.keep", in, WAIT_MS, NULL, &err), err);
        tp_args_unref(in);
        tp_rref_unref(r);
        // bravo holds the value for charlie's fork.
        int64_t v[8];
        stats_of(a, 1, v);
        TP_CHECK_EQ(v[0], 1);
        kill((pid_t)call_i64(a, 2, "t.pid", NULL), SIGKILL);
        int64_t dl = tp_job_now_ms() + tp_test_ms(5000);
        do {
            tp_job_sleep_ms(10);
            stats_of(a, 1, v);
            TP_CHECKF(tp_job_now_ms() < dl,
                      "bravo still keeps %lld values for the dead charlie",
                      (long long)v[0]);
        } while (v[0] != 0 || v[2] != 0);
        TP_CHECK_OK(
            tp_rpc_sync(a, "bravo", "t.release", NULL, WAIT_MS, NULL, &err),
            err);
    } else {
        wait_release();
    }
    // The graceful agreement cannot include the dead worker.
    TP_CHECK_OK(tp_rpc_shutdown(a, false, NULL), NULL);
}

static void
test_user_killed(void)
{
    tp_job j;
    tp_job_tcp(&j, 3, w_user_killed, NULL);
    j.setup = setup;
    j.names = k_names;
    j.expect_sig[2] = SIGKILL;
    tp_job_run(&j);
}

// Graceful shutdown with RRefs alive: user RRefs the program still holds
// are deleted (their owners free the values); an owner RRef the program
// holds itself is reported, naming its creator.
static tp_rref *g_mine;

static void
w_shutdown_alive(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    tp_rref *held = NULL;
    if (rank == 0) {
        held = remote_ok(a, "bravo", "t.make", 1);
        tp_args *v = here_ok(held);
        tp_args_unref(v);
        tp_args *val = args_i64(5);
        TP_CHECK_OK(tp_rref_create(a, val, &g_mine, NULL), NULL);
        tp_args_unref(val);
        // charlie keeps a fork of bravo's value too.
        tp_args *in = args_rref(held, 1);
        TP_CHECK_OK(
            tp_rpc_sync(a, "charlie", "t.keep", in, WAIT_MS, NULL, NULL), NULL);
        tp_args_unref(in);
    }
    tp_error *err = NULL;
    tp_status st = tp_rpc_shutdown(a, true, &err);
    TP_CHECKF(st == TP_OK, "rank %d: shutdown: %s", rank,
              tp_error_message(err));
    if (rank == 0) {
        // Only our own RRef(5) is reported; bravo's value was freed.
        TP_CHECK_EQ(atomic_load(&g_leak_reports), 1);
        // The handles stay valid: the owner's value is still here.
        tp_args *lv = NULL;
        TP_CHECK_OK(tp_rref_local_value(g_mine, 1000, &lv, &err), err);
        TP_CHECK_EQ(get_i64(lv), 5);
        TP_CHECK(!tp_rref_is_owner(held));
        TP_CHECK_EQ(tp_rref_to_here(held, 1000, &lv, &err), TP_ECLOSED);
        tp_error_unref(err);
        tp_rref_unref(held);
        tp_rref_unref(g_mine);
    } else {
        TP_CHECK_EQ(atomic_load(&g_leak_reports), 0);
    }
    tp_rref_unref(atomic_exchange(&g_kept[1], NULL));
}

static void
test_shutdown_alive(void)
{
    run(3, w_shutdown_alive, NULL);
}

// Proxies: rref.rpc_sync(), rpc_async(), remote() run on the owner with
// the value as RRef 0.
static void
w_proxies(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "bravo", "t.make", 1);
        // sum of 1..16 = 136, plus the argument.
        tp_args *in = args_i64(1000);
        tp_args *out = NULL;
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rref_rpc_sync(r, "t.sum", in, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_future *f = tp_rref_rpc_async(r, "t.sum", in, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &out, &err), err);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_future_unref(f);
        // remote(): the result stays on bravo.
        tp_rref *s = NULL;
        TP_CHECK_OK(tp_rref_remote(r, "t.sum", in, WAIT_MS, &s, &err), err);
        TP_CHECK(strcmp(tp_rref_owner_name(s), "bravo") == 0);
        out = here_ok(s);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_rref_unref(s);
        // In place on the owner: the value changes there.
        tp_args *three = args_i64(3);
        TP_CHECK_OK(tp_rref_rpc_sync(r, "t.scale", three, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(three);
        out = here_ok(r);
        const float *p = tp_tensor_data(tp_args_tensor(out, 0));
        TP_CHECK(p[0] == 3.0f && p[15] == 48.0f);
        tp_args_unref(out);
        // An owner RRef of our own, through the same calls.
        tp_rref *mine = remote_ok(a, "alpha", "t.make", 1);
        TP_CHECK_OK(tp_rref_rpc_sync(mine, "t.sum", in, WAIT_MS, &out, &err),
                    err);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        TP_CHECK_OK(tp_rref_remote(mine, "t.sum", in, WAIT_MS, &s, &err), err);
        TP_CHECK(tp_rref_is_owner(s));
        out = here_ok(s);
        TP_CHECK_EQ(get_i64(out), 1136);
        tp_args_unref(out);
        tp_rref_unref(s);
        tp_rref_unref(mine);
        tp_args_unref(in);
        tp_rref_unref(r);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_proxies(void)
{
    run(2, w_proxies, NULL);
}

// Remote objects: construction, two methods, the parameters as RRefs and
// their update on the owner, errors, destruction through RRef deletion.
static void
w_objects(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        tp_args *in = args_i64(1);
        tp_rref *m = NULL;
        TP_CHECK_OK(
            tp_remote_create(a, "bravo", "t.linear", in, WAIT_MS, &m, &err),
            err);
        TP_CHECK(strcmp(tp_rref_owner_name(m), "bravo") == 0);
        // forward: w . x with w = 1..16 and x = 0..15.
        tp_args *x = NULL;
        TP_CHECK_OK(tp_args_create(NULL, 0, &x), NULL);
        tp_tensor *xt = f32_tensor(0);
        TP_CHECK_OK(tp_args_add_tensor(x, xt), NULL);
        tp_tensor_unref(xt);
        int64_t want = 0;
        for (int i = 0; i < NVALS; i++) {
            want += (int64_t)(1 + i) * i;
        }
        tp_args *out = NULL;
        TP_CHECK_OK(tp_remote_call(m, "forward", x, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(get_i64(out), want);
        tp_args_unref(out);
        tp_future *f = tp_remote_call_async(m, "forward", x, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &out, &err), err);
        TP_CHECK_EQ(get_i64(out), want);
        tp_args_unref(out);
        tp_future_unref(f);
        // parameters: an RRef to w, owned by bravo.
        TP_CHECK_OK(tp_remote_call(m, "parameters", NULL, WAIT_MS, &out, &err),
                    err);
        TP_CHECK_EQ(tp_args_nrrefs(out), 1);
        tp_rref *w = tp_rref_ref(tp_args_rref(out, 0));
        tp_args_unref(out);
        TP_CHECK(strcmp(tp_rref_owner_name(w), "bravo") == 0);
        out = here_ok(w);
        check_tensor(tp_args_tensor(out, 0), 1);
        tp_args_unref(out);
        // Updated on the owner through the parameter's RRef (what the
        // distributed optimizer does): forward sees it.
        tp_args *two = args_i64(2);
        TP_CHECK_OK(tp_rref_rpc_sync(w, "t.scale", two, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(two);
        TP_CHECK_OK(tp_remote_call(m, "forward", x, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(get_i64(out), 2 * want);
        tp_args_unref(out);
        // The object itself, copied by to_args: w = 2 * (1..16).
        out = here_ok(m);
        const float *wp = tp_tensor_data(tp_args_tensor(out, 0));
        for (int i = 0; i < NVALS; i++) {
            TP_CHECK(wp[i] == 2.0f * (float)(1 + i));
        }
        tp_args_unref(out);
        // Errors: a method the type lacks, a type a worker lacks, a
        // constructor that fails.
        TP_CHECK_EQ(tp_remote_call(m, "backward", x, WAIT_MS, &out, &err),
                    TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "backward");
        tp_error_unref(err);
        err = NULL;
        tp_rref *bad = NULL;
        TP_CHECK_EQ(
            tp_remote_create(a, "delta", "t.linear", in, WAIT_MS, &bad, &err),
            TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "t.linear");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "delta");
        TP_CHECK(bad == NULL);
        tp_error_unref(err);
        err = NULL;
        tp_args *neg = args_i64(-1);
        TP_CHECK_EQ(tp_remote_create(a, "charlie", "t.linear", neg, WAIT_MS,
                                     &bad, &err),
                    TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "negative init");
        tp_error_unref(err);
        err = NULL;
        tp_args_unref(neg);
        // A method on a plain value is refused here.
        TP_CHECK_EQ(tp_remote_call(w, "forward", x, WAIT_MS, &out, &err),
                    TP_EINVAL);
        tp_error_unref(err);
        err = NULL;
        // One object on bravo; an object owned here too.
        int64_t v[8];
        stats_of(a, 1, v);
        TP_CHECK_EQ(v[6], 1);
        tp_rref *local = NULL;
        TP_CHECK_OK(
            tp_remote_create(a, "alpha", "t.linear", in, WAIT_MS, &local, &err),
            err);
        void *state = NULL;
        TP_CHECK_OK(tp_rref_local_object(local, WAIT_MS, &state, &err), err);
        TP_CHECK(state != NULL);
        TP_CHECK_OK(tp_remote_call(local, "forward", x, WAIT_MS, &out, &err),
                    err);
        TP_CHECK_EQ(get_i64(out), want);
        tp_args_unref(out);
        tp_rref_unref(local);
        // Deleting the RRefs destroys the object on its owner.
        tp_rref_unref(w);
        tp_rref_unref(m);
        tp_args_unref(x);
        tp_args_unref(in);
        wait_settled(a, world, 0);
        TP_CHECK_EQ(atomic_load(&g_objects), 0);
    }
    leave(a);
}

static void
test_objects(void)
{
    run(4, w_objects, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_basic, 60),
    TP_TEST_CASE_T(test_errors, 60),
    TP_TEST_CASE_T(test_fork_chain, 60),
    TP_TEST_CASE_T(test_arg_and_result, 60),
    TP_TEST_CASE_T(test_many, 120),
    TP_TEST_CASE_T(test_delete_races_fork, 60),
    TP_TEST_CASE_T(test_owner_killed, 60),
    TP_TEST_CASE_T(test_user_killed, 60),
    TP_TEST_CASE_T(test_shutdown_alive, 60),
    TP_TEST_CASE_T(test_proxies, 60),
    TP_TEST_CASE_T(test_objects, 60),
};

TP_TEST_MAIN(cases)
