// SPDX-License-Identifier: Apache-2.0
// rpc_common.c - what the RPC agent's multi-process tests share
// (rpc_common.h): the test functions every worker registers, args and
// tensor helpers, joining and leaving, calls that must succeed or fail, and
// the job of forked workers.

#include "rpc_common.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent_int.h" // tp__agent_listen_url

const char *const k_names[MAX_WORLD] = {"alpha", "bravo", "charlie", "delta"};

// ---- per-process state of a worker ----------------------------------------

int g_rank = -1;
pthread_t g_main_thread;
atomic_int g_release;       // set by "t.release"
atomic_int g_sleep_started; // "t.sleep" handlers entered
atomic_int g_sleep_done;    // ... and returned
atomic_int g_block_done;    // "t.block" handlers returned
tp_job_latch g_entered = {{-1, -1}};
tp_job_latch g_unblock = {{-1, -1}};

// ---- small helpers ----------------------------------------------------------

int64_t
now_ms(void)
{
    return tp_job_now_ms();
}

void
sleep_ms(int64_t ms)
{
    tp_job_sleep_ms(ms);
}

void
tcp_url(char *url, size_t n)
{
    snprintf(url, n, "tcp://127.0.0.1:%d", tp_test_free_port());
}

// True if @msg holds the decimal number @n as a whole token (not part of
// a longer number or of a dotted address such as 127.0.0.1).
bool
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

void
thread_name(char *buf, size_t n)
{
    if (pthread_getname_np(pthread_self(), buf, n) != 0) {
        snprintf(buf, n, "?");
    }
}

// Names of the library's loop and I/O threads (core/loop.c "tp-<loop>",
// pipe/context.c loops "ctx" and "laneN", its "copy" pool, the store
// server's and the resolver's threads): handlers must run elsewhere.
bool
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

tp_args *
args_bytes(const void *p, size_t n)
{
    tp_args *x = NULL;
    TP_CHECK_OK(tp_args_create(p, n, &x), NULL);
    return x;
}

tp_args *
args_str(const char *s)
{
    return args_bytes(s, strlen(s));
}

tp_args *
args_i64(int64_t v)
{
    return args_bytes(&v, sizeof(v));
}

// The int64 an args holds; false if it holds something else.
bool
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

int64_t
want_i64(const tp_args *x)
{
    int64_t v = 0;
    TP_CHECKF(args_get_i64(x, &v), "rank %d: result is not an int64", g_rank);
    return v;
}

// Checks that @x (NULL = empty) holds exactly the bytes of @want.
void
check_str(const tp_args *x, const char *want)
{
    size_t n = 0;
    const void *p = x ? tp_args_bytes(x, &n) : NULL;
    TP_CHECKF(n == strlen(want) && (n == 0 || memcmp(p, want, n) == 0),
              "rank %d: result \"%.*s\" (%zu bytes), want \"%s\"", g_rank,
              (int)(n > 200 ? 200 : n), p ? (const char *)p : "", n, want);
}

void
args_push(tp_args *x, tp_tensor *t)
{
    TP_CHECK_OK(tp_args_add_tensor(x, t), NULL);
    tp_tensor_unref(t);
}

void
args_free(void *p)
{
    tp_args_unref(p);
}

// ---- tensors ----------------------------------------------------------------

uint8_t
pattern(size_t i, uint32_t seed)
{
    return (uint8_t)((i * 2654435761u + seed) >> 7);
}

tp_tensor *
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

tp_tensor *
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
void
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
void
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
    if (g_entered.l_fd[1] >= 0) {
        tp_job_latch_post(&g_entered);
    }
    sleep_ms(ms);
    atomic_fetch_add(&g_sleep_done, 1);
    return tp_args_create("slept", 5, out_p);
}

// "t.block": tells the job it is running (g_entered), then waits for
// g_unblock at most the int64 ms it is given; returns "unblocked", or fails
// with TP_ETIMEDOUT if nobody unblocked it.
static tp_status
fn_block(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    int64_t ms = 0;
    if (!args_get_i64(in, &ms) || g_entered.l_fd[1] < 0) {
        *err_p = tp_error_create(TP_EINVAL, NULL,
                                 "t.block wants an int64 and a job's latches");
        return TP_EINVAL;
    }
    tp_job_latch_post(&g_entered);
    int got = tp_job_latch_wait(&g_unblock, 1, ms);
    atomic_fetch_add(&g_block_done, 1);
    if (got != 1) {
        *err_p =
            tp_error_create(TP_ETIMEDOUT, NULL,
                            "t.block: not unblocked in %lld ms", (long long)ms);
        return TP_ETIMEDOUT;
    }
    return tp_args_create("unblocked", 9, out_p);
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

tp_status
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
pthread_mutex_t g_async_mtx = PTHREAD_MUTEX_INITIALIZER;
int g_async_arrived;
tp_future *g_async_f[ASYNC_N];
int64_t g_async_v[ASYNC_N];

tp_future *
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

void *
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

void
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
        {"t.die", fn_die},     {"t.block", fn_block},
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

void
opts_init(tp_agent_options *o, const char *url)
{
    tp_agent_options_init(o);
    o->init_method = url;
    o->init_timeout_ms = tp_test_ms(WAIT_MS);
    o->shutdown_timeout_ms = tp_test_ms(WAIT_MS);
}

tp_agent *
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

tp_agent *
join(int rank, int world, const char *url)
{
    tp_agent_options o;
    opts_init(&o, url);
    return join_opts(rank, world, &o);
}

void
leave(tp_agent *a)
{
    tp_error *err = NULL;
    tp_status st = tp_rpc_shutdown(a, true, &err);
    TP_CHECKF(st == TP_OK, "rank %d: graceful shutdown: %s: %s", g_rank,
              tp_status_name(st), tp_error_message(err));
}

void
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
void
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

tp_args *
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

tp_args *
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
tp_error *
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

tp_args *
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

void
job_setup(int rank)
{
    g_rank = rank;
    g_main_thread = pthread_self();
    register_fns();
}

void
job_tcp(job *j, int world, tp_job_fn fn, void *arg)
{
    tp_job_tcp(j, world, fn, arg);
    if (g_entered.l_fd[0] < 0) {
        tp_job_latch_init(&g_entered);
        tp_job_latch_init(&g_unblock);
    }
    j->setup = job_setup;
    j->names = k_names;
}

void
job_run(job *j)
{
    tp_job_run(j);
}

void
run_tcp(int world, tp_job_fn fn, void *arg)
{
    job j;
    job_tcp(&j, world, fn, arg);
    job_run(&j);
}

// ---- t.info results ---------------------------------------------------------

// Splits "fn|caller|rank|id|thread|main" into its fields.
void
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
