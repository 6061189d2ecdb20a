// SPDX-License-Identifier: Apache-2.0
// shm_test.c - the shm transport's own cases (the conformance suite runs
// against shm too): domain descriptor, viability, addresses, round trips in
// one process and across fork(), messages larger than the ring, idle CPU,
// garbage on a listener's socket, SIGKILL of the peer, timeouts, cancel,
// close, and reading what a dead peer left in the ring.
//
// Every wait has a deadline. Multi-process cases fork before any thread
// exists, and the helper learns when to connect through a pipe.

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/aio.h"
#include "core/config.h"
#include "core/log.h"
#include "core/loop.h"
#include "core/wire.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "transport/transport.h"

// ---- fixture ----------------------------------------------------------------

typedef struct env {
    tp_config cfg;
    tp_loop *loop;
    tp_transport *t;
} env;

static void
env_init_backend(env *e, int64_t ring, int64_t backend)
{
    tp_error *err = NULL;
    memset(e, 0, sizeof(*e));
    TP_CHECK_OK(tp__config_load(&e->cfg, &err), err);
    if (ring > 0) {
        e->cfg.shm_ring_size = ring;
    }
    if (backend >= 0) {
        e->cfg.io_backend = backend;
    }
    e->cfg.handshake_timeout_ms = 2000;
    TP_CHECK_OK(tp__loop_create(&e->cfg, "shmtest", &e->loop, &err), err);
    tp_status st = tp__transport_create("shm", e->loop, &e->cfg, &e->t, &err);
    if (st == TP_ENOTSUP) {
        tp_test_skip("%s", tp_error_message(err));
    }
    TP_CHECK_OK(st, err);
}

static void
env_init(env *e, int64_t ring)
{
    env_init_backend(e, ring, -1);
}

static void
env_fini(env *e)
{
    tp__transport_destroy(e->t);
    tp__loop_destroy(e->loop);
}

static void
op_io(op *o, tp_conn *c, bool write, unsigned n, const tp_iov *iov)
{
    TP_CHECK_OK(tp_aio_set_iov(o->aio, n, iov), NULL);
    if (write) {
        tp__conn_write(c, o->aio);
    } else {
        tp__conn_read(c, o->aio);
    }
}

static tp_status
xfer(tp_conn *c, bool write, void *buf, uint64_t len, int64_t timeout_ms)
{
    op o;
    op_init(&o, timeout_ms);
    tp_iov iov = {buf, len};
    op_io(&o, c, write, 1, &iov);
    op_wait(&o, timeout_ms + 5000);
    tp_status st = tp_aio_status(o.aio);
    if (st == TP_OK) {
        TP_CHECK_EQ(tp_aio_count(o.aio), len);
    }
    op_fini(&o);
    return st;
}

static void
fill(uint8_t *p, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n; i++) {
        p[i] = (uint8_t)((i * 131u + seed * 7u) ^ (i >> 11));
    }
}

static void
check_fill(const uint8_t *p, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n; i++) {
        uint8_t want = (uint8_t)((i * 131u + seed * 7u) ^ (i >> 11));
        TP_CHECKF(p[i] == want, "byte %llu of %llu: got 0x%02x, want 0x%02x",
                  (unsigned long long)i, (unsigned long long)n, p[i], want);
    }
}

static tp_conn *
do_connect(env *e, const char *addr, tp_status *st_p, char *msg, size_t len)
{
    op o;
    op_init(&o, 5000);
    tp__transport_connect(e->t, addr, o.aio);
    op_wait(&o, 10000);
    *st_p = tp_aio_status(o.aio);
    if (msg != NULL) {
        snprintf(msg, len, "%s", tp_error_message(tp_aio_error(o.aio)));
    }
    tp_conn *c = tp_aio_get_output(o.aio, 0);
    TP_CHECK((*st_p == TP_OK) == (c != NULL));
    op_fini(&o);
    return c;
}

// A connected pair in this process: *c_p connected, *s_p accepted.
static void
make_pair(env *e, tp_listener **l_p, tp_conn **c_p, tp_conn **s_p)
{
    tp_error *err = NULL;
    TP_CHECK_OK(tp__transport_listen(e->t, NULL, l_p, &err), err);
    op acc;
    op_init(&acc, 5000);
    tp__listener_accept(*l_p, acc.aio);
    tp_status st;
    char msg[512];
    *c_p = do_connect(e, tp__listener_addr(*l_p), &st, msg, sizeof(msg));
    TP_CHECKF(st == TP_OK, "connect: %s", msg);
    op_wait(&acc, 10000);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    *s_p = tp_aio_get_output(acc.aio, 0);
    TP_CHECK(*s_p != NULL);
    op_fini(&acc);
}

static void
free_pair(env *e, tp_listener *l, tp_conn *c, tp_conn *s)
{
    tp__conn_unref(c);
    tp__conn_unref(s);
    tp__listener_destroy(l);
    env_fini(e);
}

static double
cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void
sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// ---- domain, viability, addresses
// ----------------------------------------------

static void
domain_descriptor(void)
{
    env e, e2;
    env_init(&e, 0);
    env_init(&e2, 0);
    const char *d = tp__transport_domain(e.t);
    TP_CHECKF(strncmp(d, "shm:", 4) == 0, "domain \"%s\"", d);
    // shm:<boot id>:<net ns inode>:<user ns inode>
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    TP_CHECK(f != NULL);
    TP_CHECK(fgets(boot, sizeof(boot), f) != NULL);
    fclose(f);
    boot[strcspn(boot, "\n")] = '\0';
    TP_CHECK_EQ(strlen(boot), 36);
    TP_CHECKF(strncmp(d + 4, boot, 36) == 0 && d[40] == ':',
              "domain \"%s\" lacks boot id %s", d, boot);
    char *end;
    unsigned long long net = strtoull(d + 41, &end, 10);
    TP_CHECKF(net > 0 && *end == ':', "domain \"%s\"", d);
    unsigned long long user = strtoull(end + 1, &end, 10);
    TP_CHECKF(user > 0 && *end == '\0', "domain \"%s\"", d);
    struct stat st;
    TP_CHECK(stat("/proc/self/ns/net", &st) == 0);
    TP_CHECK_EQ(net, st.st_ino);
    TP_CHECK(stat("/proc/self/ns/user", &st) == 0);
    TP_CHECK_EQ(user, st.st_ino);
    TP_CHECK(strcmp(d, tp__transport_domain(e2.t)) == 0);
    env_fini(&e2);
    env_fini(&e);
}

static void
viable(void)
{
    const tp_transport_ops *ops = tp__transport_find("shm");
    TP_CHECK(ops != NULL);
    tp_config cfg;
    tp__config_defaults(&cfg);
    char why[256] = "";
    TP_CHECKF(ops->is_viable(&cfg, why, sizeof(why)), "not viable: %s", why);
}

static void
listen_addresses(void)
{
    env e;
    env_init(&e, 0);
    tp_error *err = NULL;
    tp_listener *l1, *l2, *l3, *l4;
    TP_CHECK_OK(tp__transport_listen(e.t, NULL, &l1, &err), err);
    TP_CHECK_OK(tp__transport_listen(e.t, "", &l2, &err), err);
    TP_CHECK_OK(tp__transport_listen(e.t, "shm://", &l3, &err), err);
    char want[64];
    snprintf(want, sizeof(want), "shm://tpipe-%d-", (int)getpid());
    TP_CHECK_STR_CONTAINS(tp__listener_addr(l1), want);
    TP_CHECK(strncmp(tp__listener_addr(l1), want, strlen(want)) == 0);
    TP_CHECK(strcmp(tp__listener_addr(l1), tp__listener_addr(l2)) != 0);
    TP_CHECK(strcmp(tp__listener_addr(l2), tp__listener_addr(l3)) != 0);
    char name[64];
    snprintf(name, sizeof(name), "shm://tp-test-listen-%d", (int)getpid());
    TP_CHECK_OK(tp__transport_listen(e.t, name, &l4, &err), err);
    TP_CHECK(strcmp(tp__listener_addr(l4), name) == 0);
    tp_listener *bad = NULL;
    TP_CHECK_EQ(tp__transport_listen(e.t, name, &bad, &err), TP_EADDRINUSE);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), name);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__transport_listen(e.t, "tcp://127.0.0.1:0", &bad, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__transport_listen(e.t, "shm://a/b", &bad, &err), TP_EINVAL);
    tp_error_unref(err);
    tp__listener_destroy(l1);
    tp__listener_destroy(l2);
    tp__listener_destroy(l3);
    tp__listener_destroy(l4);
    env_fini(&e);
}

static void
connect_refused(void)
{
    env e;
    env_init(&e, 0);
    char addr[64], msg[512];
    snprintf(addr, sizeof(addr), "shm://tp-nobody-%d", (int)getpid());
    tp_status st;
    tp_conn *c = do_connect(&e, addr, &st, msg, sizeof(msg));
    TP_CHECK(c == NULL);
    TP_CHECKF(st == TP_ECONNREFUSED, "%s: %s", tp_status_name(st), msg);
    TP_CHECK_STR_CONTAINS(msg, addr);
    c = do_connect(&e, "shm://bad name", &st, msg, sizeof(msg));
    TP_CHECK_EQ(st, TP_EINVAL);
    env_fini(&e);
}

// ---- data
// ----------------------------------------------------------------------

static void
roundtrip_backend(int64_t backend)
{
    env e;
    env_init_backend(&e, 0, backend);
    tp_listener *l;
    tp_conn *c, *s;
    make_pair(&e, &l, &c, &s);
    char pid[32];
    snprintf(pid, sizeof(pid), "pid %d", (int)getpid());
    TP_CHECK_STR_CONTAINS(tp__conn_peer(c), pid);
    TP_CHECK_STR_CONTAINS(tp__conn_peer(c), tp__listener_addr(l));
    TP_CHECK_STR_CONTAINS(tp__conn_peer(s), tp__listener_addr(l));
    uint8_t a[64], b[64];
    for (int i = 0; i < 100; i++) {
        fill(a, sizeof(a), (uint64_t)i);
        TP_CHECK_EQ(xfer(c, true, a, sizeof(a), 5000), TP_OK);
        memset(b, 0, sizeof(b));
        TP_CHECK_EQ(xfer(s, false, b, sizeof(b), 5000), TP_OK);
        check_fill(b, sizeof(b), (uint64_t)i);
        TP_CHECK_EQ(xfer(s, true, b, sizeof(b), 5000), TP_OK);
        TP_CHECK_EQ(xfer(c, false, a, sizeof(a), 5000), TP_OK);
        check_fill(a, sizeof(a), (uint64_t)i);
    }
    // Several iovs, some empty, on both sides; a zero-length op.
    uint8_t big[1000], out[1000];
    fill(big, sizeof(big), 9);
    tp_iov wi[4] = {
        {big, 10}, {big + 10, 0}, {big + 10, 490}, {big + 500, 500}};
    tp_iov ri[3] = {{out, 333}, {out + 333, 0}, {out + 333, 667}};
    op w, r;
    op_init(&w, 5000);
    op_init(&r, 5000);
    op_io(&r, s, false, 3, ri);
    op_io(&w, c, true, 4, wi);
    op_wait(&w, 10000);
    op_wait(&r, 10000);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    TP_CHECK_EQ(tp_aio_count(r.aio), 1000);
    check_fill(out, sizeof(out), 9);
    op_fini(&w);
    op_fini(&r);
    TP_CHECK_EQ(xfer(c, true, NULL, 0, 5000), TP_OK);
    TP_CHECK_EQ(xfer(s, false, NULL, 0, 5000), TP_OK);
    free_pair(&e, l, c, s);
}

static void
roundtrip_epoll(void)
{
    roundtrip_backend(TP_IO_BACKEND_EPOLL);
}

static void
roundtrip_uring(void)
{
    char why[256];
    if (!tp__loop_uring_viable(why, sizeof(why))) {
        tp_test_skip("io_uring: %s", why);
    }
    roundtrip_backend(TP_IO_BACKEND_URING);
}

// Writes and reads much larger than the 64 KiB ring, queued several deep,
// with iov splits that differ between the two sides.
static void
larger_than_ring(void)
{
    env e;
    env_init(&e, 64 * 1024);
    tp_listener *l;
    tp_conn *c, *s;
    make_pair(&e, &l, &c, &s);
    enum { NMSG = 4 };
    const uint64_t sizes[NMSG] = {5u * 1024 * 1024 + 123, 1, 65536,
                                  3u * 1024 * 1024 + 7};
    uint8_t *src[NMSG], *dst[NMSG];
    op w[NMSG], r[NMSG];
    for (int i = 0; i < NMSG; i++) {
        src[i] = malloc(sizes[i]);
        dst[i] = calloc(1, sizes[i]);
        TP_CHECK(src[i] != NULL && dst[i] != NULL);
        fill(src[i], sizes[i], (uint64_t)i + 1);
        op_init(&w[i], 20000);
        op_init(&r[i], 20000);
    }
    for (int i = 0; i < NMSG; i++) {
        uint64_t h = sizes[i] / 3;
        tp_iov wi[3] = {
            {src[i], h}, {src[i] + h, h}, {src[i] + 2 * h, sizes[i] - 2 * h}};
        op_io(&w[i], c, true, 3, wi);
        uint64_t q = sizes[i] / 2 + 1;
        tp_iov ri[2] = {{dst[i], q}, {dst[i] + q, sizes[i] - q}};
        op_io(&r[i], s, false, 2, ri);
    }
    for (int i = 0; i < NMSG; i++) {
        op_wait(&w[i], 30000);
        op_wait(&r[i], 30000);
        TP_CHECK_OK(tp_aio_status(w[i].aio), tp_aio_error(w[i].aio));
        TP_CHECK_OK(tp_aio_status(r[i].aio), tp_aio_error(r[i].aio));
        TP_CHECK_EQ(tp_aio_count(r[i].aio), sizes[i]);
        check_fill(dst[i], sizes[i], (uint64_t)i + 1);
        op_fini(&w[i]);
        op_fini(&r[i]);
        free(src[i]);
        free(dst[i]);
    }
    free_pair(&e, l, c, s);
}

// Many small writes in flight at once arrive in order.
static void
many_small_in_order(void)
{
    env e;
    env_init(&e, 64 * 1024);
    tp_listener *l;
    tp_conn *c, *s;
    make_pair(&e, &l, &c, &s);
    enum { N = 200 };
    static uint8_t wb[N][300], rb[N][300];
    static op w[N], r[N];
    for (int i = 0; i < N; i++) {
        uint64_t n = 1 + (uint64_t)(i * 37) % 300;
        fill(wb[i], n, (uint64_t)i);
        op_init(&w[i], 20000);
        op_init(&r[i], 20000);
        tp_iov wi = {wb[i], n};
        op_io(&w[i], c, true, 1, &wi);
    }
    for (int i = 0; i < N; i++) {
        uint64_t n = 1 + (uint64_t)(i * 37) % 300;
        tp_iov ri = {rb[i], n};
        op_io(&r[i], s, false, 1, &ri);
    }
    for (int i = 0; i < N; i++) {
        uint64_t n = 1 + (uint64_t)(i * 37) % 300;
        op_wait(&w[i], 30000);
        op_wait(&r[i], 30000);
        TP_CHECK_OK(tp_aio_status(r[i].aio), tp_aio_error(r[i].aio));
        check_fill(rb[i], n, (uint64_t)i);
        op_fini(&w[i]);
        op_fini(&r[i]);
    }
    free_pair(&e, l, c, s);
}

// ---- across fork()
// --------------------------------------------------------------

static const uint64_t echo_sizes[] = {1, 64, 4096, 65536 + 7,
                                      3u * 1024 * 1024 + 5};

// Helper process: connects to @addr once the parent says so, echoes every
// message of echo_sizes back, then exits.
static void
echo_child(const char *addr, int go_fd)
{
    char b;
    if (read(go_fd, &b, 1) != 1) {
        _exit(2);
    }
    env e;
    env_init(&e, 64 * 1024);
    tp_status st;
    char msg[512];
    tp_conn *c = do_connect(&e, addr, &st, msg, sizeof(msg));
    if (c == NULL) {
        fprintf(stderr, "child: connect: %s\n", msg);
        _exit(3);
    }
    for (size_t i = 0; i < TP_ARRAY_LEN(echo_sizes); i++) {
        uint8_t *buf = malloc(echo_sizes[i]);
        if (xfer(c, false, buf, echo_sizes[i], 10000) != TP_OK ||
            xfer(c, true, buf, echo_sizes[i], 10000) != TP_OK) {
            _exit(4);
        }
        free(buf);
    }
    // Wait for the parent to close first (EOF), then leave.
    uint8_t x;
    st = xfer(c, false, &x, 1, 10000);
    tp__conn_unref(c);
    env_fini(&e);
    _exit(st == TP_ECONNRESET ? 0 : 5);
}

static pid_t
fork_helper(const char *addr, int *go_fd_p, void (*fn)(const char *, int))
{
    int p[2];
    TP_CHECK(pipe(p) == 0);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        close(p[1]);
        fn(addr, p[0]);
        _exit(0);
    }
    close(p[0]);
    *go_fd_p = p[1];
    return pid;
}

static int
wait_child(pid_t pid, int64_t ms)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (tp__now_ns() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            TP_CHECKF(false, "helper %d did not exit within %lld ms", (int)pid,
                      (long long)ms);
        }
        sleep_ms(5);
    }
}

static void
fork_roundtrip(void)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "shm://tp-test-fork-%d", (int)getpid());
    int go;
    pid_t child = fork_helper(addr, &go, echo_child);
    env e;
    env_init(&e, 64 * 1024);
    tp_error *err = NULL;
    tp_listener *l;
    TP_CHECK_OK(tp__transport_listen(e.t, addr, &l, &err), err);
    op acc;
    op_init(&acc, 10000);
    tp__listener_accept(l, acc.aio);
    TP_CHECK(write(go, "g", 1) == 1);
    op_wait(&acc, 15000);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    tp_conn *s = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    char pid[32];
    snprintf(pid, sizeof(pid), "pid %d", (int)child);
    TP_CHECK_STR_CONTAINS(tp__conn_peer(s), pid);
    for (size_t i = 0; i < TP_ARRAY_LEN(echo_sizes); i++) {
        uint64_t n = echo_sizes[i];
        uint8_t *a = malloc(n), *b = calloc(1, n);
        fill(a, n, i + 100);
        op w, r;
        op_init(&w, 10000);
        op_init(&r, 10000);
        tp_iov wi = {a, n}, ri = {b, n};
        op_io(&r, s, false, 1, &ri);
        op_io(&w, s, true, 1, &wi);
        op_wait(&w, 15000);
        op_wait(&r, 15000);
        TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
        TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
        check_fill(b, n, i + 100);
        op_fini(&w);
        op_fini(&r);
        free(a);
        free(b);
    }
    tp__conn_close(s);
    TP_CHECK_EQ(wait_child(child, 10000), 0);
    tp__conn_unref(s);
    tp__listener_destroy(l);
    env_fini(&e);
    close(go);
}

// ---- no idle burn
// -----------------------------------------------------------------

static void
idle_cpu(void)
{
    env e;
    env_init(&e, 64 * 1024);
    tp_listener *l;
    tp_conn *c, *s;
    make_pair(&e, &l, &c, &s);
    uint8_t a[64] = {1}, b[64];
    TP_CHECK_EQ(xfer(c, true, a, 64, 5000), TP_OK);
    TP_CHECK_EQ(xfer(s, false, b, 64, 5000), TP_OK);

    // A read pending with no traffic: spin briefly, then sleep.
    op r;
    op_init(&r, 0);
    tp_iov ri = {b, 64};
    op_io(&r, s, false, 1, &ri);
    sleep_ms(50);
    double t0 = cpu_ms();
    sleep_ms(300);
    double used = cpu_ms() - t0;
    printf("pending read: %.2f ms of CPU in 300 ms\n", used);
    TP_CHECKF(used < 30.0, "pending read burned %.1f ms of CPU in 300 ms",
              used);
    // The sleeping reader wakes for data.
    uint64_t w0 = tp__now_ns();
    TP_CHECK_EQ(xfer(c, true, a, 64, 5000), TP_OK);
    op_wait(&r, 2000);
    TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
    TP_CHECKF(tp__now_ns() - w0 < 1000000000u, "wake-up took too long");
    op_fini(&r);

    // A write blocked on a full ring: same.
    size_t n = 1024 * 1024;
    uint8_t *big = malloc(n), *back = malloc(n);
    fill(big, n, 3);
    op w;
    op_init(&w, 0);
    tp_iov wi = {big, n};
    op_io(&w, c, true, 1, &wi);
    sleep_ms(50);
    t0 = cpu_ms();
    sleep_ms(300);
    used = cpu_ms() - t0;
    printf("blocked write: %.2f ms of CPU in 300 ms\n", used);
    TP_CHECKF(used < 30.0, "blocked write burned %.1f ms of CPU in 300 ms",
              used);
    TP_CHECK_EQ(xfer(s, false, back, n, 5000), TP_OK);
    op_wait(&w, 5000);
    TP_CHECK_OK(tp_aio_status(w.aio), tp_aio_error(w.aio));
    check_fill(back, n, 3);
    op_fini(&w);
    free(big);
    free(back);

    // Idle connections, nothing pending.
    t0 = cpu_ms();
    sleep_ms(300);
    used = cpu_ms() - t0;
    printf("idle conns: %.2f ms of CPU in 300 ms\n", used);
    TP_CHECKF(used < 30.0, "idle conns burned %.1f ms of CPU in 300 ms", used);
    free_pair(&e, l, c, s);
}

// ---- garbage on a listener
// ----------------------------------------------------------

static tp_mtx log_mtx;
static char log_buf[16384];

static void
log_capture(tp_log_level level, const char *id, const char *msg, void *arg)
{
    TP_UNUSED(arg);
    if (level > TP_LOG_LEVEL_WARN) {
        return;
    }
    tp__mtx_lock(&log_mtx);
    size_t len = strlen(log_buf);
    snprintf(log_buf + len, sizeof(log_buf) - len, "%s %s\n", id, msg);
    tp__mtx_unlock(&log_mtx);
}

static bool
log_contains(const char *s)
{
    tp__mtx_lock(&log_mtx);
    bool r = strstr(log_buf, s) != NULL;
    tp__mtx_unlock(&log_mtx);
    return r;
}

// A raw client of the listener @addr ("shm://NAME").
static int
raw_connect(const char *addr)
{
    const char *name = addr + 6;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path + 1, name, strlen(name));
    socklen_t len =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TP_CHECK(fd >= 0);
    TP_CHECKF(connect(fd, (struct sockaddr *)&sa, len) == 0, "connect: %s",
              strerror(errno));
    return fd;
}

// Sends @len bytes of @buf with the fds @fds (may be 0).
static void
raw_send(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * 4)];
    } u;
    memset(&u, 0, sizeof(u));
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (nfds > 0) {
        m.msg_control = u.b;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    TP_CHECK(sendmsg(fd, &m, MSG_NOSIGNAL) == (ssize_t)len);
}

// Waits until the listener closed the raw connection (EOF or reset).
static void
raw_expect_closed(int fd, int64_t ms)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = (int64_t)(deadline - tp__now_ns()) / 1000000;
        TP_CHECKF(tp__now_ns() < deadline,
                  "the listener did not close a bad connection in %lld ms",
                  (long long)ms);
        if (poll(&p, 1, (int)TP_MAX(left, 1)) <= 0) {
            continue;
        }
        char b[256];
        ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        TP_CHECKF(n <= 0, "the listener answered a bad hello (%zd bytes)", n);
        if (n == 0 || errno != EAGAIN) {
            break;
        }
    }
    close(fd);
}

static void
hello_bytes(uint8_t *b, uint32_t version, uint64_t ring)
{
    memcpy(b, TP_HELLO_MAGIC, 8);
    tp__put_u32le(b + 8, version);
    tp__put_u32le(b + 12, 0);
    tp__put_u64le(b + 16, ring);
    tp__put_u64le(b + 24, 4096);
    memset(b + 32, 0, 8);
}

static void
garbage_rejected(void)
{
    tp__mtx_init(&log_mtx);
    tp_log_set_handler(log_capture, NULL);
    tp_log_set_level(TP_LOG_LEVEL_WARN);
    env e;
    env_init(&e, 64 * 1024);
    e.t->t_cfg.handshake_timeout_ms = 300; // the truncated-and-silent case
    tp_error *err = NULL;
    tp_listener *l;
    TP_CHECK_OK(tp__transport_listen(e.t, NULL, &l, &err), err);
    const char *addr = tp__listener_addr(l);
    op acc;
    op_init(&acc, 0);
    tp__listener_accept(l, acc.aio);

    // Random bytes.
    int fd = raw_connect(addr);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t)(i * 97 + 13);
    }
    raw_send(fd, junk, sizeof(junk), NULL, 0);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("TP-SHM-HELLO"));
    TP_CHECK(log_contains("bad magic"));

    // A truncated hello, then EOF.
    uint8_t h[40];
    hello_bytes(h, 1, 65536);
    fd = raw_connect(addr);
    raw_send(fd, h, 10, NULL, 0);
    shutdown(fd, SHUT_WR);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("after 10 of 40 hello bytes"));

    // A truncated hello, then silence: the handshake deadline.
    fd = raw_connect(addr);
    raw_send(fd, h, 20, NULL, 0);
    raw_expect_closed(fd, 3000);
    TP_CHECK(log_contains("timed out after 300 ms with 20 of 40"));

    // A whole hello without fds.
    fd = raw_connect(addr);
    raw_send(fd, h, 40, NULL, 0);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("expected 2 fds"));

    // A future version.
    uint8_t h2[40];
    hello_bytes(h2, 99, 65536);
    fd = raw_connect(addr);
    raw_send(fd, h2, 40, NULL, 0);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("unsupported version 99"));

    // A ring size that is not a power of two.
    hello_bytes(h2, 1, 65537);
    fd = raw_connect(addr);
    raw_send(fd, h2, 40, NULL, 0);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("ring size 65537"));

    // Pipes instead of a memfd and an eventfd.
    int p[2];
    TP_CHECK(pipe(p) == 0);
    int efd = eventfd(0, EFD_CLOEXEC);
    TP_CHECK(efd >= 0);
    fd = raw_connect(addr);
    int fds[2] = {p[0], efd};
    raw_send(fd, h, 40, fds, 2);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("not a memfd"));

    // A memfd smaller than the hello says.
    int mfd = memfd_create("tp-test", MFD_CLOEXEC);
    TP_CHECK(mfd >= 0);
    TP_CHECK(ftruncate(mfd, 4096) == 0);
    fd = raw_connect(addr);
    fds[0] = mfd;
    raw_send(fd, h, 40, fds, 2);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("the hello says"));

    // Too many fds.
    fd = raw_connect(addr);
    int three[3] = {mfd, efd, p[1]};
    raw_send(fd, h, 40, three, 3);
    raw_expect_closed(fd, 2000);
    TP_CHECK(log_contains("more than 2 fds"));

    // The second fd is not an eventfd.
    TP_CHECK(ftruncate(mfd, 4096 + 65536) == 0);
    fd = raw_connect(addr);
    fds[1] = p[1];
    raw_send(fd, h, 40, fds, 2);
    raw_expect_closed(fd, 2000);
    // An unsealed memfd is refused before its fd type is looked at.
    TP_CHECK(log_contains("not sealed") || log_contains("not an eventfd"));
    close(p[0]);
    close(p[1]);
    close(efd);
    close(mfd);

    // No accept completed for any of these; a proper peer still gets in.
    TP_CHECK(!op_wait_for(&acc, 100));
    tp_status st;
    char msg[512];
    tp_conn *c = do_connect(&e, addr, &st, msg, sizeof(msg));
    TP_CHECKF(st == TP_OK, "connect after garbage: %s", msg);
    op_wait(&acc, 5000);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    tp_conn *s = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    uint8_t a[64] = {7}, b[64] = {0};
    TP_CHECK_EQ(xfer(c, true, a, 64, 5000), TP_OK);
    TP_CHECK_EQ(xfer(s, false, b, 64, 5000), TP_OK);
    TP_CHECK(memcmp(a, b, 64) == 0);
    free_pair(&e, l, c, s);
    tp_log_set_handler(NULL, NULL);
}

// ---- peer death
// ----------------------------------------------------------------------

// Helper: connects, writes 1 MiB into a 64 KiB ring (the parent reads part
// of it), then hangs until killed.
static void
victim_child(const char *addr, int go_fd)
{
    char b;
    if (read(go_fd, &b, 1) != 1) {
        _exit(2);
    }
    env e;
    env_init(&e, 64 * 1024);
    tp_status st;
    tp_conn *c = do_connect(&e, addr, &st, NULL, 0);
    if (c == NULL) {
        _exit(3);
    }
    size_t n = 1024 * 1024;
    uint8_t *buf = calloc(1, n);
    op w;
    op_init(&w, 0);
    tp_iov wi = {buf, n};
    op_io(&w, c, true, 1, &wi);
    for (;;) {
        pause();
    }
}

static void
peer_sigkill_backend(int64_t backend)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "shm://tp-test-kill-%d", (int)getpid());
    int go;
    pid_t child = fork_helper(addr, &go, victim_child);
    env e;
    env_init_backend(&e, 64 * 1024, backend);
    tp_error *err = NULL;
    tp_listener *l;
    TP_CHECK_OK(tp__transport_listen(e.t, addr, &l, &err), err);
    op acc;
    op_init(&acc, 10000);
    tp__listener_accept(l, acc.aio);
    TP_CHECK(write(go, "g", 1) == 1);
    op_wait(&acc, 15000);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    tp_conn *s = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);

    // A read that gets part of its bytes, and a write that fills the
    // child's inbox (it never reads).
    size_t rn = 4 * 1024 * 1024, wn = 2 * 1024 * 1024;
    uint8_t *rb = malloc(rn), *wb = calloc(1, wn);
    op r, w;
    op_init(&r, 0);
    op_init(&w, 0);
    tp_iov ri = {rb, rn}, wi = {wb, wn};
    op_io(&r, s, false, 1, &ri);
    op_io(&w, s, true, 1, &wi);
    sleep_ms(200);
    TP_CHECK(!op_wait_for(&r, 1));
    TP_CHECK(kill(child, SIGKILL) == 0);
    uint64_t t0 = tp__now_ns();
    op_wait(&r, 2000);
    op_wait(&w, 2000);
    uint64_t dt = tp__now_ns() - t0;
    TP_CHECKF(dt < 1000000000u, "pending ops failed only after %llu ms",
              (unsigned long long)(dt / 1000000u));
    char pid[32];
    snprintf(pid, sizeof(pid), "pid %d", (int)child);
    const tp_error *re = tp_aio_error(r.aio);
    TP_CHECKF(tp_aio_status(r.aio) == TP_ECONNRESET, "read: %s",
              tp_error_message(re));
    TP_CHECK_STR_CONTAINS(tp_error_message(re), pid);
    TP_CHECK_STR_CONTAINS(tp_error_message(re), addr);
    TP_CHECK(tp_aio_count(r.aio) > 0 && tp_aio_count(r.aio) < rn);
    TP_CHECKF(tp_aio_status(w.aio) == TP_ECONNRESET, "write: %s",
              tp_error_message(tp_aio_error(w.aio)));
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(w.aio)), pid);
    // Later ops fail the same way.
    uint8_t x;
    TP_CHECK_EQ(xfer(s, true, &x, 1, 1000), TP_ECONNRESET);
    op_fini(&r);
    op_fini(&w);
    free(rb);
    free(wb);
    wait_child(child, 5000);
    tp__conn_unref(s);
    tp__listener_destroy(l);
    env_fini(&e);
    close(go);
}

static void
peer_sigkill_epoll(void)
{
    peer_sigkill_backend(TP_IO_BACKEND_EPOLL);
}

static void
peer_sigkill_uring(void)
{
    char why[256];
    if (!tp__loop_uring_viable(why, sizeof(why))) {
        tp_test_skip("io_uring: %s", why);
    }
    peer_sigkill_backend(TP_IO_BACKEND_URING);
}

// What a peer wrote before it closed can still be read; then EOF.
static void
drain_after_peer_close(void)
{
    env e;
    env_init(&e, 0);
    tp_listener *l;
    tp_conn *c, *s;
    make_pair(&e, &l, &c, &s);
    uint8_t a[100], b[100];
    fill(a, sizeof(a), 5);
    TP_CHECK_EQ(xfer(c, true, a, sizeof(a), 5000), TP_OK);
    tp__conn_close(c);
    sleep_ms(100); // s sees the EOF before reading
    TP_CHECK_EQ(xfer(s, false, b, 60, 5000), TP_OK);
    TP_CHECK_EQ(xfer(s, false, b + 60, 40, 5000), TP_OK);
    check_fill(b, sizeof(b), 5);
    op r;
    op_init(&r, 5000);
    tp_iov ri = {b, 1};
    op_io(&r, s, false, 1, &ri);
    op_wait(&r, 6000);
    TP_CHECK_EQ(tp_aio_status(r.aio), TP_ECONNRESET);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(r.aio)),
                          "closed the connection (EOF)");
    op_fini(&r);
    free_pair(&e, l, c, s);
}

// ---- timeout, cancel, close
// ---------------------------------------------------------

static void
timeout_and_cancel(void)
{
    env e;
    env_init(&e, 0);
    tp_listener *l;
    tp_conn *c, *s;
    make_pair(&e, &l, &c, &s);
    uint8_t a[100] = {1}, b[100];

    // Nothing moved: only the op fails; the stream stays usable.
    op r;
    op_init(&r, 100);
    tp_iov ri = {b, 100};
    op_io(&r, s, false, 1, &ri);
    op_wait(&r, 5000);
    TP_CHECK_EQ(tp_aio_status(r.aio), TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(r.aio)),
                          "timed out after 100 ms");
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(r.aio)),
                          tp__conn_peer(s));
    op_fini(&r);
    op_init(&r, 0);
    op_io(&r, s, false, 1, &ri);
    tp_aio_cancel(r.aio);
    op_wait(&r, 5000);
    TP_CHECK_EQ(tp_aio_status(r.aio), TP_ECANCELED);
    op_fini(&r);
    TP_CHECK_EQ(xfer(c, true, a, 100, 5000), TP_OK);
    TP_CHECK_EQ(xfer(s, false, b, 100, 5000), TP_OK);

    // Partly moved: the stream is broken and closed; the peer sees it.
    op_init(&r, 0);
    op_io(&r, s, false, 1, &ri);
    TP_CHECK_EQ(xfer(c, true, a, 10, 5000), TP_OK);
    sleep_ms(50);
    op pr;
    op_init(&pr, 0);
    uint8_t x;
    tp_iov pi = {&x, 1};
    op_io(&pr, c, false, 1, &pi);
    tp_aio_cancel(r.aio);
    op_wait(&r, 5000);
    TP_CHECK_EQ(tp_aio_status(r.aio), TP_ECANCELED);
    TP_CHECK_EQ(tp_aio_count(r.aio), 10);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(r.aio)), "broken");
    op_fini(&r);
    TP_CHECK_EQ(xfer(s, false, b, 1, 5000), TP_ECLOSED);
    op_wait(&pr, 2000);
    TP_CHECK_EQ(tp_aio_status(pr.aio), TP_ECONNRESET);
    op_fini(&pr);
    free_pair(&e, l, c, s);
}

static void
close_with_pending(void)
{
    env e;
    env_init(&e, 64 * 1024);
    tp_listener *l;
    tp_conn *c, *s;
    make_pair(&e, &l, &c, &s);
    size_t n = 1024 * 1024;
    uint8_t *big = calloc(1, n), b[16];
    op r, w, pr;
    op_init(&r, 0);
    op_init(&w, 0);
    op_init(&pr, 0);
    tp_iov ri = {b, 16}, wi = {big, n}, pi = {b, 16};
    op_io(&r, c, false, 1, &ri);
    op_io(&w, c, true, 1, &wi);
    op_io(&pr, s, false, 1, &pi);
    sleep_ms(20);
    tp__conn_close(c);
    op_wait(&r, 2000);
    op_wait(&w, 2000);
    TP_CHECK_EQ(tp_aio_status(r.aio), TP_ECLOSED);
    TP_CHECK_EQ(tp_aio_status(w.aio), TP_ECLOSED);
    // The peer got the first 16 bytes of the write, then EOF.
    op_wait(&pr, 2000);
    TP_CHECK_OK(tp_aio_status(pr.aio), tp_aio_error(pr.aio));
    TP_CHECK_EQ(xfer(s, false, big, n, 2000), TP_ECONNRESET);
    TP_CHECK_EQ(xfer(c, false, b, 1, 2000), TP_ECLOSED);
    sleep_ms(20);
    TP_CHECK_EQ(r.done + w.done + pr.done, 3); // once each
    op_fini(&r);
    op_fini(&w);
    op_fini(&pr);
    free(big);
    free_pair(&e, l, c, s);
}

static void
listener_close_pending_accept(void)
{
    env e;
    env_init(&e, 0);
    tp_error *err = NULL;
    tp_listener *l;
    TP_CHECK_OK(tp__transport_listen(e.t, NULL, &l, &err), err);
    op acc;
    op_init(&acc, 0);
    tp__listener_accept(l, acc.aio);
    sleep_ms(10);
    tp__listener_destroy(l);
    op_wait(&acc, 2000);
    TP_CHECK_EQ(tp_aio_status(acc.aio), TP_ECLOSED);
    op_fini(&acc);
    env_fini(&e);
}

// ---- sleep/wake under load
// ------------------------------------------------------------

typedef struct echo_srv {
    tp_conn *c;
    tp_aio *rd, *wr;
    uint8_t buf[64];
    _Atomic int failed;
} echo_srv;

static echo_srv echo_st;

static void
echo_read_next(echo_srv *es)
{
    tp_iov iov = {es->buf, sizeof(es->buf)};
    tp_aio_set_iov(es->rd, 1, &iov);
    tp__conn_read(es->c, es->rd);
}

static void
echo_rd_cb(void *arg)
{
    echo_srv *es = arg;
    if (tp_aio_status(es->rd) != TP_OK) {
        atomic_store(&es->failed, 1);
        return;
    }
    tp_iov iov = {es->buf, sizeof(es->buf)};
    tp_aio_set_iov(es->wr, 1, &iov);
    tp__conn_write(es->c, es->wr);
}

static void
echo_wr_cb(void *arg)
{
    echo_srv *es = arg;
    if (tp_aio_status(es->wr) != TP_OK) {
        atomic_store(&es->failed, 1);
        return;
    }
    echo_read_next(es);
}

// Helper: echoes 64-byte messages from its loop thread until EOF.
static void
pingpong_child(const char *addr, int go_fd)
{
    char b;
    if (read(go_fd, &b, 1) != 1) {
        _exit(2);
    }
    env e;
    env_init(&e, 0);
    tp_status st;
    echo_srv *es = &echo_st;
    es->c = do_connect(&e, addr, &st, NULL, 0);
    if (es->c == NULL) {
        _exit(3);
    }
    tp_aio_create(echo_rd_cb, es, &es->rd);
    tp_aio_create(echo_wr_cb, es, &es->wr);
    echo_read_next(es);
    while (!atomic_load(&es->failed)) {
        sleep_ms(5);
    }
    _exit(0);
}

// Round trips where every wait goes through the sleep/wake path
// (TP_SHM_SPIN_US=0), then with the default spin: a lost wake-up would
// stall a round trip until its deadline.
static void
pingpong_sleep_wake_pass(int pass)
{
    {
        setenv("TP_SHM_SPIN_US", pass == 0 ? "0" : "50", 1);
        char addr[64];
        snprintf(addr, sizeof(addr), "shm://tp-test-pp-%d-%d", (int)getpid(),
                 pass);
        int go;
        pid_t child = fork_helper(addr, &go, pingpong_child);
        env e;
        env_init(&e, 0);
        TP_CHECK_EQ(e.cfg.shm_spin_us, pass == 0 ? 0 : 50);
        tp_error *err = NULL;
        tp_listener *l;
        TP_CHECK_OK(tp__transport_listen(e.t, addr, &l, &err), err);
        op acc;
        op_init(&acc, 10000);
        tp__listener_accept(l, acc.aio);
        TP_CHECK(write(go, "g", 1) == 1);
        op_wait(&acc, 15000);
        TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
        tp_conn *s = tp_aio_get_output(acc.aio, 0);
        op_fini(&acc);
        uint8_t a[64], b[64];
        uint64_t worst = 0;
        for (int i = 0; i < 2000; i++) {
            fill(a, 64, (uint64_t)i);
            uint64_t t0 = tp__now_ns();
            op r;
            op_init(&r, 5000);
            tp_iov ri = {b, 64};
            op_io(&r, s, false, 1, &ri);
            TP_CHECK_EQ(xfer(s, true, a, 64, 5000), TP_OK);
            op_wait(&r, 6000);
            TP_CHECKF(tp_aio_status(r.aio) == TP_OK, "round trip %d: %s", i,
                      tp_error_message(tp_aio_error(r.aio)));
            op_fini(&r);
            check_fill(b, 64, (uint64_t)i);
            worst = TP_MAX(worst, tp__now_ns() - t0);
        }
        printf("spin %s us: worst round trip %.1f ms\n", pass == 0 ? "0" : "50",
               (double)worst / 1e6);
        tp__conn_close(s);
        TP_CHECK_EQ(wait_child(child, 5000), 0);
        tp__conn_unref(s);
        tp__listener_destroy(l);
        env_fini(&e);
        close(go);
    }
}

// Separate cases: a helper is forked only from a process with no threads.
static void
pingpong_sleep_wake_spin0(void)
{
    pingpong_sleep_wake_pass(0);
}

static void
pingpong_sleep_wake_spin50(void)
{
    pingpong_sleep_wake_pass(1);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(domain_descriptor),
    TP_TEST_CASE(viable),
    TP_TEST_CASE(listen_addresses),
    TP_TEST_CASE(connect_refused),
    TP_TEST_CASE(roundtrip_epoll),
    TP_TEST_CASE(roundtrip_uring),
    TP_TEST_CASE(larger_than_ring),
    TP_TEST_CASE(many_small_in_order),
    TP_TEST_CASE(fork_roundtrip),
    TP_TEST_CASE(idle_cpu),
    TP_TEST_CASE(garbage_rejected),
    TP_TEST_CASE(peer_sigkill_epoll),
    TP_TEST_CASE(peer_sigkill_uring),
    TP_TEST_CASE(drain_after_peer_close),
    TP_TEST_CASE(timeout_and_cancel),
    TP_TEST_CASE(close_with_pending),
    TP_TEST_CASE(listener_close_pending_accept),
    TP_TEST_CASE(pingpong_sleep_wake_spin0),
    TP_TEST_CASE(pingpong_sleep_wake_spin50),
};

TP_TEST_MAIN(cases)
