// SPDX-License-Identifier: Apache-2.0
// rpc_test.c - the RPC agent (rpc.h) across processes: init through
// tcp://, env:// and file:// with 2, 3 and 4 workers; worker infos and
// name checks; calls by name and by rank, to self, with bytes and tensors
// (0 B .. 16 MiB, a strided view); unknown functions and remote errors;
// per-call, default and no timeouts and late replies; nested calls and a
// chain over three workers; async handlers that do not hold a pool thread;
// the threads handlers and future callbacks run on; 1000 calls in flight;
// graceful shutdown with uneven work, abrupt shutdown, a worker that never
// shuts down, an init that never completes, a killed peer; counters and
// debug info; a raw pipe sending malformed agent messages.
//
// Every worker is a forked child of the case process, forked before any
// thread exists (TSan); each child registers the test functions, then
// calls tp_rpc_init. Loopback only; every wait has a deadline; a child
// that fails makes the parent kill the others and fail the case.
// test_malformed_peer: TP_RPC_TEST_VERBOSE=1 names each malformed message
// as it is sent; TP_RPC_TEST_GARBAGE=<substring> sends only those whose
// name contains it.

#include "tp_test.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/pipe.h>
#include <tpipe/rpc.h>
#include <tpipe/tensor.h>

#include "core/hash.h"
#include "core/platform.h"
#include "tp_test_job.h"
#include "tp_test_op.h"

#include "agent/agent_int.h" // tp__agent_listen_url

#define WAIT_MS   20000
#define MAX_WORLD 4

static const char *const k_names[MAX_WORLD] = {"alpha", "bravo", "charlie",
                                               "delta"};

// ---- per-process state of a worker ----------------------------------------

static int g_rank = -1;
static pthread_t g_main_thread;
static atomic_int g_release;       // set by "t.release"
static atomic_int g_sleep_started; // "t.sleep" handlers entered
static atomic_int g_sleep_done;    // ... and returned

// ---- small helpers ----------------------------------------------------------

static int64_t
now_ms(void)
{
    return tp_job_now_ms();
}

static void
sleep_ms(int64_t ms)
{
    tp_job_sleep_ms(ms);
}

static void
tcp_url(char *url, size_t n)
{
    snprintf(url, n, "tcp://127.0.0.1:%d", tp_test_free_port());
}

// True if @msg holds the decimal number @n as a whole token (not part of
// a longer number or of a dotted address such as 127.0.0.1).
static bool
has_number(const char *msg, int n)
{
    char want[16];
    int wl = snprintf(want, sizeof(want), "%d", n);
    for (const char *p = strstr(msg, want); p != NULL;
         p = strstr(p + 1, want)) {
        bool before =
            p > msg &&
            (isdigit((unsigned char)p[-1]) ||
             (p[-1] == '.' && p - 1 > msg && isdigit((unsigned char)p[-2])));
        bool after = isdigit((unsigned char)p[wl]) ||
                     (p[wl] == '.' && isdigit((unsigned char)p[wl + 1]));
        if (!before && !after) {
            return true;
        }
    }
    return false;
}

static void
thread_name(char *buf, size_t n)
{
    if (pthread_getname_np(pthread_self(), buf, n) != 0) {
        snprintf(buf, n, "?");
    }
}

// Names of the library's loop and I/O threads (core/loop.c "tp-<loop>",
// pipe/context.c loops "ctx" and "laneN", its "copy" pool, the store
// server's and the resolver's threads): handlers must run elsewhere.
static bool
is_io_thread_name(const char *n)
{
    static const char *const pfx[] = {"tp-ctx",   "tp-lane",    "tp-copy",
                                      "tp-store", "tp-resolve", "tp-bench"};
    for (size_t i = 0; i < sizeof(pfx) / sizeof(pfx[0]); i++) {
        if (strncmp(n, pfx[i], strlen(pfx[i])) == 0) {
            return true;
        }
    }
    return false;
}

// ---- args -------------------------------------------------------------------

static tp_args *
args_bytes(const void *p, size_t n)
{
    tp_args *x = NULL;
    TP_CHECK_OK(tp_args_create(p, n, &x), NULL);
    return x;
}

static tp_args *
args_str(const char *s)
{
    return args_bytes(s, strlen(s));
}

static tp_args *
args_i64(int64_t v)
{
    return args_bytes(&v, sizeof(v));
}

// The int64 an args holds; false if it holds something else.
static bool
args_get_i64(const tp_args *x, int64_t *v_p)
{
    size_t n = 0;
    const void *p = x ? tp_args_bytes(x, &n) : NULL;
    if (p == NULL || n != sizeof(int64_t)) {
        return false;
    }
    memcpy(v_p, p, sizeof(*v_p));
    return true;
}

static int64_t
want_i64(const tp_args *x)
{
    int64_t v = 0;
    TP_CHECKF(args_get_i64(x, &v), "rank %d: result is not an int64", g_rank);
    return v;
}

// Checks that @x (NULL = empty) holds exactly the bytes of @want.
static void
check_str(const tp_args *x, const char *want)
{
    size_t n = 0;
    const void *p = x ? tp_args_bytes(x, &n) : NULL;
    TP_CHECKF(n == strlen(want) && (n == 0 || memcmp(p, want, n) == 0),
              "rank %d: result \"%.*s\" (%zu bytes), want \"%s\"", g_rank,
              (int)(n > 200 ? 200 : n), p ? (const char *)p : "", n, want);
}

static void
args_push(tp_args *x, tp_tensor *t)
{
    TP_CHECK_OK(tp_args_add_tensor(x, t), NULL);
    tp_tensor_unref(t);
}

static void
args_free(void *p)
{
    tp_args_unref(p);
}

// ---- tensors ----------------------------------------------------------------

static uint8_t
pattern(size_t i, uint32_t seed)
{
    return (uint8_t)((i * 2654435761u + seed) >> 7);
}

static tp_tensor *
u8_tensor(int64_t n, uint32_t seed)
{
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_empty(TP_U8, 1, &n, &t, &err), err);
    uint8_t *d = tp_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        d[i] = pattern((size_t)i, seed);
    }
    return t;
}

static tp_tensor *
f32_tensor(int64_t r, int64_t c, float base)
{
    int64_t shape[2] = {r, c};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_empty(TP_F32, 2, shape, &t, &err), err);
    float *d = tp_tensor_data(t);
    for (int64_t i = 0; i < r * c; i++) {
        d[i] = base + 0.5f * (float)i;
    }
    return t;
}

// Checks @got has @want's dtype, shape and values (element by element in
// row-major order when @want is a strided view).
static void
check_tensor(const tp_tensor *got, const tp_tensor *want, const char *what)
{
    TP_CHECKF(got != NULL, "rank %d: %s: no tensor", g_rank, what);
    TP_CHECKF(tp_tensor_dtype(got) == tp_tensor_dtype(want),
              "rank %d: %s: dtype %s, want %s", g_rank, what,
              tp_dtype_name(tp_tensor_dtype(got)),
              tp_dtype_name(tp_tensor_dtype(want)));
    TP_CHECKF(tp_tensor_ndim(got) == tp_tensor_ndim(want),
              "rank %d: %s: ndim %d, want %d", g_rank, what,
              tp_tensor_ndim(got), tp_tensor_ndim(want));
    for (int d = 0; d < tp_tensor_ndim(want); d++) {
        TP_CHECKF(tp_tensor_size(got, d) == tp_tensor_size(want, d),
                  "rank %d: %s: size %d is %lld, want %lld", g_rank, what, d,
                  (long long)tp_tensor_size(got, d),
                  (long long)tp_tensor_size(want, d));
    }
    int64_t n = tp_tensor_numel(want);
    if (tp_tensor_is_contiguous(got) && tp_tensor_is_contiguous(want)) {
        size_t nb = tp_tensor_nbytes(want);
        TP_CHECK_EQ(tp_tensor_nbytes(got), nb);
        TP_CHECKF(nb == 0 || memcmp(tp_tensor_data(got), tp_tensor_data(want),
                                    nb) == 0,
                  "rank %d: %s: contents differ", g_rank, what);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        double a = 0, b = 0;
        TP_CHECK_OK(tp_tensor_item(got, i, &a), NULL);
        TP_CHECK_OK(tp_tensor_item(want, i, &b), NULL);
        TP_CHECKF(a == b, "rank %d: %s: element %lld is %g, want %g", g_rank,
                  what, (long long)i, a, b);
    }
}

// Checks @got (NULL = empty) carries @want's bytes and tensors.
static void
check_args(const tp_args *got, const tp_args *want, const char *what)
{
    size_t gn = 0, wn = 0;
    const void *gp = got ? tp_args_bytes(got, &gn) : NULL;
    const void *wp = want ? tp_args_bytes(want, &wn) : NULL;
    TP_CHECKF(gn == wn, "rank %d: %s: %zu bytes back, sent %zu", g_rank, what,
              gn, wn);
    TP_CHECKF(wn == 0 || memcmp(gp, wp, wn) == 0, "rank %d: %s: bytes differ",
              g_rank, what);
    size_t gt = got ? tp_args_ntensors(got) : 0;
    size_t wt = want ? tp_args_ntensors(want) : 0;
    TP_CHECKF(gt == wt, "rank %d: %s: %zu tensors back, sent %zu", g_rank, what,
              gt, wt);
    for (size_t i = 0; i < wt; i++) {
        char w[96];
        snprintf(w, sizeof(w), "%s: tensor %zu", what, i);
        check_tensor(tp_args_tensor(got, i), tp_args_tensor(want, i), w);
    }
}

// ---- the test functions -----------------------------------------------------

static tp_status
self_info(const tp_rpc_call_info *call, tp_worker_info *wi)
{
    return tp_rpc_get_worker_info(call->agent, NULL, wi);
}

// "t.sleep": sleeps the int64 ms it is given; returns "slept".
static tp_status
fn_sleep(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    int64_t ms = 0;
    if (!args_get_i64(in, &ms)) {
        *err_p = tp_error_create(TP_EINVAL, NULL, "t.sleep wants an int64");
        return TP_EINVAL;
    }
    atomic_fetch_add(&g_sleep_started, 1);
    sleep_ms(ms);
    atomic_fetch_add(&g_sleep_done, 1);
    return tp_args_create("slept", 5, out_p);
}

// How "t.fail", "t.fail_conn", "t.fail_ctx" and "t.fail_noerr" fail: a
// status and a message (none: no error object). Connection- and
// context-scope statuses must arrive as TP_EIO.
typedef struct fail_spec {
    tp_status status;
    const char *msg;
} fail_spec;

static const fail_spec k_fail = {TP_EINVAL, "bad thing 42"};
static const fail_spec k_fail_conn = {TP_ECONNRESET, "conn thing 7"};
static const fail_spec k_fail_ctx = {TP_EINTERNAL, "ctx thing 8"};
static const fail_spec k_fail_noerr = {TP_ENOTSUP, NULL};

static tp_status
fn_fail(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    const fail_spec *f = arg;
    if (f->msg != NULL) {
        *err_p = tp_error_create(f->status, NULL, "%s", f->msg);
    }
    return f->status;
}

// "t.make": result bytes "made by <name>" and two tensors.
static tp_status
fn_make(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    tp_worker_info me;
    tp_status st = self_info(call, &me);
    if (st != TP_OK) {
        return st;
    }
    char buf[200];
    snprintf(buf, sizeof(buf), "made by %s", me.name);
    tp_args *out = NULL;
    if ((st = tp_args_create(buf, strlen(buf), &out)) != TP_OK) {
        return st;
    }
    tp_tensor *t1 = NULL, *t2 = NULL;
    int64_t shape[2] = {2, 3};
    if ((st = tp_tensor_arange(TP_I32, 0, 100, 1, &t1, err_p)) != TP_OK ||
        (st = tp_tensor_full(TP_F64, 2, shape, 2.5, &t2, err_p)) != TP_OK ||
        (st = tp_args_add_tensor(out, t1)) != TP_OK ||
        (st = tp_args_add_tensor(out, t2)) != TP_OK) {
        tp_tensor_unref(t1);
        tp_tensor_unref(t2);
        tp_args_unref(out);
        return st;
    }
    tp_tensor_unref(t1);
    tp_tensor_unref(t2);
    *out_p = out;
    return TP_OK;
}

// "t.info": "fn|caller|caller rank|call id|thread name|main or other",
// after sleeping the int64 ms given (if any).
static tp_status
fn_info(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    int64_t ms = 0;
    if (args_get_i64(in, &ms)) {
        sleep_ms(ms);
    }
    char tn[32];
    thread_name(tn, sizeof(tn));
    char buf[512];
    snprintf(buf, sizeof(buf), "%s|%s|%d|%llu|%s|%s", call->fn_name,
             call->caller ? call->caller->name : "(null)",
             call->caller ? call->caller->rank : -1,
             (unsigned long long)call->call_id, tn,
             pthread_equal(pthread_self(), g_main_thread) ? "main" : "other");
    return tp_args_create(buf, strlen(buf), out_p);
}

// "t.bounce": calls "tp.add" back on the caller with its tensors (A -> B
// -> A) and returns the sum.
static tp_status
fn_bounce(const tp_rpc_call_info *call, const tp_args *in, void *arg,
          tp_args **out_p, tp_error **err_p)
{
    tp_error *e = NULL;
    tp_args *res = NULL;
    tp_status st = tp_rpc_sync(call->agent, call->caller->name, "tp.add", in,
                               TP_TIMEOUT_DEFAULT, &res, &e);
    if (st != TP_OK) {
        *err_p = tp_error_create(st, e, "bounce to %s", call->caller->name);
        tp_error_unref(e);
        return st;
    }
    *out_p = res;
    return TP_OK;
}

// "t.chain": given hops h, returns this worker's name if h == 0, else
// "<name>>" followed by the result of "t.chain" (h - 1) on the next rank.
static tp_status
fn_chain(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    int64_t hops = 0;
    tp_worker_info me;
    tp_status st;
    if (!args_get_i64(in, &hops) || (st = self_info(call, &me)) != TP_OK) {
        *err_p = tp_error_create(TP_EINVAL, NULL, "t.chain: bad input");
        return TP_EINVAL;
    }
    if (hops == 0) {
        return tp_args_create(me.name, strlen(me.name), out_p);
    }
    int next = (me.rank + 1) % tp_rpc_world_size(call->agent);
    int64_t h = hops - 1;
    tp_args *a = NULL, *res = NULL;
    if ((st = tp_args_create(&h, sizeof(h), &a)) != TP_OK) {
        return st;
    }
    tp_error *e = NULL;
    st = tp_rpc_sync_rank(call->agent, next, "t.chain", a, TP_TIMEOUT_DEFAULT,
                          &res, &e);
    tp_args_unref(a);
    if (st != TP_OK) {
        *err_p = tp_error_create(st, e, "chain at %s", me.name);
        tp_error_unref(e);
        return st;
    }
    size_t n = 0;
    const char *r = res ? tp_args_bytes(res, &n) : "";
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s>%.*s", me.name, (int)n, r);
    tp_args_unref(res);
    return tp_args_create(buf, strlen(buf), out_p);
}

// "t.stats": this worker's counters for the caller, as the raw struct.
static tp_status
fn_stats(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    tp_rpc_peer_stats st;
    memset(&st, 0, sizeof(st));
    tp_status s = tp_rpc_get_peer_stats(call->agent, call->caller->rank, &st);
    if (s != TP_OK) {
        return s;
    }
    return tp_args_create(&st, sizeof(st), out_p);
}

// "t.url": this worker's listener URL (tp__agent_listen_url).
static tp_status
fn_url(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    const char *u = tp__agent_listen_url(call->agent);
    if (u == NULL) {
        *err_p = tp_error_create(TP_ENOENT, NULL, "no listen url");
        return TP_ENOENT;
    }
    return tp_args_create(u, strlen(u), out_p);
}

// "t.release": lets this worker's main thread go on.
static tp_status
fn_release(const tp_rpc_call_info *call, const tp_args *in, void *arg,
           tp_args **out_p, tp_error **err_p)
{
    atomic_store(&g_release, 1);
    return TP_OK;
}

// "t.die": SIGKILLs this process (a peer dying with calls pending).
static tp_status
fn_die(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    kill(getpid(), SIGKILL);
    sleep_ms(10000);
    return TP_OK;
}

// Async handlers. "t.async" stores its future; a completer thread
// resolves all of them only once ASYNC_N calls have reached the handler,
// which can only happen if pending async handlers do not hold the pool's
// ASYNC_THREADS threads.
#define ASYNC_N       32
#define ASYNC_THREADS 4

static pthread_mutex_t g_async_mtx = PTHREAD_MUTEX_INITIALIZER;
static int g_async_arrived;
static tp_future *g_async_f[ASYNC_N];
static int64_t g_async_v[ASYNC_N];

static tp_future *
fn_async(const tp_rpc_call_info *call, const tp_args *in, void *arg)
{
    tp_future *f = NULL;
    if (tp_future_create(&f) != TP_OK) {
        return NULL;
    }
    int64_t v = -1;
    (void)args_get_i64(in, &v);
    pthread_mutex_lock(&g_async_mtx);
    if (g_async_arrived < ASYNC_N) {
        g_async_f[g_async_arrived] = tp_future_ref(f);
        g_async_v[g_async_arrived] = v;
        g_async_arrived++;
        pthread_mutex_unlock(&g_async_mtx);
        return f;
    }
    pthread_mutex_unlock(&g_async_mtx);
    tp_error *e = tp_error_create(TP_EINVAL, NULL, "too many t.async calls");
    tp_future_set_error(f, e);
    tp_error_unref(e);
    return f;
}

static void *
async_completer(void *arg)
{
    int64_t dl = now_ms() + tp_test_ms(15000);
    int n = 0;
    for (;;) {
        pthread_mutex_lock(&g_async_mtx);
        n = g_async_arrived;
        pthread_mutex_unlock(&g_async_mtx);
        if (n == ASYNC_N || now_ms() > dl) {
            break;
        }
        sleep_ms(2);
    }
    sleep_ms(100);
    for (int i = 0; i < n; i++) {
        if (n == ASYNC_N) {
            tp_args *r = NULL;
            int64_t v = g_async_v[i] * 7;
            if (tp_args_create(&v, sizeof(v), &r) == TP_OK) {
                tp_future_set_value(g_async_f[i], r, args_free);
            }
        } else {
            tp_error *e = tp_error_create(
                TP_EINTERNAL, NULL,
                "only %d of %d t.async calls reached the handler in 15 s: "
                "pending async handlers hold the pool threads",
                n, ASYNC_N);
            tp_future_set_error(g_async_f[i], e);
            tp_error_unref(e);
        }
        tp_future_unref(g_async_f[i]);
    }
    return NULL;
}

// "t.async_err": a future that fails (already resolved).
static tp_future *
fn_async_err(const tp_rpc_call_info *call, const tp_args *in, void *arg)
{
    tp_future *f = NULL;
    if (tp_future_create(&f) != TP_OK) {
        return NULL;
    }
    tp_error *e = tp_error_create(TP_EINVAL, NULL, "async bad %d", 9);
    tp_future_set_error(f, e);
    tp_error_unref(e);
    return f;
}

// "t.async_null": no future at all (TP_ENOMEM to the caller).
static tp_future *
fn_async_null(const tp_rpc_call_info *call, const tp_args *in, void *arg)
{
    return NULL;
}

static void
register_fns(void)
{
    static const struct {
        const char *name;
        tp_rpc_fn fn;
    } fns[] = {
        {"t.sleep", fn_sleep}, {"t.make", fn_make},
        {"t.info", fn_info},   {"t.bounce", fn_bounce},
        {"t.chain", fn_chain}, {"t.stats", fn_stats},
        {"t.url", fn_url},     {"t.release", fn_release},
        {"t.die", fn_die},
    };
    tp_error *err = NULL;
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        TP_CHECK_OK(tp_rpc_register(fns[i].name, fns[i].fn, NULL, &err), err);
    }
    static const struct {
        const char *name;
        const fail_spec *spec;
    } fails[] = {
        {"t.fail", &k_fail},
        {"t.fail_conn", &k_fail_conn},
        {"t.fail_ctx", &k_fail_ctx},
        {"t.fail_noerr", &k_fail_noerr},
    };
    for (size_t i = 0; i < sizeof(fails) / sizeof(fails[0]); i++) {
        TP_CHECK_OK(tp_rpc_register(fails[i].name, fn_fail,
                                    (void *)fails[i].spec, &err),
                    err);
    }
    TP_CHECK_OK(tp_rpc_register_async("t.async", fn_async, NULL, &err), err);
    TP_CHECK_OK(tp_rpc_register_async("t.async_err", fn_async_err, NULL, &err),
                err);
    TP_CHECK_OK(
        tp_rpc_register_async("t.async_null", fn_async_null, NULL, &err), err);
}

// ---- workers ----------------------------------------------------------------

static void
opts_init(tp_agent_options *o, const char *url)
{
    tp_agent_options_init(o);
    o->init_method = url;
    o->init_timeout_ms = tp_test_ms(WAIT_MS);
    o->shutdown_timeout_ms = tp_test_ms(WAIT_MS);
}

static tp_agent *
join_opts(int rank, int world, const tp_agent_options *o)
{
    tp_agent *a = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_init(k_names[rank], rank, world, o, &a, &err);
    TP_CHECKF(st == TP_OK, "rank %d: tp_rpc_init(%s): %s: %s", rank,
              o->init_method, tp_status_name(st), tp_error_message(err));
    TP_CHECK(a != NULL);
    return a;
}

static tp_agent *
join(int rank, int world, const char *url)
{
    tp_agent_options o;
    opts_init(&o, url);
    return join_opts(rank, world, &o);
}

static void
leave(tp_agent *a)
{
    tp_error *err = NULL;
    tp_status st = tp_rpc_shutdown(a, true, &err);
    TP_CHECKF(st == TP_OK, "rank %d: graceful shutdown: %s: %s", g_rank,
              tp_status_name(st), tp_error_message(err));
}

static void
wait_release(int64_t ms)
{
    int64_t dl = now_ms() + tp_test_ms(ms);
    while (atomic_load(&g_release) == 0) {
        TP_CHECKF(now_ms() < dl, "rank %d: not released in %lld ms", g_rank,
                  (long long)ms);
        sleep_ms(2);
    }
}

// Calls "t.release" on @to; its failure is only reported (the peer may
// close right after).
static void
release(tp_agent *a, int to)
{
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync_rank(a, to, "t.release", NULL, 5000, NULL, &err);
    if (st != TP_OK) {
        fprintf(stderr, "rank %d: release %d: %s\n", g_rank, to,
                tp_error_message(err));
    }
    tp_error_unref(err);
}

static tp_args *
call_ok(tp_agent *a, const char *to, const char *fn, const tp_args *in,
        int64_t timeout_ms)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync(a, to, fn, in, timeout_ms, &out, &err);
    TP_CHECKF(st == TP_OK, "rank %d: %s on %s: %s: %s", g_rank, fn, to,
              tp_status_name(st), tp_error_message(err));
    return out;
}

static tp_args *
call_rank_ok(tp_agent *a, int to, const char *fn, const tp_args *in,
             int64_t timeout_ms)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync_rank(a, to, fn, in, timeout_ms, &out, &err);
    TP_CHECKF(st == TP_OK, "rank %d: %s on rank %d: %s: %s", g_rank, fn, to,
              tp_status_name(st), tp_error_message(err));
    return out;
}

// A call that must fail with @want: returns its error (caller unrefs).
static tp_error *
call_fails(tp_agent *a, const char *to, const char *fn, const tp_args *in,
           int64_t timeout_ms, tp_status want)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync(a, to, fn, in, timeout_ms, &out, &err);
    TP_CHECKF(st == want, "rank %d: %s on %s: %s (%s), want %s", g_rank, fn, to,
              tp_status_name(st), tp_error_message(err), tp_status_name(want));
    TP_CHECK(out == NULL);
    TP_CHECK(err != NULL);
    return err;
}

static tp_args *
wait_ok(tp_future *f, const char *what)
{
    TP_CHECKF(f != NULL, "rank %d: %s: no future", g_rank, what);
    tp_args *out = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_wait(f, tp_test_ms(WAIT_MS), &out, &err);
    TP_CHECKF(st == TP_OK, "rank %d: %s: %s: %s", g_rank, what,
              tp_status_name(st), tp_error_message(err));
    return out;
}

// ---- running a job of forked workers ---------------------------------------

typedef tp_job job;

static void
job_setup(int rank)
{
    g_rank = rank;
    g_main_thread = pthread_self();
    register_fns();
}

static void
job_tcp(job *j, int world, tp_job_fn fn, void *arg)
{
    tp_job_tcp(j, world, fn, arg);
    j->setup = job_setup;
    j->names = k_names;
}

static void
job_run(job *j)
{
    tp_job_run(j);
}

static void
run_tcp(int world, tp_job_fn fn, void *arg)
{
    job j;
    job_tcp(&j, world, fn, arg);
    job_run(&j);
}

// ---- cases: args, options, registration, names (one process) ---------------

static void
test_args(void)
{
    tp_args *x = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &x), NULL);
    size_t n = 99;
    (void)tp_args_bytes(x, &n);
    TP_CHECK_EQ(n, 0);
    TP_CHECK_EQ(tp_args_ntensors(x), 0);
    tp_args_unref(x);
    x = NULL;
    TP_CHECK_EQ(tp_args_create(NULL, 5, &x), TP_EINVAL);
    TP_CHECK(x == NULL);

    char buf[8] = "abcdefg";
    TP_CHECK_OK(tp_args_create(buf, 7, &x), NULL);
    buf[0] = 'X'; // the args hold a copy
    const char *b = tp_args_bytes(x, &n);
    TP_CHECK_EQ(n, 7);
    TP_CHECK(memcmp(b, "abcdefg", 7) == 0);
    tp_tensor *t = u8_tensor(10, 1);
    TP_CHECK_OK(tp_args_add_tensor(x, t), NULL);
    TP_CHECK_EQ(tp_args_ntensors(x), 1);
    TP_CHECK(tp_args_tensor(x, 0) == t);
    TP_CHECK_EQ(tp_args_add_tensor(x, NULL), TP_EINVAL);
    TP_CHECK(tp_args_ref(x) == x);
    tp_args_unref(x);
    tp_args_unref(x);
    tp_tensor_unref(t); // still valid after the args took theirs
    tp_args_unref(NULL);

    // At most TP_RPC_MAX_TENSORS tensors.
    TP_CHECK_OK(tp_args_create(NULL, 0, &x), NULL);
    t = u8_tensor(1, 0);
    for (int i = 0; i < TP_RPC_MAX_TENSORS; i++) {
        TP_CHECK_OK(tp_args_add_tensor(x, t), NULL);
    }
    TP_CHECK_EQ(tp_args_add_tensor(x, t), TP_EINVAL);
    TP_CHECK_EQ(tp_args_ntensors(x), TP_RPC_MAX_TENSORS);
    tp_args_unref(x);
    tp_tensor_unref(t);
}

static void
test_options(void)
{
    unsetenv("TP_NUM_WORKER_THREADS");
    unsetenv("TP_RPC_TIMEOUT_MS");
    unsetenv("TP_INIT_METHOD");
    unsetenv("TP_RPC_INIT_TIMEOUT_MS");
    unsetenv("TP_RPC_SHUTDOWN_TIMEOUT_MS");
    tp_agent_options o;
    tp_agent_options_init(&o);
    TP_CHECK_EQ(o.num_worker_threads, 16);
    TP_CHECK_EQ(o.rpc_timeout_ms, 60000);
    TP_CHECK_EQ(o.init_timeout_ms, 60000);
    TP_CHECK_EQ(o.shutdown_timeout_ms, 60000);
    TP_CHECK(o.init_method != NULL && strcmp(o.init_method, "env://") == 0);
    setenv("TP_NUM_WORKER_THREADS", "3", 1);
    setenv("TP_RPC_TIMEOUT_MS", "250", 1);
    setenv("TP_INIT_METHOD", "file:///tmp/x", 1);
    setenv("TP_RPC_INIT_TIMEOUT_MS", "1234", 1);
    setenv("TP_RPC_SHUTDOWN_TIMEOUT_MS", "4321", 1);
    tp_agent_options_init(&o);
    TP_CHECK_EQ(o.num_worker_threads, 3);
    TP_CHECK_EQ(o.rpc_timeout_ms, 250);
    TP_CHECK_EQ(o.init_timeout_ms, 1234);
    TP_CHECK_EQ(o.shutdown_timeout_ms, 4321);
    TP_CHECK(o.init_method != NULL &&
             strcmp(o.init_method, "file:///tmp/x") == 0);
}

static tp_status
fn_other(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    return TP_OK;
}

static void
test_register(void)
{
    tp_error *err = NULL;
    char long_name[TP_RPC_MAX_FN_NAME + 2];
    memset(long_name, 'f', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    const char *bad[] = {"", "a b", "x\ny", "caf\xc3\xa9", long_name};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        TP_CHECKF(tp_rpc_register(bad[i], fn_other, NULL, &err) == TP_EINVAL,
                  "function name \"%.20s\" accepted", bad[i]);
        tp_error_unref(err);
        err = NULL;
    }
    long_name[TP_RPC_MAX_FN_NAME] = '\0'; // 255 bytes: fine
    TP_CHECK_OK(tp_rpc_register(long_name, fn_other, NULL, &err), err);
    TP_CHECK_OK(tp_rpc_register("a-b_c.d:e/f", fn_other, NULL, &err), err);
    // The same function again: a no-op; another one: taken.
    TP_CHECK_OK(tp_rpc_register("a-b_c.d:e/f", fn_other, NULL, &err), err);
    TP_CHECK_EQ(tp_rpc_register("a-b_c.d:e/f", fn_fail, NULL, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_rpc_register("a-b_c.d:e/f", fn_other, &err, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    // Builtins are taken.
    TP_CHECK_EQ(tp_rpc_register("tp.echo", fn_other, NULL, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_rpc_register_async("a-b_c.d:e/f", fn_async, NULL, &err),
                TP_EINVAL);
    tp_error_unref(err);
}

// Bad names, ranks and init methods fail at once with TP_EINVAL.
static void
test_bad_init(void)
{
    char url[64];
    tcp_url(url, sizeof(url));
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = 3000;
    char n128[TP_RPC_MAX_NAME + 2];
    memset(n128, 'n', sizeof(n128) - 1);
    n128[sizeof(n128) - 1] = '\0';
    TP_CHECK_EQ(strlen(n128), 128);
    const char *bad[] = {"", n128, "a b", "x/y", "a.b", "caf\xc3\xa9", NULL};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tp_agent *a = NULL;
        tp_error *err = NULL;
        int64_t t0 = now_ms();
        tp_status st = tp_rpc_init(bad[i], 0, 1, &o, &a, &err);
        TP_CHECKF(st == TP_EINVAL, "name \"%s\": %s (%s), want TP_EINVAL",
                  bad[i] ? bad[i] : "(null)", tp_status_name(st),
                  tp_error_message(err));
        TP_CHECK(a == NULL);
        TP_CHECKF(now_ms() - t0 < 2000, "name check took %lld ms",
                  (long long)(now_ms() - t0));
        tp_error_unref(err);
    }
    struct {
        int rank, world;
    } br[] = {{1, 1}, {0, 0}, {-1, 2}, {2, 2}, {-1, -1}};
    for (size_t i = 0; i < sizeof(br) / sizeof(br[0]); i++) {
        tp_agent *a = NULL;
        tp_error *err = NULL;
        tp_status st = tp_rpc_init("ok", br[i].rank, br[i].world, &o, &a, &err);
        TP_CHECKF(st == TP_EINVAL, "rank %d world %d: %s (%s), want TP_EINVAL",
                  br[i].rank, br[i].world, tp_status_name(st),
                  tp_error_message(err));
        tp_error_unref(err);
    }
    tp_agent_options bo = o;
    bo.init_method = "udp://127.0.0.1:1";
    tp_agent *a = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_rpc_init("ok", 0, 1, &bo, &a, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    bo = o;
    bo.num_worker_threads = 0;
    TP_CHECK_EQ(tp_rpc_init("ok", 0, 1, &bo, &a, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    bo = o;
    bo.transports = "carrier-pigeon";
    tp_status st = tp_rpc_init("ok", 0, 1, &bo, &a, &err);
    TP_CHECKF(st != TP_OK, "unknown transport accepted");
    tp_error_unref(err);
}

// A world of one with the longest name and every allowed character: the
// worker calls itself.
static void
test_world_of_one(void)
{
    char url[64];
    tcp_url(url, sizeof(url));
    tp_agent_options o;
    opts_init(&o, url);
    char name[TP_RPC_MAX_NAME + 1];
    memset(name, 'w', TP_RPC_MAX_NAME);
    name[TP_RPC_MAX_NAME] = '\0';
    memcpy(name, "a-B_9:z", 7);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    g_rank = 0;
    register_fns();
    TP_CHECK_OK(tp_rpc_init(name, 0, 1, &o, &a, &err), err);
    TP_CHECK_EQ(tp_rpc_world_size(a), 1);
    tp_worker_info wi;
    TP_CHECK_OK(tp_rpc_get_worker_info(a, NULL, &wi), NULL);
    TP_CHECK(strcmp(wi.name, name) == 0);
    TP_CHECK_EQ(wi.rank, 0);
    tp_args *r = call_ok(a, name, "tp.noop", NULL, 5000);
    tp_args_unref(r);
    tp_args *in = args_str("me");
    r = call_rank_ok(a, 0, "tp.echo", in, 5000);
    check_str(r, "me");
    tp_args_unref(r);
    tp_args_unref(in);
    leave(a);
}

// ---- cases: init and worker infos -------------------------------------------

// Every worker checks the infos of all, then calls tp.noop on everyone
// (itself too) by name and by rank.
static void info_fields(const tp_args *r, char f[6][160]);

static void
worker_infos(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    // Right after init, every other worker already knows this one: its
    // handlers see this worker as the caller.
    for (int r = 0; r < world; r++) {
        char f[6][160];
        tp_args *res = call_rank_ok(a, r, "t.info", NULL, WAIT_MS);
        info_fields(res, f);
        TP_CHECKF(strcmp(f[1], k_names[rank]) == 0 && atoi(f[2]) == rank,
                  "rank %d: %s saw the caller as \"%s\" (rank %s)", rank,
                  k_names[r], f[1], f[2]);
        tp_args_unref(res);
    }
    TP_CHECK_EQ(tp_rpc_world_size(a), world);
    tp_worker_info wi;
    TP_CHECK_OK(tp_rpc_get_worker_info(a, NULL, &wi), NULL);
    TP_CHECK(strcmp(wi.name, k_names[rank]) == 0);
    TP_CHECK_EQ(wi.rank, rank);
    for (int r = 0; r < world; r++) {
        memset(&wi, 0, sizeof(wi));
        TP_CHECK_OK(tp_rpc_get_worker_info(a, k_names[r], &wi), NULL);
        TP_CHECK(strcmp(wi.name, k_names[r]) == 0);
        TP_CHECK_EQ(wi.rank, r);
        memset(&wi, 0, sizeof(wi));
        TP_CHECK_OK(tp_rpc_get_worker_info_by_rank(a, r, &wi), NULL);
        TP_CHECK(strcmp(wi.name, k_names[r]) == 0);
        TP_CHECK_EQ(wi.rank, r);
    }
    TP_CHECK_EQ(tp_rpc_get_worker_info(a, "zulu", &wi), TP_ENOENT);
    TP_CHECK_EQ(tp_rpc_get_worker_info_by_rank(a, world, &wi), TP_ENOENT);
    TP_CHECK_EQ(tp_rpc_get_worker_info_by_rank(a, -1, &wi), TP_ENOENT);
    tp_worker_info all[MAX_WORLD + 1];
    memset(all, 0, sizeof(all));
    TP_CHECK_EQ(tp_rpc_get_worker_infos(a, all, MAX_WORLD + 1), world);
    for (int r = 0; r < world; r++) {
        TP_CHECK(strcmp(all[r].name, k_names[r]) == 0);
        TP_CHECK_EQ(all[r].rank, r);
    }
    memset(all, 0, sizeof(all));
    TP_CHECK_EQ(tp_rpc_get_worker_infos(a, all, 1), world);
    TP_CHECK(strcmp(all[0].name, k_names[0]) == 0);
    TP_CHECK(all[1].name[0] == '\0'); // only @n written
    for (int r = 0; r < world; r++) {
        tp_args_unref(call_ok(a, k_names[r], "tp.noop", NULL, WAIT_MS));
        tp_args_unref(call_rank_ok(a, r, "tp.noop", NULL, WAIT_MS));
    }
    leave(a);
}

static void
test_init_tcp_4(void)
{
    run_tcp(4, worker_infos, NULL);
}

static void
test_init_tcp_2(void)
{
    run_tcp(2, worker_infos, NULL);
}

static void
test_init_file_3(void)
{
    char path[] = "/tmp/tp_rpc_init_XXXXXX";
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    // file:// says nothing about the network: keep the pipes on loopback.
    setenv("TP_SOCKET_IFNAME", "lo", 1);
    job j;
    job_tcp(&j, 3, worker_infos, NULL);
    snprintf(j.url, sizeof(j.url), "file://%s", path);
    job_run(&j);
    unlink(path);
}

static void
worker_env(int rank, int world, const char *url, void *arg)
{
    const char *clear[] = {"SLURM_PROCID",         "SLURM_NTASKS",
                           "SLURM_LOCALID",        "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof(clear) / sizeof(clear[0]); i++) {
        unsetenv(clear[i]);
    }
    char v[16];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", world);
    setenv("WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", url, 1); // the port only (see test_init_env_2)
    tp_agent_options o;
    opts_init(&o, "env://");
    tp_agent *a = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_init(k_names[rank], -1, -1, &o, &a, &err);
    TP_CHECKF(st == TP_OK, "rank %d: env:// init: %s: %s", rank,
              tp_status_name(st), tp_error_message(err));
    tp_worker_info wi;
    TP_CHECK_OK(tp_rpc_get_worker_info(a, NULL, &wi), NULL);
    TP_CHECK_EQ(wi.rank, rank);
    TP_CHECK_EQ(tp_rpc_world_size(a), world);
    char msg[32];
    snprintf(msg, sizeof(msg), "from %d", rank);
    tp_args *in = args_str(msg);
    tp_args *r = call_ok(a, k_names[1 - rank], "tp.echo", in, WAIT_MS);
    check_str(r, msg);
    tp_args_unref(r);
    tp_args_unref(in);
    leave(a);
}

static void
test_init_env_2(void)
{
    job j;
    job_tcp(&j, 2, worker_env, NULL);
    snprintf(j.url, sizeof(j.url), "%d", tp_test_free_port());
    job_run(&j);
}

// Two ranks named "dup": init fails on every worker, naming both ranks.
static void
worker_dup(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = tp_test_ms(15000);
    const char *name = rank == 0 ? "solo" : "dup";
    tp_agent *a = NULL;
    tp_error *err = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_init(name, rank, world, &o, &a, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_EINVAL, "rank %d: init with a duplicate name: %s (%s)",
              rank, tp_status_name(st), tp_error_message(err));
    TP_CHECK(a == NULL);
    const char *m = tp_error_message(err);
    TP_CHECK_STR_CONTAINS(m, "dup");
    TP_CHECKF(has_number(m, 1) && has_number(m, 2),
              "rank %d: \"%s\" does not name ranks 1 and 2", rank, m);
    TP_CHECKF(dt < tp_test_ms(8000),
              "rank %d: the duplicate was found after %lld ms", rank,
              (long long)dt);
    tp_error_unref(err);
}

static void
test_init_duplicate_name(void)
{
    run_tcp(3, worker_dup, NULL);
}

// world 3, only ranks 0 and 1 start: both time out, naming rank 2.
static void
worker_init_timeout(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = 1500;
    tp_agent *a = NULL;
    tp_error *err = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_init(k_names[rank], rank, world, &o, &a, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_ETIMEDOUT, "rank %d: init without rank 2: %s (%s)", rank,
              tp_status_name(st), tp_error_message(err));
    TP_CHECK(a == NULL);
    const char *m = tp_error_message(err);
    TP_CHECKF(has_number(m, 2) && strstr(m, "rank") != NULL,
              "rank %d: \"%s\" does not name the missing rank 2", rank, m);
    TP_CHECKF(dt >= 1000 && dt < tp_test_ms(6000),
              "rank %d: init gave up after %lld ms (timeout 1500)", rank,
              (long long)dt);
    tp_error_unref(err);
}

static void
test_init_timeout(void)
{
    job j;
    job_tcp(&j, 3, worker_init_timeout, NULL);
    j.nstart = 2;
    job_run(&j);
}

// ---- cases: calls -----------------------------------------------------------

static void
echo_check(tp_agent *a, int to, tp_args *in, const char *what, int how)
{
    tp_args *r = NULL;
    switch (how % 4) {
    case 0:
        r = call_ok(a, k_names[to], "tp.echo", in, WAIT_MS);
        break;
    case 1:
        r = call_rank_ok(a, to, "tp.echo", in, WAIT_MS);
        break;
    case 2: {
        tp_future *f = tp_rpc_async(a, k_names[to], "tp.echo", in, WAIT_MS);
        r = wait_ok(f, what);
        tp_future_unref(f);
        break;
    }
    default: {
        tp_future *f = tp_rpc_async_rank(a, to, "tp.echo", in, WAIT_MS);
        r = wait_ok(f, what);
        // The future's own value is the same result.
        TP_CHECK(tp_future_value(f) == r);
        tp_future_unref(f);
        break;
    }
    }
    check_args(r, in, what);
    tp_args_unref(r);
}

static void
echo_all(tp_agent *a, int to)
{
    int how = 0;
    echo_check(a, to, NULL, "no args", how++);
    tp_args *in = args_str("");
    echo_check(a, to, in, "empty bytes", how++);
    tp_args_unref(in);
    in = args_str("hello");
    echo_check(a, to, in, "bytes", how++);
    tp_args_unref(in);

    uint8_t big[100000];
    for (size_t i = 0; i < sizeof(big); i++) {
        big[i] = pattern(i, 3);
    }
    in = args_bytes(big, sizeof(big));
    args_push(in, f32_tensor(3, 4, 1.0f));
    echo_check(a, to, in, "bytes + one tensor", how++);
    tp_args_unref(in);

    static const int64_t sizes[] = {0, 1, 64 << 10, 16 << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        in = args_str("one");
        args_push(in, u8_tensor(sizes[i], (uint32_t)i));
        char w[64];
        snprintf(w, sizeof(w), "one tensor of %lld bytes", (long long)sizes[i]);
        echo_check(a, to, in, w, how++);
        tp_args_unref(in);
    }
    in = args_str("several");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        args_push(in, u8_tensor(sizes[i], (uint32_t)(10 + i)));
    }
    int64_t shape[3] = {2, 3, 4};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_full(TP_F64, 3, shape, -1.25, &t, &err), err);
    args_push(in, t);
    TP_CHECK_OK(tp_tensor_arange(TP_I64, -5, 5, 1, &t, &err), err);
    args_push(in, t);
    echo_check(a, to, in, "several tensors", how++);
    tp_args_unref(in);

    // A strided view (transposed) arrives with its logical contents.
    tp_tensor *base = f32_tensor(3, 5, 0.0f), *v = NULL;
    TP_CHECK_OK(tp_tensor_transpose(base, 0, 1, &v, &err), err);
    TP_CHECK(!tp_tensor_is_contiguous(v));
    in = args_str("view");
    args_push(in, v);
    echo_check(a, to, in, "transposed view", how++);
    tp_args_unref(in);
    tp_tensor_unref(base);
}

static void
add_check(tp_agent *a, int to)
{
    tp_args *in = args_str("");
    args_push(in, f32_tensor(4, 8, 1.0f));
    args_push(in, f32_tensor(4, 8, 100.0f));
    tp_args *r = call_rank_ok(a, to, "tp.add", in, WAIT_MS);
    TP_CHECK_EQ(tp_args_ntensors(r), 1);
    tp_tensor *s = tp_args_tensor(r, 0);
    TP_CHECK_EQ(tp_tensor_dtype(s), TP_F32);
    TP_CHECK_EQ(tp_tensor_ndim(s), 2);
    TP_CHECK_EQ(tp_tensor_size(s, 0), 4);
    TP_CHECK_EQ(tp_tensor_size(s, 1), 8);
    for (int64_t i = 0; i < 32; i++) {
        double v = 0;
        TP_CHECK_OK(tp_tensor_item(s, i, &v), NULL);
        TP_CHECKF(v == 101.0 + 1.0 * (double)i, "tp.add[%lld] = %g",
                  (long long)i, v);
    }
    tp_args_unref(r);
    tp_args_unref(in);

    tp_error *err = NULL;
    tp_tensor *x = NULL, *y = NULL;
    TP_CHECK_OK(tp_tensor_arange(TP_I64, 0, 1000, 1, &x, &err), err);
    TP_CHECK_OK(tp_tensor_arange(TP_I64, 0, 2000, 2, &y, &err), err);
    in = args_str("");
    args_push(in, x);
    args_push(in, y);
    r = call_ok(a, k_names[to], "tp.add", in, WAIT_MS);
    TP_CHECK_EQ(tp_args_ntensors(r), 1);
    TP_CHECK_EQ(tp_tensor_dtype(tp_args_tensor(r, 0)), TP_I64);
    const int64_t *d = tp_tensor_data(tp_args_tensor(r, 0));
    for (int64_t i = 0; i < 1000; i++) {
        TP_CHECK_EQ(d[i], 3 * i);
    }
    tp_args_unref(r);
    tp_args_unref(in);

    // Shapes that do not match fail, and only that call.
    in = args_str("");
    args_push(in, f32_tensor(2, 2, 0.0f));
    args_push(in, f32_tensor(3, 3, 0.0f));
    tp_args *out = NULL;
    tp_status st = tp_rpc_sync_rank(a, to, "tp.add", in, WAIT_MS, &out, &err);
    TP_CHECKF(st != TP_OK && !TP_STATUS_IS_CONN(st),
              "tp.add of 2x2 and 3x3: %s", tp_status_name(st));
    tp_error_unref(err);
    tp_args_unref(in);
}

static void
make_check(tp_agent *a, int to)
{
    tp_args *r = call_rank_ok(a, to, "t.make", NULL, WAIT_MS);
    char want[64];
    snprintf(want, sizeof(want), "made by %s", k_names[to]);
    check_str(r, want);
    TP_CHECK_EQ(tp_args_ntensors(r), 2);
    tp_tensor *t = tp_args_tensor(r, 0);
    TP_CHECK_EQ(tp_tensor_dtype(t), TP_I32);
    TP_CHECK_EQ(tp_tensor_numel(t), 100);
    const int32_t *d = tp_tensor_data(t);
    for (int i = 0; i < 100; i++) {
        TP_CHECK_EQ(d[i], i);
    }
    t = tp_args_tensor(r, 1);
    TP_CHECK_EQ(tp_tensor_dtype(t), TP_F64);
    TP_CHECK_EQ(tp_tensor_ndim(t), 2);
    TP_CHECK_EQ(tp_tensor_size(t, 0), 2);
    TP_CHECK_EQ(tp_tensor_size(t, 1), 3);
    const double *dd = tp_tensor_data(t);
    for (int i = 0; i < 6; i++) {
        TP_CHECK(dd[i] == 2.5);
    }
    tp_args_unref(r);
}

// Rank 0 calls rank 1 and itself; rank 1 calls rank 0 at the same time.
static void
worker_calls(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    int peer = 1 - rank;
    echo_all(a, peer);
    add_check(a, peer);
    make_check(a, peer);
    if (rank == 0) {
        echo_all(a, 0); // self
        add_check(a, 0);
        make_check(a, 0);
    }
    leave(a);
}

static void
test_calls(void)
{
    run_tcp(2, worker_calls, NULL);
}

// Unknown workers and functions, remote errors.
static void
worker_errors(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *e =
            call_fails(a, "bravo", "t.nope", NULL, WAIT_MS, TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "t.nope");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        // A valid name nobody registered, on self too.
        e = call_fails(a, "alpha", "t.nope", NULL, WAIT_MS, TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "t.nope");
        tp_error_unref(e);
        // An unknown worker, by name and by rank.
        e = call_fails(a, "zulu", "tp.noop", NULL, WAIT_MS, TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "zulu");
        tp_error_unref(e);
        tp_error *err = NULL;
        TP_CHECK_EQ(
            tp_rpc_sync_rank(a, 7, "tp.noop", NULL, WAIT_MS, NULL, &err),
            TP_ENOENT);
        tp_error_unref(err);
        err = NULL;
        tp_future *f = tp_rpc_async_rank(a, -3, "tp.noop", NULL, WAIT_MS);
        TP_CHECK(f != NULL);
        TP_CHECK_EQ(tp_rpc_wait(f, WAIT_MS, NULL, &err), TP_ENOENT);
        tp_error_unref(err);
        err = NULL;
        tp_future_unref(f);

        // The remote handler's status and message, with the worker.
        e = call_fails(a, "bravo", "t.fail", NULL, WAIT_MS, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bad thing 42");
        tp_error_unref(e);
        f = tp_rpc_async(a, "bravo", "t.fail", NULL, WAIT_MS);
        TP_CHECK_EQ(tp_rpc_wait(f, WAIT_MS, NULL, &err), TP_EINVAL);
        TP_CHECK_EQ(tp_error_status(tp_future_error(f)), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(tp_future_error(f)),
                              "bad thing 42");
        tp_error_unref(err);
        err = NULL;
        tp_future_unref(f);
        // Self: same shape of error.
        e = call_fails(a, "alpha", "t.fail", NULL, WAIT_MS, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "alpha");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bad thing 42");
        tp_error_unref(e);
        // A connection-scope status of a handler arrives as TP_EIO.
        e = call_fails(a, "bravo", "t.fail_conn", NULL, WAIT_MS, TP_EIO);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "conn thing 7");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        e = call_fails(a, "bravo", "t.fail_ctx", NULL, WAIT_MS, TP_EIO);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "ctx thing 8");
        tp_error_unref(e);
        // No error object: the status still arrives, naming the worker.
        e = call_fails(a, "bravo", "t.fail_noerr", NULL, WAIT_MS, TP_ENOTSUP);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        // Async handlers that fail.
        e = call_fails(a, "bravo", "t.async_err", NULL, WAIT_MS, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "async bad 9");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        e = call_fails(a, "bravo", "t.async_null", NULL, WAIT_MS, TP_ENOMEM);
        tp_error_unref(e);
        // The pipe is fine after all of that.
        tp_args *in = args_str("still here");
        tp_args *r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
        check_str(r, "still here");
        tp_args_unref(r);
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_errors(void)
{
    run_tcp(2, worker_errors, NULL);
}

// ---- cases: timeouts --------------------------------------------------------

static void
worker_timeout(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_args *in = args_i64(2000);
        int64_t t0 = now_ms();
        tp_error *e = call_fails(a, "bravo", "t.sleep", in, 200, TP_ETIMEDOUT);
        int64_t dt = now_ms() - t0;
        const char *m = tp_error_message(e);
        TP_CHECK_STR_CONTAINS(m, "RPC ran for more than set timeout (200 ms)");
        TP_CHECK_STR_CONTAINS(m, "t.sleep");
        TP_CHECK_STR_CONTAINS(m, "bravo");
        TP_CHECKF(dt < tp_test_ms(1500), "a 200 ms timeout fired after %lld ms",
                  (long long)dt);
        tp_error_unref(e);
        tp_args_unref(in);

        // The same through a future, by rank.
        in = args_i64(1500);
        tp_future *f = tp_rpc_async_rank(a, 1, "t.sleep", in, 300);
        tp_error *err = NULL;
        TP_CHECK_EQ(tp_rpc_wait(f, WAIT_MS, NULL, &err), TP_ETIMEDOUT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "(300 ms)");
        tp_error_unref(err);
        err = NULL;
        tp_future_unref(f);
        tp_args_unref(in);

        // Other calls work while the late replies are outstanding ...
        in = args_str("meanwhile");
        tp_args *r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
        check_str(r, "meanwhile");
        tp_args_unref(r);
        // ... and after they arrived and were dropped.
        sleep_ms(2300 - (now_ms() - t0) > 0 ? 2300 - (now_ms() - t0) : 0);
        r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
        check_str(r, "meanwhile");
        tp_args_unref(r);
        tp_args_unref(in);
        in = args_i64(10);
        r = call_ok(a, "bravo", "t.sleep", in, WAIT_MS);
        check_str(r, "slept");
        tp_args_unref(r);
        tp_args_unref(in);

        // A self call times out the same way.
        in = args_i64(800);
        e = call_fails(a, "alpha", "t.sleep", in, 100, TP_ETIMEDOUT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "(100 ms)");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "alpha");
        tp_error_unref(e);
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_timeout_per_call(void)
{
    run_tcp(2, worker_timeout, NULL);
}

// rpc_timeout_ms 100 is the default; 0 per call means none.
static void
worker_timeout_default(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    if (rank == 0) {
        o.rpc_timeout_ms = 100;
    }
    tp_agent *a = join_opts(rank, world, &o);
    if (rank == 0) {
        tp_args *in = args_i64(500);
        int64_t t0 = now_ms();
        tp_error *e = call_fails(a, "bravo", "t.sleep", in, TP_TIMEOUT_DEFAULT,
                                 TP_ETIMEDOUT);
        int64_t dt = now_ms() - t0;
        TP_CHECK_STR_CONTAINS(tp_error_message(e),
                              "RPC ran for more than set timeout (100 ms)");
        TP_CHECKF(dt < tp_test_ms(1500), "a 100 ms timeout fired after %lld ms",
                  (long long)dt);
        tp_error_unref(e);
        // 0: no limit.
        tp_args *r = call_ok(a, "bravo", "t.sleep", in, 0);
        check_str(r, "slept");
        tp_args_unref(r);
        tp_future *f = tp_rpc_async_rank(a, 1, "t.sleep", in, 0);
        // Waiting less than the call takes is a wait timeout, not the
        // call's: the call still succeeds.
        tp_error *err = NULL;
        TP_CHECK_EQ(tp_rpc_wait(f, 50, NULL, &err), TP_ETIMEDOUT);
        tp_error_unref(err);
        r = wait_ok(f, "t.sleep with no timeout");
        check_str(r, "slept");
        tp_args_unref(r);
        tp_future_unref(f);
        // An explicit timeout longer than the call.
        r = call_ok(a, "bravo", "t.sleep", in, 5000);
        check_str(r, "slept");
        tp_args_unref(r);
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_timeout_default_and_none(void)
{
    run_tcp(2, worker_timeout_default, NULL);
}

// ---- cases: nested calls ----------------------------------------------------

#define NCHAINS 4
#define NHOPS   5

static void
worker_nested(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0 || rank == 1) {
        // A -> B -> A, from both ends at once.
        int peer = 1 - rank;
        for (int i = 0; i < 5; i++) {
            tp_args *in = args_str("");
            args_push(in, f32_tensor(2, 3, (float)i));
            args_push(in, f32_tensor(2, 3, 10.0f));
            tp_args *r = call_rank_ok(a, peer, "t.bounce", in, WAIT_MS);
            TP_CHECK_EQ(tp_args_ntensors(r), 1);
            for (int64_t k = 0; k < 6; k++) {
                double v = 0;
                TP_CHECK_OK(tp_tensor_item(tp_args_tensor(r, 0), k, &v), NULL);
                TP_CHECK(v == (double)i + 10.0 + (double)k);
            }
            tp_args_unref(r);
            tp_args_unref(in);
        }
    }
    if (rank == 0) {
        // Chains over the three workers, several at once.
        tp_future *f[NCHAINS];
        tp_args *in = args_i64(NHOPS);
        for (int i = 0; i < NCHAINS; i++) {
            f[i] = tp_rpc_async_rank(a, 1, "t.chain", in, WAIT_MS);
        }
        char want[256] = "";
        for (int h = 0, r = 1; h <= NHOPS; h++, r = (r + 1) % world) {
            strcat(want, k_names[r]);
            if (h < NHOPS) {
                strcat(want, ">");
            }
        }
        for (int i = 0; i < NCHAINS; i++) {
            tp_args *r = wait_ok(f[i], "t.chain");
            check_str(r, want);
            tp_args_unref(r);
            tp_future_unref(f[i]);
        }
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_nested(void)
{
    run_tcp(3, worker_nested, NULL);
}

// ---- cases: async handlers --------------------------------------------------

static void
worker_async(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    o.num_worker_threads = ASYNC_THREADS;
    pthread_t completer;
    if (rank == 1) {
        TP_CHECK(pthread_create(&completer, NULL, async_completer, NULL) == 0);
    }
    tp_agent *a = join_opts(rank, world, &o);
    if (rank == 0) {
        tp_future *f[ASYNC_N];
        for (int i = 0; i < ASYNC_N; i++) {
            tp_args *in = args_i64(i);
            f[i] = tp_rpc_async(a, "bravo", "t.async", in, WAIT_MS);
            TP_CHECK(f[i] != NULL);
            tp_args_unref(in); // the call keeps its reference
        }
        for (int i = 0; i < ASYNC_N; i++) {
            tp_args *r = wait_ok(f[i], "t.async");
            TP_CHECK_EQ(want_i64(r), 7 * i);
            tp_args_unref(r);
            tp_future_unref(f[i]);
        }
    }
    leave(a);
    if (rank == 1) {
        pthread_join(completer, NULL);
        TP_CHECK_EQ(g_async_arrived, ASYNC_N);
    }
}

static void
test_async_handler(void)
{
    run_tcp(2, worker_async, NULL);
}

// ---- cases: threads ---------------------------------------------------------

typedef struct then_rec {
    atomic_int done;
    char name[32];
} then_rec;

static void
then_cb(tp_future *f, void *arg)
{
    then_rec *t = arg;
    thread_name(t->name, sizeof(t->name));
    atomic_store(&t->done, 1);
}

// Splits "fn|caller|rank|id|thread|main" into its fields.
static void
info_fields(const tp_args *r, char f[6][160])
{
    size_t n = 0;
    const char *p = tp_args_bytes(r, &n);
    char buf[600];
    TP_CHECK(n < sizeof(buf));
    memcpy(buf, p, n);
    buf[n] = '\0';
    char *cur = buf;
    for (int i = 0; i < 6; i++) {
        TP_CHECKF(cur != NULL, "t.info result \"%s\"", buf);
        char *bar = strchr(cur, '|');
        if (bar != NULL) {
            *bar = '\0';
        }
        snprintf(f[i], 160, "%.159s", cur);
        cur = bar != NULL ? bar + 1 : NULL;
    }
}

static void
worker_threads(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        char f[6][160];
        char main_name[32];
        thread_name(main_name, sizeof(main_name));
        unsigned long long ids[2];
        for (int to = 0; to < 2; to++) { // bravo, then self
            int dest = 1 - to;
            for (int k = 0; k < 2; k++) {
                tp_args *r = call_rank_ok(a, dest, "t.info", NULL, WAIT_MS);
                info_fields(r, f);
                TP_CHECK(strcmp(f[0], "t.info") == 0);
                TP_CHECK(strcmp(f[1], "alpha") == 0);
                TP_CHECK(strcmp(f[2], "0") == 0);
                ids[k] = strtoull(f[3], NULL, 10);
                TP_CHECKF(!is_io_thread_name(f[4]),
                          "handler on %s ran on thread \"%s\"", k_names[dest],
                          f[4]);
                TP_CHECKF(strcmp(f[4], main_name) != 0,
                          "handler on %s ran on a main thread (\"%s\")",
                          k_names[dest], f[4]);
                if (dest == 0) {
                    TP_CHECKF(strcmp(f[5], "other") == 0,
                              "a self call ran on the caller's thread");
                }
                tp_args_unref(r);
            }
            TP_CHECKF(ids[0] != ids[1], "two calls with call id %llu", ids[0]);
        }
        // Callbacks of RPC futures run on the pool too.
        for (int dest = 1; dest >= 0; dest--) {
            then_rec t = {.name = ""};
            atomic_init(&t.done, 0);
            tp_args *in = args_i64(200);
            tp_future *fu = tp_rpc_async_rank(a, dest, "t.info", in, WAIT_MS);
            TP_CHECK_OK(tp_future_then(fu, then_cb, &t), NULL);
            tp_args_unref(wait_ok(fu, "t.info"));
            int64_t dl = now_ms() + tp_test_ms(5000);
            while (atomic_load(&t.done) == 0) {
                TP_CHECK(now_ms() < dl);
                sleep_ms(1);
            }
            TP_CHECKF(!is_io_thread_name(t.name),
                      "an RPC future callback ran on thread \"%s\"", t.name);
            TP_CHECKF(strcmp(t.name, main_name) != 0,
                      "an RPC future callback ran on the main thread");
            tp_future_unref(fu);
            tp_args_unref(in);
        }
    }
    leave(a);
}

static void
test_threads(void)
{
    run_tcp(2, worker_threads, NULL);
}

// ---- cases: many calls ------------------------------------------------------

#define NMANY 1000

static tp_future *
many_send(tp_agent *a, int i, int to)
{
    if (i % 2 == 0) {
        int64_t v = (int64_t)i * 1000 + to;
        tp_args *in = args_i64(v);
        tp_future *f = tp_rpc_async_rank(a, to, "tp.echo", in, WAIT_MS);
        tp_args_unref(in);
        return f;
    }
    int64_t four = 4;
    tp_tensor *x = NULL, *y = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_full(TP_F64, 1, &four, (double)i, &x, &err), err);
    TP_CHECK_OK(tp_tensor_full(TP_F64, 1, &four, 2.0 * i, &y, &err), err);
    tp_args *in = args_str("");
    args_push(in, x);
    args_push(in, y);
    tp_future *f = tp_rpc_async_rank(a, to, "tp.add", in, WAIT_MS);
    tp_args_unref(in);
    return f;
}

static void
many_check(tp_future *f, int i, int to)
{
    char w[64];
    snprintf(w, sizeof(w), "call %d to rank %d", i, to);
    tp_args *r = wait_ok(f, w);
    if (i % 2 == 0) {
        TP_CHECK_EQ(want_i64(r), (int64_t)i * 1000 + to);
    } else {
        TP_CHECK_EQ(tp_args_ntensors(r), 1);
        const double *d = tp_tensor_data(tp_args_tensor(r, 0));
        for (int k = 0; k < 4; k++) {
            TP_CHECKF(d[k] == 3.0 * i, "%s: %g", w, d[k]);
        }
    }
    tp_args_unref(r);
    tp_future_unref(f);
}

static void
worker_many(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    int n = rank == 0 ? NMANY : 100;
    tp_future **f = calloc((size_t)n, sizeof(*f));
    TP_CHECK(f != NULL);
    for (int i = 0; i < n; i++) {
        int to = (rank + 1 + i % (world - 1)) % world;
        f[i] = many_send(a, i, to);
        TP_CHECK(f[i] != NULL);
    }
    for (int i = 0; i < n; i++) {
        many_check(f[i], i, (rank + 1 + i % (world - 1)) % world);
    }
    free(f);
    leave(a);
}

static void
test_many_in_flight(void)
{
    run_tcp(4, worker_many, NULL);
}

// ---- cases: shutdown --------------------------------------------------------

// alpha and charlie shut down at once; bravo, released by alpha right
// before its shutdown, keeps calling charlie for a second.
static void
worker_graceful(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        release(a, 1);
    }
    if (rank == 1) {
        wait_release(WAIT_MS);
        int64_t t0 = now_ms();
        int calls = 0;
        tp_args *in = args_str("late");
        while (now_ms() - t0 < 1000) {
            tp_args *r = call_ok(a, "charlie", "tp.echo", in, WAIT_MS);
            check_str(r, "late");
            tp_args_unref(r);
            calls++;
        }
        TP_CHECKF(calls >= 5, "only %d calls in a second", calls);
        tp_args_unref(in);
        // A call still outstanding when this worker shuts down: the
        // graceful shutdown waits for it.
        in = args_i64(300);
        tp_future *f = tp_rpc_async(a, "charlie", "t.sleep", in, WAIT_MS);
        leave(a);
        TP_CHECKF(tp_future_is_done(f), "graceful shutdown returned with a "
                                        "call outstanding");
        tp_args *r = wait_ok(f, "t.sleep outstanding at shutdown");
        check_str(r, "slept");
        tp_args_unref(r);
        tp_future_unref(f);
        tp_args_unref(in);
        return;
    }
    leave(a);
}

static void
test_shutdown_graceful_uneven(void)
{
    run_tcp(3, worker_graceful, NULL);
}

// alpha shuts down abruptly with three calls pending on bravo.
static void
worker_abrupt(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    tp_error *err = NULL;
    if (rank == 0) {
        tp_future *f[3];
        tp_args *in = args_i64(1500);
        for (int i = 0; i < 3; i++) {
            f[i] = tp_rpc_async(a, "bravo", "t.sleep", in, WAIT_MS);
        }
        sleep_ms(300);
        int64_t t0 = now_ms();
        tp_status st = tp_rpc_shutdown(a, false, &err);
        int64_t dt = now_ms() - t0;
        TP_CHECKF(st == TP_OK, "abrupt shutdown: %s: %s", tp_status_name(st),
                  tp_error_message(err));
        TP_CHECKF(dt < tp_test_ms(2000),
                  "abrupt shutdown took %lld ms with calls pending",
                  (long long)dt);
        for (int i = 0; i < 3; i++) {
            st = tp_rpc_wait(f[i], tp_test_ms(2000), NULL, &err);
            TP_CHECKF(st == TP_ECLOSED, "pending call %d: %s (%s)", i,
                      tp_status_name(st), tp_error_message(err));
            tp_error_unref(err);
            err = NULL;
            tp_future_unref(f[i]);
        }
        tp_args_unref(in);
        return;
    }
    // bravo: the handlers finish (their replies have nowhere to go), then
    // it closes too, without waiting for alpha.
    int64_t dl = now_ms() + tp_test_ms(WAIT_MS);
    while (atomic_load(&g_sleep_done) < 3) {
        TP_CHECKF(now_ms() < dl, "t.sleep handlers did not finish");
        sleep_ms(5);
    }
    sleep_ms(200);
    tp_status st = tp_rpc_shutdown(a, false, &err);
    TP_CHECKF(st == TP_OK, "abrupt shutdown of bravo: %s: %s",
              tp_status_name(st), tp_error_message(err));
}

static void
test_shutdown_abrupt(void)
{
    run_tcp(2, worker_abrupt, NULL);
}

// charlie never shuts down: the others' graceful shutdowns give up at
// shutdown_timeout_ms, naming it.
static void
worker_no_shutdown(int rank, int world, const char *url, void *arg)
{
    // alpha hosts the store: it waits longer, so that bravo's shutdown
    // ends on its own deadline rather than on the store going away.
    int64_t limit = rank == 0 ? 3000 : 1500;
    tp_agent_options o;
    opts_init(&o, url);
    o.shutdown_timeout_ms = limit;
    tp_agent *a = join_opts(rank, world, &o);
    if (rank == 2) {
        sleep_ms(tp_test_ms(60000)); // killed by the parent
        TP_CHECKF(false, "charlie was not killed");
    }
    tp_args_unref(call_ok(a, "charlie", "tp.noop", NULL, WAIT_MS));
    tp_error *err = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_shutdown(a, true, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_ETIMEDOUT,
              "rank %d: graceful shutdown without charlie: %s (%s)", rank,
              tp_status_name(st), tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "charlie");
    TP_CHECKF(dt >= limit - 500 && dt < limit + tp_test_ms(3500),
              "rank %d: shutdown gave up after %lld ms (timeout %lld)", rank,
              (long long)dt, (long long)limit);
    tp_error_unref(err);
}

static void
test_shutdown_timeout(void)
{
    job j;
    job_tcp(&j, 3, worker_no_shutdown, NULL);
    j.kill_last[2] = true;
    job_run(&j);
}

// ---- cases: a peer killed with calls pending --------------------------------

static void
worker_killed(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 1) {
        sleep_ms(tp_test_ms(60000)); // t.die kills it before
        TP_CHECKF(false, "bravo is still alive");
    }
    if (rank == 2) {
        wait_release(WAIT_MS);
        sleep_ms(100);
        tp_error *err = NULL;
        (void)tp_rpc_shutdown(a, false, &err);
        tp_error_unref(err);
        return;
    }
    tp_future *f[5];
    tp_args *in = args_i64(30000);
    for (int i = 0; i < 4; i++) {
        f[i] = tp_rpc_async(a, "bravo", "t.sleep", in, 0);
    }
    // Make sure they reached bravo before it dies.
    tp_args_unref(call_ok(a, "bravo", "tp.noop", NULL, WAIT_MS));
    f[4] = tp_rpc_async(a, "bravo", "t.die", NULL, 0);
    int64_t t0 = now_ms();
    for (int i = 0; i < 5; i++) {
        tp_error *err = NULL;
        tp_status st = tp_rpc_wait(f[i], tp_test_ms(15000), NULL, &err);
        int64_t dt = now_ms() - t0;
        TP_CHECKF(TP_STATUS_IS_CONN(st),
                  "call %d to the killed bravo: %s (%s), want a "
                  "connection-scope status",
                  i, tp_status_name(st), tp_error_message(err));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        TP_CHECKF(dt < 5000, "call %d failed %lld ms after bravo died", i,
                  (long long)dt);
        tp_error_unref(err);
        tp_future_unref(f[i]);
    }
    tp_args_unref(in);
    // Others keep working; new calls to bravo fail fast.
    in = args_str("alive");
    for (int i = 0; i < 10; i++) {
        tp_args *r = call_ok(a, "charlie", "tp.echo", in, WAIT_MS);
        check_str(r, "alive");
        tp_args_unref(r);
    }
    int64_t t1 = now_ms();
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync(a, "bravo", "tp.echo", in, WAIT_MS, NULL, &err);
    TP_CHECKF(st != TP_OK && st != TP_ETIMEDOUT,
              "call to the dead bravo: %s (%s)", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
    TP_CHECKF(now_ms() - t1 < 5000, "a call to the dead bravo took %lld ms",
              (long long)(now_ms() - t1));
    tp_error_unref(err);
    err = NULL;
    // Calling the dead worker again and again makes a connection each
    // time, which fails: the failed ones are freed, not kept.
    for (int i = 0; i < 50; i++) {
        st = tp_rpc_sync(a, "bravo", "tp.noop", NULL, WAIT_MS, NULL, &err);
        TP_CHECKF(st != TP_OK && st != TP_ETIMEDOUT,
                  "call %d to the dead bravo: %s (%s)", i, tp_status_name(st),
                  tp_error_message(err));
        tp_error_unref(err);
        err = NULL;
    }
    size_t nconns = tp__agent_nconns(a);
    TP_CHECKF(nconns <= 6, "%zu connections kept after 50 failed calls",
              nconns);
    tp_args_unref(in);
    tp_rpc_peer_stats ps;
    TP_CHECK_OK(tp_rpc_get_peer_stats(a, 1, &ps), NULL);
    TP_CHECKF(ps.errors >= 5, "errors to bravo: %llu",
              (unsigned long long)ps.errors);
    TP_CHECK_EQ(ps.pending, 0);
    release(a, 2);
    (void)tp_rpc_shutdown(a, false, &err);
    tp_error_unref(err);
}

static void
test_peer_killed(void)
{
    job j;
    job_tcp(&j, 3, worker_killed, NULL);
    j.expect_sig[1] = SIGKILL;
    job_run(&j);
}

// ---- cases: counters --------------------------------------------------------

#define NSTAT 10

static void
worker_stats(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        char payload[1000];
        memset(payload, 'p', sizeof(payload));
        tp_args *in = args_bytes(payload, sizeof(payload));
        for (int i = 0; i < NSTAT; i++) {
            tp_args_unref(call_ok(a, "bravo", "tp.echo", in, WAIT_MS));
        }
        tp_args_unref(in);
        tp_error_unref(
            call_fails(a, "bravo", "t.fail", NULL, WAIT_MS, TP_EINVAL));
        // bravo's view: NSTAT + 1 calls received (+1 if it counts the
        // t.stats call itself).
        tp_args *r = call_ok(a, "bravo", "t.stats", NULL, WAIT_MS);
        size_t n = 0;
        const void *p = tp_args_bytes(r, &n);
        tp_rpc_peer_stats bs;
        TP_CHECK_EQ(n, sizeof(bs));
        memcpy(&bs, p, sizeof(bs));
        tp_args_unref(r);
        TP_CHECK(strcmp(bs.peer.name, "alpha") == 0);
        TP_CHECK_EQ(bs.peer.rank, 0);
        TP_CHECKF(bs.calls_received == NSTAT + 1 ||
                      bs.calls_received == NSTAT + 2,
                  "bravo: calls_received %llu, want %d",
                  (unsigned long long)bs.calls_received, NSTAT + 1);
        TP_CHECK_EQ(bs.calls_sent, 0);
        TP_CHECKF(bs.bytes_received >= NSTAT * sizeof(payload),
                  "bravo: bytes_received %llu",
                  (unsigned long long)bs.bytes_received);
        TP_CHECKF(bs.bytes_sent >= NSTAT * sizeof(payload),
                  "bravo: bytes_sent %llu", (unsigned long long)bs.bytes_sent);

        tp_error_unref(
            call_fails(a, "bravo", "t.nope", NULL, WAIT_MS, TP_ENOENT));
        in = args_i64(1000);
        tp_error_unref(
            call_fails(a, "bravo", "t.sleep", in, 100, TP_ETIMEDOUT));
        tp_args_unref(in);

        tp_rpc_peer_stats st;
        memset(&st, 0, sizeof(st));
        TP_CHECK_OK(tp_rpc_get_peer_stats(a, 1, &st), NULL);
        TP_CHECK(strcmp(st.peer.name, "bravo") == 0);
        TP_CHECK_EQ(st.peer.rank, 1);
        int sent = NSTAT + 4; // echo, t.fail, t.stats, t.nope, t.sleep
        TP_CHECKF(st.calls_sent == (uint64_t)sent, "calls_sent %llu, want %d",
                  (unsigned long long)st.calls_sent, sent);
        TP_CHECK_EQ(st.calls_received, 0);
        TP_CHECKF(st.errors == 3,
                  "errors %llu, want 3 (t.fail, t.nope, "
                  "t.sleep)",
                  (unsigned long long)st.errors);
        TP_CHECK_EQ(st.timeouts, 1);
        TP_CHECK_EQ(st.pending, 0);
        TP_CHECK(st.bytes_sent >= NSTAT * 1000);
        TP_CHECK(st.bytes_received >= NSTAT * 1000);
        TP_CHECK(st.latency_min_us > 0);
        TP_CHECK(st.latency_min_us <= st.latency_p50_us);
        TP_CHECK(st.latency_p50_us <= st.latency_p99_us);
        TP_CHECK(st.latency_p99_us <= st.latency_max_us);
        TP_CHECK(st.latency_mean_us >= st.latency_min_us &&
                 st.latency_mean_us <= st.latency_max_us);
        TP_CHECKF(st.transport[0] != '\0', "no transport named for bravo");
        TP_CHECK_EQ(tp_rpc_get_peer_stats(a, 2, &st), TP_ENOENT);
        TP_CHECK_EQ(tp_rpc_get_peer_stats(a, -1, &st), TP_ENOENT);

        char *dbg = tp_rpc_get_debug_info(a);
        TP_CHECK(dbg != NULL);
        TP_CHECK_STR_CONTAINS(dbg, "alpha");
        TP_CHECK_STR_CONTAINS(dbg, "bravo");
        free(dbg);
    }
    leave(a);
}

static void
test_counters(void)
{
    run_tcp(2, worker_stats, NULL);
}

// ---- cases: a raw pipe sending malformed agent messages ---------------------

static void
put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
}

static void
put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(v >> (8 * i));
    }
}

// An agent header (agent/wire.h): 40 bytes, then the function name.
static size_t
hdr(uint8_t *b, uint32_t magic, uint8_t ver, uint8_t kind, const char *fn,
    uint16_t fn_len, uint32_t ntensors, uint32_t ext_len, uint32_t src)
{
    memset(b, 0, 40);
    put32(b, magic);
    b[4] = ver;
    b[5] = kind;
    b[6] = (uint8_t)fn_len;
    b[7] = (uint8_t)(fn_len >> 8);
    put64(b + 8, 77);
    put64(b + 16, fn ? tp__hash64_str(fn) : 0);
    put32(b + 24, 0);
    put32(b + 28, ntensors);
    put32(b + 32, ext_len);
    put32(b + 36, src);
    size_t n = 40;
    if (fn != NULL) {
        memcpy(b + 40, fn, strlen(fn));
        n += strlen(fn);
    }
    return n;
}

#define MAGIC 0x41525054u

// The agent must close @p: reads fail (not time out) within 5 s. It may
// answer up to @replies messages first.
static void
expect_closed(tp_pipe *p, const char *what, int replies)
{
    for (int i = 0;; i++) {
        op rd;
        op_init(&rd, 5000);
        tp_pipe_read_descriptor(p, rd.aio);
        op_wait(&rd, 10000);
        tp_status st = tp_aio_status(rd.aio);
        tp_message *m = st == TP_OK ? tp_aio_get_output(rd.aio, 0) : NULL;
        op_fini(&rd);
        if (st != TP_OK) {
            TP_CHECKF(st != TP_ETIMEDOUT,
                      "%s: the agent kept the pipe open for 5 s", what);
            return;
        }
        TP_CHECKF(i < replies, "%s: the agent answered instead of closing",
                  what);
        op r2;
        op_init(&r2, 5000);
        tp_pipe_read(p, m, r2.aio);
        op_wait(&r2, 10000);
        op_fini(&r2);
        tp_message_destroy(m);
    }
}

// Sends one message (metadata, @npay payloads and @nt tensors of @blen
// bytes each) and checks the agent closes the pipe. The read is posted
// while the write is in flight (a tensor write may wait for the reader);
// the write's own result does not matter.
static void
send_expect_closed(tp_pipe *p, const void *meta, size_t len, uint32_t npay,
                   uint32_t nt, uint64_t blen, const char *what, int replies)
{
    tp_message *m = NULL;
    TP_CHECK_OK(tp_message_create(npay, nt, &m), NULL);
    uint8_t *buf = calloc(1, blen ? blen : 1);
    TP_CHECK(buf != NULL);
    m->metadata = (void *)meta;
    m->metadata_len = len;
    for (uint32_t i = 0; i < npay; i++) {
        m->payloads[i].data = buf;
        m->payloads[i].len = blen;
    }
    for (uint32_t i = 0; i < nt; i++) {
        m->tensors[i].data = buf;
        m->tensors[i].len = blen;
    }
    op w;
    op_init(&w, 5000);
    tp_pipe_write(p, m, w.aio);
    expect_closed(p, what, replies);
    op_wait(&w, 10000);
    op_fini(&w);
    m->metadata = NULL;
    m->metadata_len = 0;
    tp_message_destroy(m);
    free(buf);
}

typedef struct garbage {
    const char *what;
    uint8_t meta[600];
    size_t len;
    uint32_t npay, nt;
    uint64_t blen;
    int replies; // answers allowed before the close
} garbage;

static int
make_garbage(garbage *g, int max)
{
    int n = 0;
    uint32_t seed = 12345;
    // Random bytes of a few lengths.
    for (size_t len = 1; len <= 512 && n < max; len *= 8) {
        garbage *x = &g[n++];
        memset(x, 0, sizeof(*x));
        x->what = "random bytes";
        x->len = len;
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            x->meta[i] = (uint8_t)(seed >> 16);
        }
    }
    garbage *x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "no metadata";
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "truncated header";
    hdr(x->meta, MAGIC, 1, 1, "tp.echo", 7, 0, 0, 1);
    x->len = 20;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "wrong magic";
    x->len = hdr(x->meta, 0x45564f4cu, 1, 1, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "wrong version";
    x->len = hdr(x->meta, MAGIC, 99, 1, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "unknown kind";
    x->len = hdr(x->meta, MAGIC, 1, 200, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "reserved kind 16";
    x->len = hdr(x->meta, MAGIC, 1, 16, "tp.echo", 7, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "huge ntensors";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp.echo", 7, 0xffffffffu, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "ntensors above the pipe's";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp.echo", 7, 3, 0, 1);
    x->npay = 1;
    x->nt = 1;
    x->blen = 8;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "fn name past the end";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp.echo", 60000, 0, 0, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "ext past the end";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp.echo", 7, 0, 0xfffffff0u, 1);
    x->npay = 1;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "bad tensor meta";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp.echo", 7, 1, 0, 1);
    x->meta[x->len] = 250;    // dtype
    x->meta[x->len + 1] = 40; // ndim
    x->len += 8 + 8;
    x->npay = 1;
    x->nt = 1;
    x->blen = 8;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "tensor size not the pipe's";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp.echo", 7, 1, 0, 1);
    x->meta[x->len] = (uint8_t)TP_U8;
    x->meta[x->len + 1] = 1;
    put64(x->meta + x->len + 8, (uint64_t)1 << 40);
    x->len += 8 + 8;
    x->npay = 1;
    x->nt = 1;
    x->blen = 8;
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "bad fn name bytes";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp echo\n", 8, 0, 0, 1);
    x->npay = 1;
    x->replies = 1; // an ERROR answer is fine too
    x = &g[n++];
    memset(x, 0, sizeof(*x));
    x->what = "src_rank out of range";
    x->len = hdr(x->meta, MAGIC, 1, 1, "tp.echo", 7, 0, 0, 99);
    x->npay = 1;
    x->replies = 1;
    return n;
}

static void
worker_garbage(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        wait_release(2 * WAIT_MS);
        for (int i = 0; i < 20; i++) {
            tp_args *in = args_i64(i);
            tp_args *r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
            TP_CHECK_EQ(want_i64(r), i);
            tp_args_unref(r);
            tp_args_unref(in);
        }
        leave(a);
        return;
    }
    tp_args *r = call_ok(a, "alpha", "t.url", NULL, WAIT_MS);
    size_t n = 0;
    const char *u = tp_args_bytes(r, &n);
    char url0[512];
    TP_CHECK(n > 0 && n < sizeof(url0));
    memcpy(url0, u, n);
    url0[n] = '\0';
    tp_args_unref(r);

    tp_context_options co;
    tp_context_options_init(&co);
    co.name = "mallory";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&co, &ctx, &err), err);
    static garbage g[32];
    int ng = make_garbage(g, 32);
    for (int i = 0; i < ng; i++) {
        const char *only = getenv("TP_RPC_TEST_GARBAGE");
        if (only != NULL && strstr(g[i].what, only) == NULL) {
            continue;
        }
        if (getenv("TP_RPC_TEST_VERBOSE") != NULL) {
            fprintf(stderr, "mallory: %s\n", g[i].what);
        }
        tp_pipe *p = NULL;
        TP_CHECK_OK(tp_context_connect(ctx, url0, &p, &err), err);
        tp_status st = tp_pipe_wait_ready(p, tp_test_ms(WAIT_MS), &err);
        TP_CHECKF(st == TP_OK, "%s: pipe to %s: %s", g[i].what, url0,
                  tp_error_message(err));
        send_expect_closed(p, g[i].meta, g[i].len, g[i].npay, g[i].nt,
                           g[i].blen, g[i].what, g[i].replies);
        tp_pipe_unref(p);
        // alpha still answers.
        tp_args *in = args_str(g[i].what);
        tp_args *e = call_ok(a, "alpha", "tp.echo", in, WAIT_MS);
        check_str(e, g[i].what);
        tp_args_unref(e);
        tp_args_unref(in);
    }
    // A pipe that connects and goes away without a word.
    tp_pipe *p = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url0, &p, &err), err);
    (void)tp_pipe_wait_ready(p, tp_test_ms(WAIT_MS), &err);
    tp_error_unref(err);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
    tp_args *in = args_str("after the garbage");
    r = call_ok(a, "alpha", "tp.echo", in, WAIT_MS);
    check_str(r, "after the garbage");
    tp_args_unref(r);
    tp_args_unref(in);
    release(a, 0);
    leave(a);
}

static void
test_malformed_peer(void)
{
    run_tcp(2, worker_garbage, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_args),
    TP_TEST_CASE(test_options),
    TP_TEST_CASE(test_register),
    TP_TEST_CASE(test_bad_init),
    TP_TEST_CASE(test_world_of_one),
    TP_TEST_CASE_T(test_init_tcp_2, 60),
    TP_TEST_CASE_T(test_init_tcp_4, 60),
    TP_TEST_CASE_T(test_init_file_3, 60),
    TP_TEST_CASE_T(test_init_env_2, 60),
    TP_TEST_CASE_T(test_init_duplicate_name, 60),
    TP_TEST_CASE_T(test_init_timeout, 60),
    TP_TEST_CASE_T(test_calls, 90),
    TP_TEST_CASE_T(test_errors, 60),
    TP_TEST_CASE_T(test_timeout_per_call, 60),
    TP_TEST_CASE_T(test_timeout_default_and_none, 60),
    TP_TEST_CASE_T(test_nested, 60),
    TP_TEST_CASE_T(test_async_handler, 60),
    TP_TEST_CASE_T(test_threads, 60),
    TP_TEST_CASE_T(test_many_in_flight, 90),
    TP_TEST_CASE_T(test_shutdown_graceful_uneven, 60),
    TP_TEST_CASE_T(test_shutdown_abrupt, 60),
    TP_TEST_CASE_T(test_shutdown_timeout, 60),
    TP_TEST_CASE_T(test_peer_killed, 60),
    TP_TEST_CASE_T(test_counters, 60),
    TP_TEST_CASE_T(test_malformed_peer, 90),
};

TP_TEST_MAIN(cases)
