// SPDX-License-Identifier: Apache-2.0
// coll_shm_test.c - the shared-memory collectives engine (collectives/shm.c):
// groups of 1, 2, 3, 4 and 8 forked processes open an engine through a
// file:// store and run every collective for several dtypes and ops, at
// sizes 0, 1, odd, larger than the slot (4 KiB here, so the cma paths run
// at modest sizes, with several 256 KiB sub-chunks) and once 8 MiB, with
// roots 0 and last; results are checked against a reference each rank
// computes locally in rank order with the same kernels (so float sums must
// match bitwise), and a hash of every all_reduce result is compared across
// ranks through the store. Also: barrier ordering, a rank that is killed
// or exits while the others wait (TP_ECONNRESET well within 1 s), a rank
// that never arrives (TP_ETIMEDOUT at a 300 ms deadline, naming it), no
// segment left in /dev/shm, and the latency of barriers and 4 KiB f32
// all_reduces at n = 2 (printed; measured, not checked).
//
// Every rank is a forked child of the case process, forked before any
// thread exists (TSan). A child that fails makes the parent kill the
// others and fail the case. Without cross-memory attach the engine refuses
// to open (shm.h): the cases then check the refusal names the rank and
// skip.

#include "tp_test.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/store.h>
#include <tpipe/tensor.h>

#include "core/host.h"
#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "collectives/shm.h"
#include "core/platform.h"

#define MAX_N   8
#define SLOT    4096
#define OP_MS   20000 // deadline of one collective
#define BIG     70001 // elements: past the slot and past one sub-chunk
#define PREFIX  "g/"
#define GROUPNM "testgroup"

// ---- helpers ---------------------------------------------------------------

static void
sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t
op_deadline(int64_t ms)
{
    return tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
}

static uint64_t
mix(uint64_t x)
{
    // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t
fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 0x100000001b3ull;
    }
    return h;
}

static void *
xalloc(size_t n)
{
    void *p = malloc(n > 0 ? n : 1);
    TP_CHECK(p != NULL);
    return p;
}

// Deterministic input of @rank for collective @salt: element i of @n.
// Floats vary in magnitude (so the order of a sum matters); products use
// values near 1.
static void
gen(tp_dtype dt, tp_reduce_op op, int rank, uint64_t salt, void *buf, size_t n)
{
    uint64_t seed = mix(salt * 1000003u + (uint64_t)rank * 7919u + 17u);
    for (size_t i = 0; i < n; i++) {
        uint64_t h = mix(seed ^ (i * 0x2545f4914f6cdd1dull));
        double frac = (double)(h % 2001) / 1000.0 - 1.0; // [-1, 1]
        double v = op == TP_REDUCE_PRODUCT
                       ? 0.75 + (double)(h % 501) / 1000.0
                       : frac * (double)(1u << ((h >> 32) % 20));
        switch (dt) {
        case TP_F32:
            ((float *)buf)[i] = (float)v;
            break;
        case TP_F64:
            ((double *)buf)[i] = v;
            break;
        default: {
            size_t es = tp_dtype_size(dt);
            memcpy((uint8_t *)buf + i * es, &h, es);
            break;
        }
        }
    }
}

// ref = x_0 op x_1 op ... in rank order, x_q = gen(q) of @n elements.
static void
reference(tp_dtype dt, tp_reduce_op op, int n, uint64_t salt, void *ref,
          size_t count)
{
    size_t es = tp_dtype_size(dt);
    gen(dt, op, 0, salt, ref, count);
    void *x = xalloc(count * es);
    for (int q = 1; q < n; q++) {
        gen(dt, op, q, salt, x, count);
        tp__reduce(op, dt, ref, x, count);
    }
    free(x);
}

// Like memcmp, reporting the first differing element.
static void
check_eq(const char *what, const void *got, const void *want, size_t bytes,
         int rank)
{
    if (bytes == 0 || memcmp(got, want, bytes) == 0) {
        return;
    }
    const uint8_t *g = got, *w = want;
    size_t i = 0;
    while (g[i] == w[i]) {
        i++;
    }
    TP_CHECKF(false,
              "rank %d: %s: byte %zu of %zu differs (0x%02x, want 0x%02x)",
              rank, what, i, bytes, g[i], w[i]);
}

// ---- a job of forked ranks -------------------------------------------------

typedef struct worker {
    int w_rank, w_n;
    char w_url[300];
    tp_store *w_store;
    tp__shm *w_shm;
    void *w_arg;
} worker;

typedef void (*worker_fn)(worker *w);

typedef struct job {
    int j_n;
    worker_fn j_fn;
    void *j_arg;
    int j_sig[MAX_N];   // a rank that must end by this signal
    int64_t j_limit_ms; // for the whole job
} job;

// Opens the store and the engine; exits 77 if the engine refuses.
static void
worker_open(worker *w, size_t slot)
{
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(w->w_url, w->w_rank, w->w_n, tp_test_ms(30000),
                              &w->w_store, &err),
                err);
    int world[MAX_N];
    for (int i = 0; i < MAX_N; i++) {
        world[i] = 100 + i;
    }
    tp__shm_setup s = {
        .store = w->w_store,
        .prefix = PREFIX,
        .rank = w->w_rank,
        .size = w->w_n,
        .world_ranks = world,
        .group = GROUPNM,
        .slot_bytes = slot,
        .deadline_ns = op_deadline(30000),
    };
    char why[512] = "";
    TP_CHECK_OK(tp__shm_open(&s, &w->w_shm, why, sizeof(why), &err), err);
    if (w->w_shm == NULL) {
        TP_CHECKF(strstr(why, "rank ") != NULL, "why does not name a rank: %s",
                  why);
        if (w->w_rank == 0) {
            fprintf(stderr, "shm engine refused: %s\n", why);
        }
        tp_store_close(w->w_store);
        fflush(stderr);
        _exit(77);
    }
}

static void
worker_close(worker *w)
{
    tp__shm_close(w->w_shm);
    tp_store_close(w->w_store);
}

// Fails unless /dev/shm holds no segment of rank 0 (@pid0).
static void
check_no_leftover(pid_t pid0)
{
    char pre[64];
    snprintf(pre, sizeof(pre), "tp-coll-%d-", (int)pid0);
    DIR *d = opendir("/dev/shm");
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        TP_CHECKF(strncmp(e->d_name, pre, strlen(pre)) != 0,
                  "/dev/shm/%s left behind", e->d_name);
    }
    closedir(d);
}

static void
job_run(job *j)
{
    int n = j->j_n;
    char path[] = "/tmp/tp_shm_test_XXXXXX";
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    pid_t pid[MAX_N] = {0};
    bool done[MAX_N] = {false};
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        TP_CHECK(pid[r] >= 0);
        if (pid[r] == 0) {
            worker w = {.w_rank = r, .w_n = n, .w_arg = j->j_arg};
            snprintf(w.w_url, sizeof(w.w_url), "file://%s", path);
            j->j_fn(&w);
            fflush(stdout);
            fflush(stderr);
            _exit(0);
        }
    }
    int64_t limit = tp_test_ms(j->j_limit_ms > 0 ? j->j_limit_ms : 120000);
    uint64_t dl = tp__now_ns() + (uint64_t)limit * 1000000u;
    char why[512] = "";
    int skipped = 0, left = n;
    while (left > 0 && why[0] == '\0') {
        for (int r = 0; r < n && why[0] == '\0'; r++) {
            int status = 0;
            if (done[r] || waitpid(pid[r], &status, WNOHANG) != pid[r]) {
                continue;
            }
            done[r] = true;
            left--;
            if (j->j_sig[r] != 0) {
                if (!WIFSIGNALED(status) || WTERMSIG(status) != j->j_sig[r]) {
                    snprintf(why, sizeof(why),
                             "rank %d ended with status 0x%x, want signal %d",
                             r, status, j->j_sig[r]);
                }
            } else if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
                skipped++;
            } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                snprintf(why, sizeof(why), "rank %d failed (status 0x%x%s%s)",
                         r, status, WIFSIGNALED(status) ? ", " : "",
                         WIFSIGNALED(status) ? strsignal(WTERMSIG(status))
                                             : "");
            }
        }
        if (why[0] == '\0' && left > 0 && tp__now_ns() > dl) {
            snprintf(why, sizeof(why), "job of %d ranks did not end in %lld ms",
                     n, (long long)limit);
        }
        if (left > 0 && why[0] == '\0') {
            sleep_ms(2);
        }
    }
    for (int r = 0; r < n; r++) {
        if (!done[r]) {
            kill(pid[r], SIGKILL);
            waitpid(pid[r], NULL, 0);
        }
    }
    unlink(path);
    TP_CHECKF(why[0] == '\0', "%s", why);
    check_no_leftover(pid[0]);
    if (skipped > 0) {
        tp_test_skip("the shm engine refused to open (see above)");
    }
}

// ---- running one collective ------------------------------------------------

static void
run(worker *w, tp__coll_args *a, const char *what)
{
    tp_error *err = NULL;
    tp_status st = tp__shm_run(w->w_shm, a, op_deadline(OP_MS), &err);
    TP_CHECKF(st == TP_OK, "rank %d: %s: %s: %s", w->w_rank, what,
              tp_status_name(st), tp_error_message(err));
}

typedef struct suite {
    worker *s_w;
    uint64_t s_salt; // advanced identically on every rank
    uint64_t s_hash; // of every all_reduce result
    int s_bars;      // barriers so far
} suite;

static void
t_barrier(suite *s, _Atomic int *counter, int iters)
{
    worker *w = s->s_w;
    tp__coll_args a = {.kind = TP__COLL_BARRIER};
    for (int i = 0; i < iters; i++) {
        atomic_fetch_add_explicit(counter, 1, memory_order_seq_cst);
        run(w, &a, "barrier");
        int c = atomic_load_explicit(counter, memory_order_seq_cst);
        s->s_bars++;
        TP_CHECKF(c >= w->w_n * s->s_bars,
                  "rank %d left barrier %d when only %d arrivals were counted",
                  w->w_rank, s->s_bars, c);
    }
}

static void
t_all_reduce(suite *s, tp_dtype dt, tp_reduce_op op, size_t count)
{
    worker *w = s->s_w;
    size_t es = tp_dtype_size(dt);
    uint64_t salt = ++s->s_salt;
    uint8_t *buf = xalloc(count * es), *ref = xalloc(count * es);
    gen(dt, op, w->w_rank, salt, buf, count);
    reference(dt, op, w->w_n, salt, ref, count);
    tp__coll_args a = {.kind = TP__COLL_ALL_REDUCE,
                       .dtype = dt,
                       .op = op,
                       .buf = count > 0 ? buf : NULL,
                       .count = count};
    run(w, &a, "all_reduce");
    char what[96];
    snprintf(what, sizeof(what), "all_reduce %s %s x %zu",
             tp__reduce_op_name(op), tp_dtype_name(dt), count);
    check_eq(what, buf, ref, count * es, w->w_rank);
    s->s_hash = fnv(s->s_hash, buf, count * es);
    free(buf);
    free(ref);
}

static void
t_reduce(suite *s, tp_dtype dt, tp_reduce_op op, size_t count, int root)
{
    worker *w = s->s_w;
    size_t es = tp_dtype_size(dt);
    uint64_t salt = ++s->s_salt;
    uint8_t *buf = xalloc(count * es), *ref = xalloc(count * es);
    gen(dt, op, w->w_rank, salt, buf, count);
    if (w->w_rank == root) {
        reference(dt, op, w->w_n, salt, ref, count);
    } else {
        memcpy(ref, buf, count * es); // must not change
    }
    tp__coll_args a = {.kind = TP__COLL_REDUCE,
                       .dtype = dt,
                       .op = op,
                       .root = root,
                       .buf = count > 0 ? buf : NULL,
                       .count = count};
    run(w, &a, "reduce");
    char what[96];
    snprintf(what, sizeof(what), "reduce %s %s x %zu root %d",
             tp__reduce_op_name(op), tp_dtype_name(dt), count, root);
    check_eq(what, buf, ref, count * es, w->w_rank);
    free(buf);
    free(ref);
}

static void
t_broadcast(suite *s, tp_dtype dt, size_t count, int root)
{
    worker *w = s->s_w;
    size_t es = tp_dtype_size(dt);
    uint64_t salt = ++s->s_salt;
    uint8_t *buf = xalloc(count * es), *ref = xalloc(count * es);
    gen(dt, TP_REDUCE_SUM, w->w_rank, salt, buf, count);
    gen(dt, TP_REDUCE_SUM, root, salt, ref, count);
    tp__coll_args a = {.kind = TP__COLL_BROADCAST,
                       .dtype = dt,
                       .root = root,
                       .buf = count > 0 ? buf : NULL,
                       .count = count};
    run(w, &a, "broadcast");
    char what[96];
    snprintf(what, sizeof(what), "broadcast %s x %zu root %d",
             tp_dtype_name(dt), count, root);
    check_eq(what, buf, ref, count * es, w->w_rank);
    free(buf);
    free(ref);
}

// all_gather (root < 0) or gather.
static void
t_gather(suite *s, tp_dtype dt, size_t count, int root)
{
    worker *w = s->s_w;
    int n = w->w_n;
    size_t es = tp_dtype_size(dt), bytes = count * es;
    uint64_t salt = ++s->s_salt;
    bool reader = root < 0 || root == w->w_rank;
    uint8_t *in = xalloc(bytes), *out = xalloc(bytes * (size_t)n);
    uint8_t *ref = xalloc(bytes);
    gen(dt, TP_REDUCE_SUM, w->w_rank, salt, in, count);
    memset(out, 0xab, bytes * (size_t)n);
    tp__coll_args a = {.kind = root < 0 ? TP__COLL_ALL_GATHER : TP__COLL_GATHER,
                       .dtype = dt,
                       .root = root < 0 ? 0 : root,
                       .in = count > 0 ? in : NULL,
                       .out = count > 0 && reader ? out : NULL,
                       .count = count};
    run(w, &a, root < 0 ? "all_gather" : "gather");
    if (reader) {
        for (int q = 0; q < n; q++) {
            gen(dt, TP_REDUCE_SUM, q, salt, ref, count);
            char what[96];
            snprintf(what, sizeof(what), "%s %s x %zu root %d block %d",
                     root < 0 ? "all_gather" : "gather", tp_dtype_name(dt),
                     count, root, q);
            check_eq(what, out + (size_t)q * bytes, ref, bytes, w->w_rank);
        }
    }
    free(in);
    free(out);
    free(ref);
}

static void
t_scatter(suite *s, tp_dtype dt, size_t count, int root)
{
    worker *w = s->s_w;
    int n = w->w_n;
    size_t es = tp_dtype_size(dt), bytes = count * es;
    uint64_t salt = ++s->s_salt;
    uint8_t *in = xalloc(bytes * (size_t)n), *out = xalloc(bytes);
    uint8_t *all = xalloc(bytes * (size_t)n);
    gen(dt, TP_REDUCE_SUM, root, salt, all, count * (size_t)n);
    if (w->w_rank == root) {
        memcpy(in, all, bytes * (size_t)n);
    }
    tp__coll_args a = {.kind = TP__COLL_SCATTER,
                       .dtype = dt,
                       .root = root,
                       .in = count > 0 && w->w_rank == root ? in : NULL,
                       .out = count > 0 ? out : NULL,
                       .count = count};
    run(w, &a, "scatter");
    char what[96];
    snprintf(what, sizeof(what), "scatter %s x %zu root %d", tp_dtype_name(dt),
             count, root);
    check_eq(what, out, all + (size_t)w->w_rank * bytes, bytes, w->w_rank);
    free(in);
    free(out);
    free(all);
}

static void
t_reduce_scatter(suite *s, tp_dtype dt, tp_reduce_op op, size_t count)
{
    worker *w = s->s_w;
    int n = w->w_n;
    size_t es = tp_dtype_size(dt), bytes = count * es;
    size_t total = count * (size_t)n;
    uint64_t salt = ++s->s_salt;
    uint8_t *in = xalloc(total * es), *out = xalloc(bytes);
    uint8_t *ref = xalloc(total * es);
    gen(dt, op, w->w_rank, salt, in, total);
    reference(dt, op, n, salt, ref, total);
    tp__coll_args a = {.kind = TP__COLL_REDUCE_SCATTER,
                       .dtype = dt,
                       .op = op,
                       .in = count > 0 ? in : NULL,
                       .out = count > 0 ? out : NULL,
                       .count = count};
    run(w, &a, "reduce_scatter");
    char what[96];
    snprintf(what, sizeof(what), "reduce_scatter %s %s x %zu",
             tp__reduce_op_name(op), tp_dtype_name(dt), count);
    check_eq(what, out, ref + (size_t)w->w_rank * bytes, bytes, w->w_rank);
    free(in);
    free(out);
    free(ref);
}

// all_to_all: rank r sends a2a_count(base, r, j) elements to rank j.
static size_t
a2a_count(size_t base, int r, int j)
{
    return base == 0 ? 0 : (base + 3 * (size_t)r + 5 * (size_t)j) % (base + 7);
}

// Displacements with gaps of 2 elements, blocks in reverse order when
// @rev.
static void
a2a_displs(size_t base, int n, int r, bool send, size_t *cnt, size_t *dsp,
           size_t *total_p)
{
    size_t at = 1;
    for (int k = 0; k < n; k++) {
        int j = send ? k : n - 1 - k;
        cnt[j] = send ? a2a_count(base, r, j) : a2a_count(base, j, r);
        dsp[j] = at;
        at += cnt[j] + 2;
    }
    *total_p = at;
}

static void
t_all_to_all(suite *s, tp_dtype dt, size_t base)
{
    worker *w = s->s_w;
    int n = w->w_n, me = w->w_rank;
    size_t es = tp_dtype_size(dt);
    uint64_t salt = ++s->s_salt;
    size_t sc[MAX_N], sd[MAX_N], rc[MAX_N], rd[MAX_N], stot, rtot;
    a2a_displs(base, n, me, true, sc, sd, &stot);
    a2a_displs(base, n, me, false, rc, rd, &rtot);
    uint8_t *in = xalloc(stot * es), *out = xalloc(rtot * es);
    uint8_t *want = xalloc(rtot * es);
    gen(dt, TP_REDUCE_SUM, me, salt, in, stot);
    memset(out, 0xcd, rtot * es);
    memset(want, 0xcd, rtot * es);
    for (int q = 0; q < n; q++) {
        size_t qc[MAX_N], qd[MAX_N], qtot;
        a2a_displs(base, n, q, true, qc, qd, &qtot);
        uint8_t *qin = xalloc(qtot * es);
        gen(dt, TP_REDUCE_SUM, q, salt, qin, qtot);
        memcpy(want + rd[q] * es, qin + qd[me] * es, rc[q] * es);
        free(qin);
    }
    tp__coll_args a = {.kind = TP__COLL_ALL_TO_ALL,
                       .dtype = dt,
                       .in = in,
                       .out = out,
                       .scounts = sc,
                       .sdispls = sd,
                       .rcounts = rc,
                       .rdispls = rd};
    run(w, &a, "all_to_all");
    char what[96];
    snprintf(what, sizeof(what), "all_to_all %s base %zu", tp_dtype_name(dt),
             base);
    check_eq(what, out, want, rtot * es, me);
    free(in);
    free(out);
    free(want);
}

// Publishes this rank's hash and (rank 0) compares every rank's.
static void
check_hashes(suite *s)
{
    worker *w = s->s_w;
    tp_error *err = NULL;
    char key[64];
    snprintf(key, sizeof(key), "hash/%d", w->w_rank);
    TP_CHECK_OK(tp_store_set(w->w_store, key, &s->s_hash, sizeof(s->s_hash),
                             tp_test_ms(30000), &err),
                err);
    if (w->w_rank != 0) {
        return;
    }
    for (int q = 1; q < w->w_n; q++) {
        snprintf(key, sizeof(key), "hash/%d", q);
        void *v = NULL;
        size_t len = 0;
        TP_CHECK_OK(
            tp_store_get(w->w_store, key, tp_test_ms(30000), &v, &len, &err),
            err);
        TP_CHECK_EQ(len, sizeof(uint64_t));
        TP_CHECKF(memcmp(v, &s->s_hash, len) == 0,
                  "all_reduce results of rank %d differ from rank 0's", q);
        free(v);
    }
}

// ---- the cases -------------------------------------------------------------

static const size_t k_sizes[] = {0, 1, 1037, BIG};

typedef struct red_case {
    tp_dtype dt;
    tp_reduce_op op;
} red_case;

static const red_case k_red[] = {
    {TP_F32, TP_REDUCE_SUM},  {TP_F64, TP_REDUCE_SUM},
    {TP_I32, TP_REDUCE_MAX},  {TP_I64, TP_REDUCE_BXOR},
    {TP_U8, TP_REDUCE_BXOR},  {TP_F32, TP_REDUCE_PRODUCT},
    {TP_BF16, TP_REDUCE_SUM},
};
static const tp_dtype k_move[] = {TP_F32, TP_I8, TP_F64};

typedef struct suite_arg {
    _Atomic int *counter; // shared by the ranks (MAP_SHARED)
    bool big;             // add an 8 MiB all_reduce
} suite_arg;

static void
suite_worker(worker *w)
{
    suite_arg *arg = w->w_arg;
    worker_open(w, SLOT);
    suite s = {.s_w = w, .s_hash = 14695981039346656037ull};
    int n = w->w_n;
    int roots[2] = {0, n - 1};
    t_barrier(&s, arg->counter, 20);
    for (size_t z = 0; z < TP_ARRAY_LEN(k_sizes); z++) {
        size_t count = k_sizes[z];
        for (size_t c = 0; c < TP_ARRAY_LEN(k_red); c++) {
            t_all_reduce(&s, k_red[c].dt, k_red[c].op, count);
            for (int ri = 0; ri < 2; ri++) {
                t_reduce(&s, k_red[c].dt, k_red[c].op, count, roots[ri]);
            }
            // Keep reduce_scatter's n * count inputs modest.
            if (count < BIG || c < 2) {
                t_reduce_scatter(&s, k_red[c].dt, k_red[c].op, count);
            }
        }
        for (size_t d = 0; d < TP_ARRAY_LEN(k_move); d++) {
            t_gather(&s, k_move[d], count, -1);
            for (int ri = 0; ri < 2; ri++) {
                t_broadcast(&s, k_move[d], count, roots[ri]);
                t_gather(&s, k_move[d], count, roots[ri]);
                t_scatter(&s, k_move[d], count, roots[ri]);
            }
        }
    }
    // all_to_all: blocks of 0 .. base + 6 elements; with 4 KiB slots some
    // ranks pack their blocks into the slot while others publish in.
    const size_t bases[] = {0, 1, 37, 150, 300, 1037, 20000};
    for (size_t b = 0; b < TP_ARRAY_LEN(bases); b++) {
        t_all_to_all(&s, TP_F32, bases[b]);
        t_all_to_all(&s, TP_I8, bases[b]);
    }
    // The same collective back to back (slot reuse across phases).
    for (int i = 0; i < 30; i++) {
        t_all_reduce(&s, TP_F32, TP_REDUCE_SUM, (size_t)(i % 3) * 500);
        t_broadcast(&s, TP_I8, 777, i % n);
        t_reduce(&s, TP_I32, TP_REDUCE_MAX, 1000, i % n);
    }
    if (arg->big) {
        t_all_reduce(&s, TP_F32, TP_REDUCE_SUM, (8u << 20) / 4 + 3);
    }
    t_barrier(&s, arg->counter, 5);
    check_hashes(&s);
    worker_close(w);
}

static void
suite_n(int n, bool big)
{
    _Atomic int *counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TP_CHECK(counter != MAP_FAILED);
    atomic_init(counter, 0);
    char why[512];
    if (n > 1 && !tp__cma_viable(why, sizeof(why))) {
        printf("cross-memory attach not usable here (%s): the engine "
               "refuses to open\n",
               why);
    }
    suite_arg arg = {.counter = counter, .big = big};
    job j = {
        .j_n = n, .j_fn = suite_worker, .j_arg = &arg, .j_limit_ms = 240000};
    job_run(&j);
    munmap(counter, 4096);
}

static void
test_size_1(void)
{
    suite_n(1, false);
}

static void
test_size_2(void)
{
    suite_n(2, false);
}

static void
test_size_3(void)
{
    suite_n(3, true);
}

static void
test_size_4(void)
{
    suite_n(4, false);
}

static void
test_size_8(void)
{
    suite_n(8, false);
}

// A random mix of collectives, the same on every rank: small and
// cma-sized counts, random roots, back to back (slot and publication reuse
// across phases of either parity).
static void
stress_worker(worker *w)
{
    suite_arg *arg = w->w_arg;
    worker_open(w, SLOT);
    suite s = {.s_w = w, .s_hash = 14695981039346656037ull};
    uint64_t rng = 12345;
    int n = w->w_n;
    for (int i = 0; i < 1500; i++) {
        rng = mix(rng);
        size_t count = rng % 8 == 0 ? 1500 + (rng >> 8) % 50 : (rng >> 8) % 65;
        int root = (int)((rng >> 20) % (uint64_t)n);
        const red_case *rc = &k_red[(rng >> 28) % TP_ARRAY_LEN(k_red)];
        tp_dtype mv = k_move[(rng >> 36) % TP_ARRAY_LEN(k_move)];
        switch ((rng >> 44) % 10) {
        case 0:
            t_barrier(&s, arg->counter, 1);
            break;
        case 1:
            t_broadcast(&s, mv, count, root);
            break;
        case 2:
            t_all_reduce(&s, rc->dt, rc->op, count);
            break;
        case 3:
            t_reduce(&s, rc->dt, rc->op, count, root);
            break;
        case 4:
            t_gather(&s, mv, count, -1);
            break;
        case 5:
            t_gather(&s, mv, count, root);
            break;
        case 6:
            t_scatter(&s, mv, count, root);
            break;
        case 7:
            t_reduce_scatter(&s, rc->dt, rc->op, count);
            break;
        default:
            t_all_to_all(&s, mv, count);
            break;
        }
    }
    check_hashes(&s);
    if (w->w_rank == 0) {
        printf("n=%d: %" PRIu64 " collectives and %d barriers\n", n, s.s_salt,
               s.s_bars);
    }
    worker_close(w);
}

static void
test_stress(void)
{
    _Atomic int *counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    TP_CHECK(counter != MAP_FAILED);
    atomic_init(counter, 0);
    for (int n = 2; n <= 4; n++) {
        atomic_store(counter, 0);
        suite_arg arg = {.counter = counter};
        job j = {.j_n = n,
                 .j_fn = stress_worker,
                 .j_arg = &arg,
                 .j_limit_ms = 120000};
        job_run(&j);
    }
    munmap(counter, 4096);
}

// ---- a rank dies / never arrives -------------------------------------------

typedef struct death_arg {
    bool kill;    // SIGKILL, else _exit(0)
    size_t count; // all_reduce size (f32)
} death_arg;

static void
death_worker(worker *w)
{
    death_arg *d = w->w_arg;
    worker_open(w, SLOT);
    if (w->w_rank == 2) {
        sleep_ms(100);
        if (d->kill) {
            kill(getpid(), SIGKILL);
        }
        _exit(0);
    }
    float *buf = xalloc(d->count * sizeof(float));
    for (size_t i = 0; i < d->count; i++) {
        buf[i] = (float)i;
    }
    tp__coll_args a = {.kind = TP__COLL_ALL_REDUCE,
                       .dtype = TP_F32,
                       .op = TP_REDUCE_SUM,
                       .buf = buf,
                       .count = d->count};
    tp_error *err = NULL;
    uint64_t t0 = tp__now_ns();
    tp_status st = tp__shm_run(w->w_shm, &a, op_deadline(10000), &err);
    uint64_t dt_ms = (tp__now_ns() - t0) / 1000000;
    TP_CHECKF(st == TP_ECONNRESET,
              "rank %d: all_reduce: %s (%s), want "
              "TP_ECONNRESET",
              w->w_rank, tp_status_name(st), tp_error_message(err));
    // The rank dies ~100 ms in; the detection itself must be well within
    // 1 s (2 s here, for loaded machines).
    TP_CHECKF(dt_ms < 2000, "rank %d: death noticed after %llu ms", w->w_rank,
              (unsigned long long)dt_ms);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 2 (world rank 102");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "all_reduce");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), GROUPNM);
    if (w->w_rank == 0) {
        printf("rank 0: %llu ms: %s\n", (unsigned long long)dt_ms,
               tp_error_message(err));
    }
    tp_error_unref(err);
    free(buf);
    worker_close(w);
}

static void
death_n3(bool kill_it, size_t count)
{
    death_arg d = {.kill = kill_it, .count = count};
    job j = {.j_n = 3, .j_fn = death_worker, .j_arg = &d, .j_limit_ms = 30000};
    if (kill_it) {
        j.j_sig[2] = SIGKILL;
    }
    job_run(&j);
}

static void
test_death_killed_slot(void)
{
    death_n3(true, 1037 / 4);
}

static void
test_death_exit_cma(void)
{
    death_n3(false, BIG);
}

static void
timeout_worker(worker *w)
{
    worker_open(w, SLOT);
    tp_error *err = NULL;
    if (w->w_rank == 2) {
        // Never enters the barrier; leaves once the others are done (an
        // exit before would turn their timeout into TP_ECONNRESET).
        const char *keys[] = {"fin/0", "fin/1"};
        TP_CHECK_OK(tp_store_wait(w->w_store, keys, 2, tp_test_ms(30000), &err),
                    err);
        worker_close(w);
        return;
    }
    tp__coll_args a = {.kind = TP__COLL_BARRIER};
    uint64_t t0 = tp__now_ns();
    tp_status st = tp__shm_run(w->w_shm, &a, t0 + 300000000u, &err);
    uint64_t dt_ms = (tp__now_ns() - t0) / 1000000;
    TP_CHECKF(st == TP_ETIMEDOUT,
              "rank %d: barrier: %s (%s), want "
              "TP_ETIMEDOUT",
              w->w_rank, tp_status_name(st), tp_error_message(err));
    // The rank whose own deadline fired first waited the full 300 ms; the
    // other one may have entered the barrier later and then adopts that
    // failure ("rank 0 gave up waiting for rank 2") before its own fires.
    bool adopted = strstr(tp_error_message(err), "gave up waiting for") != NULL;
    TP_CHECKF((adopted || dt_ms >= 299) &&
                  dt_ms < 300 + (uint64_t)tp_test_ms(1500),
              "rank %d: a 300 ms deadline fired after %llu ms (%s)", w->w_rank,
              (unsigned long long)dt_ms, tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 2 (world rank 102");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "barrier");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), GROUPNM);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), " ms");
    if (w->w_rank == 0) {
        printf("rank 0: %llu ms: %s\n", (unsigned long long)dt_ms,
               tp_error_message(err));
    }
    tp_error_unref(err);
    char key[32];
    snprintf(key, sizeof(key), "fin/%d", w->w_rank);
    TP_CHECK_OK(tp_store_set(w->w_store, key, "1", 1, tp_test_ms(30000), &err),
                err);
    worker_close(w);
}

static void
test_timeout(void)
{
    job j = {.j_n = 3, .j_fn = timeout_worker, .j_limit_ms = 30000};
    job_run(&j);
}

// ---- open: refusal and deadline ---------------------------------------------

static void
open_ranks(worker *w, size_t slot, uint64_t deadline_ns, tp__shm **shm_p,
           char *why, size_t why_len, tp_error **err_p)
{
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(w->w_url, w->w_rank, w->w_n, tp_test_ms(30000),
                              &w->w_store, &err),
                err);
    int world[MAX_N] = {100, 101, 102, 103, 104, 105, 106, 107};
    tp__shm_setup s = {
        .store = w->w_store,
        .prefix = PREFIX,
        .rank = w->w_rank,
        .size = w->w_n,
        .world_ranks = world,
        .group = GROUPNM,
        .slot_bytes = slot,
        .deadline_ns = deadline_ns,
    };
    tp_status st = tp__shm_open(&s, shm_p, why, why_len, err_p);
    TP_CHECKF(st == TP_OK || *err_p != NULL,
              "tp__shm_open failed without an error");
    if (st != TP_OK) {
        *shm_p = NULL;
    }
}

// Rank 1 disagrees on the slot size: it cannot map rank 0's segment, and
// every rank gets TP_OK, no engine and the same reason naming rank 1.
static void
mismatch_worker(worker *w)
{
    tp__shm *shm = NULL;
    tp_error *err = NULL;
    char why[512] = "";
    open_ranks(w, w->w_rank == 1 ? 2 * SLOT : SLOT, op_deadline(30000), &shm,
               why, sizeof(why), &err);
    TP_CHECKF(err == NULL, "rank %d: %s", w->w_rank, tp_error_message(err));
    TP_CHECKF(shm == NULL, "rank %d: engine opened despite the mismatch",
              w->w_rank);
    TP_CHECKF(strncmp(why, "rank 1: ", 8) == 0, "rank %d: why is \"%s\"",
              w->w_rank, why);
    char key[32];
    snprintf(key, sizeof(key), "why/%d", w->w_rank);
    TP_CHECK_OK(tp_store_set(w->w_store, key, why, strlen(why),
                             tp_test_ms(30000), &err),
                err);
    if (w->w_rank == 0) {
        printf("rank 0: %s\n", why);
        for (int q = 1; q < w->w_n; q++) {
            snprintf(key, sizeof(key), "why/%d", q);
            void *v = NULL;
            size_t len = 0;
            TP_CHECK_OK(tp_store_get(w->w_store, key, tp_test_ms(30000), &v,
                                     &len, &err),
                        err);
            TP_CHECKF(strcmp(v, why) == 0,
                      "rank %d: why \"%s\", rank 0: \"%s\"", q, (char *)v, why);
            free(v);
        }
    }
    tp_store_close(w->w_store);
}

static void
test_open_mismatch(void)
{
    job j = {.j_n = 3, .j_fn = mismatch_worker, .j_limit_ms = 30000};
    job_run(&j);
}

// Rank 2 never opens: the others fail at a 300 ms deadline naming it, and
// rank 0 still removes the segment (job_run checks /dev/shm).
static void
absent_worker(worker *w)
{
    if (w->w_rank == 2) {
        return;
    }
    tp__shm *shm = NULL;
    tp_error *err = NULL;
    char why[512] = "";
    uint64_t t0 = tp__now_ns();
    open_ranks(w, SLOT, t0 + 300000000u, &shm, why, sizeof(why), &err);
    uint64_t dt_ms = (tp__now_ns() - t0) / 1000000;
    TP_CHECKF(err != NULL && tp_error_status(err) == TP_ETIMEDOUT,
              "rank %d: open: %s, want TP_ETIMEDOUT", w->w_rank,
              err != NULL ? tp_error_message(err) : "succeeded");
    TP_CHECKF(dt_ms < 300 + (uint64_t)tp_test_ms(2000),
              "rank %d: a 300 ms open deadline fired after %llu ms", w->w_rank,
              (unsigned long long)dt_ms);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 2");
    if (w->w_rank == 0) {
        printf("rank 0: %llu ms: %s\n", (unsigned long long)dt_ms,
               tp_error_message(err));
    }
    tp_error_unref(err);
    tp_store_close(w->w_store);
}

static void
test_open_absent(void)
{
    job j = {.j_n = 3, .j_fn = absent_worker, .j_limit_ms = 30000};
    job_run(&j);
}

// ---- latency (printed, not checked) ----------------------------------------

static void
latency_worker(worker *w)
{
    worker_open(w, SLOT);
    enum { ITERS = 10000, COUNT = 1024 };
    float *buf = xalloc(COUNT * sizeof(float));
    for (int i = 0; i < COUNT; i++) {
        buf[i] = 0.0f;
    }
    tp__coll_args bar = {.kind = TP__COLL_BARRIER};
    tp__coll_args ar = {.kind = TP__COLL_ALL_REDUCE,
                        .dtype = TP_F32,
                        .op = TP_REDUCE_SUM,
                        .buf = buf,
                        .count = COUNT};
    tp_error *err = NULL;
    uint64_t dl = op_deadline(120000);
    for (int i = 0; i < 100; i++) { // warm up
        TP_CHECK_OK(tp__shm_run(w->w_shm, &bar, dl, &err), err);
    }
    uint64_t t0 = tp__now_ns();
    for (int i = 0; i < ITERS; i++) {
        TP_CHECK_OK(tp__shm_run(w->w_shm, &bar, dl, &err), err);
    }
    uint64_t t1 = tp__now_ns();
    for (int i = 0; i < ITERS; i++) {
        TP_CHECK_OK(tp__shm_run(w->w_shm, &ar, dl, &err), err);
    }
    uint64_t t2 = tp__now_ns();
    if (w->w_rank == 0) {
        printf("n=2: barrier %.2f us, 4 KiB f32 all_reduce %.2f us "
               "(mean of %d)\n",
               (double)(t1 - t0) / ITERS / 1000.0,
               (double)(t2 - t1) / ITERS / 1000.0, ITERS);
    }
    free(buf);
    worker_close(w);
}

static void
test_latency(void)
{
    job j = {.j_n = 2, .j_fn = latency_worker, .j_limit_ms = 120000};
    job_run(&j);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_size_1, 60),
    TP_TEST_CASE_T(test_size_2, 120),
    TP_TEST_CASE_T(test_size_3, 150),
    TP_TEST_CASE_T(test_size_4, 150),
    TP_TEST_CASE_T(test_size_8, 200),
    TP_TEST_CASE_T(test_stress, 200),
    TP_TEST_CASE_T(test_death_killed_slot, 60),
    TP_TEST_CASE_T(test_death_exit_cma, 60),
    TP_TEST_CASE_T(test_timeout, 60),
    TP_TEST_CASE_T(test_open_mismatch, 60),
    TP_TEST_CASE_T(test_open_absent, 60),
    TP_TEST_CASE_T(test_latency, 120),
};

TP_TEST_MAIN(cases)
