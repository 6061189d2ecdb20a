// SPDX-License-Identifier: Apache-2.0
// store_test.c - the rendezvous store: every operation on every backend
// (mem, file, tcp) with deadlines, PyTorch's compare_set, concurrent adds
// from 8 processes, 64 tcp clients, malformed frames sent to the server,
// the init methods (env:// with RANK, Slurm and OpenMPI variables, tcp://,
// file://) and EADDRINUSE. Multi-process cases fork every child before
// any thread exists (TSan); loopback only; every wait has a deadline.

#include "tp_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/store.h>

#include "core/platform.h"
#include "core/wire.h"
#include "store/store_int.h"

#define WAIT_MS 20000

// ---- helpers ----

typedef enum backend { B_MEM, B_FILE, B_TCP } backend;

typedef struct fixture {
    backend f_b;
    char f_url[512];
    char f_path[128];
    tp_store_server *f_srv;
} fixture;

static void
fix_init(fixture *f, backend b)
{
    memset(f, 0, sizeof(*f));
    f->f_b = b;
    tp_error *err = NULL;
    switch (b) {
    case B_MEM:
        snprintf(f->f_url, sizeof(f->f_url), "mem://t%d", (int)getpid());
        break;
    case B_FILE: {
        snprintf(f->f_path, sizeof(f->f_path), "/tmp/tp_store_XXXXXX");
        int fd = mkstemp(f->f_path);
        TP_CHECK(fd >= 0);
        close(fd);
        snprintf(f->f_url, sizeof(f->f_url), "file://%s", f->f_path);
        break;
    }
    case B_TCP:
        TP_CHECK_OK(tp_store_server_start("tcp://127.0.0.1:0", &f->f_srv, &err),
                    err);
        snprintf(f->f_url, sizeof(f->f_url), "%s?server=0",
                 tp_store_server_addr(f->f_srv));
        break;
    }
}

static void
fix_fini(fixture *f)
{
    tp_store_server_stop(f->f_srv);
    if (f->f_path[0] != '\0') {
        unlink(f->f_path);
    }
}

static tp_store *
open_store(const char *url, int rank, int world)
{
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(url, rank, world, tp_test_ms(WAIT_MS), &s, &err),
                err);
    return s;
}

static void
check_get(tp_store *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_get(s, key, tp_test_ms(WAIT_MS), &v, &n, &err), err);
    TP_CHECK_EQ(n, strlen(want));
    TP_CHECKF(memcmp(v, want, n) == 0, "get %s: \"%s\", want \"%s\"", key,
              (char *)v, want);
    TP_CHECK(((char *)v)[n] == '\0');
    free(v);
}

static void
set_str(tp_store *s, const char *key, const char *v)
{
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_set(s, key, v, strlen(v), TP_TIMEOUT_DEFAULT, &err),
                err);
}

static void
check_cas(tp_store *s, const char *key, const char *exp, const char *des,
          const char *want)
{
    void *v = NULL;
    size_t n = 0;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_compare_set(s, key, exp, strlen(exp), des, strlen(des),
                                     TP_TIMEOUT_DEFAULT, &v, &n, &err),
                err);
    TP_CHECK_EQ(n, strlen(want));
    TP_CHECKF(memcmp(v, want, n) == 0, "cas: \"%s\", want \"%s\"", (char *)v,
              want);
    free(v);
}

// Forks a child that runs @fn(@arg) and exits 0 (or 1 on a failed check).
static pid_t
spawn(void (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        fn(arg);
        _exit(0);
    }
    return pid;
}

// Waits for @pid until the deadline; kills it then. Checks exit 0.
static void
reap_ok(pid_t pid)
{
    uint64_t dl = tp__now_ns() + (uint64_t)tp_test_ms(WAIT_MS) * 1000000u;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            break;
        }
        if (tp__now_ns() > dl) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            TP_CHECKF(false, "child %d did not exit in time", (int)pid);
        }
        usleep(2000);
    }
    TP_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child %d failed (status 0x%x)", (int)pid, status);
}

// ---- every operation on one backend ----

static void
ops(backend b)
{
    fixture f;
    fix_init(&f, b);
    tp_store *s = open_store(f.f_url, 0, 1);
    tp_error *err = NULL;

    set_str(s, "a", "hello");
    check_get(s, "a", "hello");
    set_str(s, "a", "world");
    check_get(s, "a", "world");
    set_str(s, "empty", "");
    check_get(s, "empty", "");

    // A missing key times out, naming the key, the store and the time.
    void *v = NULL;
    size_t n = 0;
    uint64_t t0 = tp__now_ns();
    tp_status st = tp_store_get(s, "missing", 150, &v, &n, &err);
    TP_CHECK_EQ(st, TP_ETIMEDOUT);
    TP_CHECK(tp__now_ns() - t0 >= 140u * 1000000u);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "get \"missing\" (rank 0)");
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "timed out after 150 ms: key not set");
    char want[600];
    snprintf(want, sizeof(want), "store %s", tp_store_addr(s));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), want);
    tp_error_unref(err);
    err = NULL;

    // add
    int64_t x = 0;
    TP_CHECK_OK(tp_store_add(s, "ctr", 5, TP_TIMEOUT_DEFAULT, &x, &err), err);
    TP_CHECK_EQ(x, 5);
    TP_CHECK_OK(tp_store_add(s, "ctr", -7, TP_TIMEOUT_DEFAULT, &x, &err), err);
    TP_CHECK_EQ(x, -2);
    check_get(s, "ctr", "-2");
    TP_CHECK_EQ(tp_store_add(s, "a", 1, TP_TIMEOUT_DEFAULT, &x, &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "not a decimal integer");
    tp_error_unref(err);
    err = NULL;

    // compare_set, PyTorch's semantics.
    check_cas(s, "c", "", "first", "first"); // missing + "" -> set
    check_cas(s, "c", "nope", "x", "first"); // mismatch -> current
    check_cas(s, "c", "first", "second", "second");
    check_cas(s, "d", "exp", "des", "exp"); // missing + expected -> exp
    TP_CHECK_EQ(tp_store_get(s, "d", 10, &v, &n, &err), TP_ETIMEDOUT);
    tp_error_unref(err);
    err = NULL;

    // wait: present keys at once; a missing one is named.
    const char *keys[] = {"a", "c", "ctr"};
    TP_CHECK_OK(tp_store_wait(s, keys, 3, TP_TIMEOUT_DEFAULT, &err), err);
    const char *keys2[] = {"a", "nokey1", "c", "nokey2"};
    TP_CHECK_EQ(tp_store_wait(s, keys2, 4, 100, &err), TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "wait \"a\", \"nokey1\"");
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "not set: \"nokey1\", \"nokey2\"");
    tp_error_unref(err);
    err = NULL;

    // delete_key and num_keys
    int64_t k = 0;
    TP_CHECK_OK(tp_store_num_keys(s, TP_TIMEOUT_DEFAULT, &k, &err), err);
    TP_CHECK_EQ(k, 4); // a, empty, ctr, c
    bool del = false;
    TP_CHECK_OK(tp_store_delete_key(s, "a", TP_TIMEOUT_DEFAULT, &del, &err),
                err);
    TP_CHECK(del);
    TP_CHECK_OK(tp_store_delete_key(s, "a", TP_TIMEOUT_DEFAULT, &del, &err),
                err);
    TP_CHECK(!del);
    TP_CHECK_OK(tp_store_num_keys(s, TP_TIMEOUT_DEFAULT, &k, &err), err);
    TP_CHECK_EQ(k, 3);
    TP_CHECK_EQ(tp_store_get(s, "a", 10, &v, &n, &err), TP_ETIMEDOUT);
    tp_error_unref(err);
    err = NULL;

    // Bounds: key length, empty key.
    char *big = malloc(TP_STORE_MAX_KEY + 2);
    memset(big, 'k', TP_STORE_MAX_KEY + 1);
    big[TP_STORE_MAX_KEY + 1] = 0;
    TP_CHECK_EQ(tp_store_set(s, big, "v", 1, TP_TIMEOUT_DEFAULT, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    big[TP_STORE_MAX_KEY] = 0; // exactly the limit is fine
    set_str(s, big, "v");
    check_get(s, big, "v");
    free(big);
    TP_CHECK_EQ(tp_store_set(s, "", "v", 1, TP_TIMEOUT_DEFAULT, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;

    // A binary value of some size.
    size_t bl = 1 << 20;
    uint8_t *bv = malloc(bl);
    for (size_t i = 0; i < bl; i++) {
        bv[i] = (uint8_t)(i * 7);
    }
    TP_CHECK_OK(tp_store_set(s, "bin", bv, bl, TP_TIMEOUT_DEFAULT, &err), err);
    TP_CHECK_OK(tp_store_get(s, "bin", TP_TIMEOUT_DEFAULT, &v, &n, &err), err);
    TP_CHECK_EQ(n, bl);
    TP_CHECK(memcmp(v, bv, bl) == 0);
    free(v);
    free(bv);

    tp_store_close(s);
    fix_fini(&f);
}

static void
test_ops_mem(void)
{
    ops(B_MEM);
}
static void
test_ops_file(void)
{
    ops(B_FILE);
}
static void
test_ops_tcp(void)
{
    ops(B_TCP);
}

// TP_STORE_MAX_VALUE bounds values (checked before sending).
static void
test_max_value(void)
{
    setenv("TP_STORE_MAX_VALUE", "1K", 1);
    fixture f;
    fix_init(&f, B_TCP);
    tp_store *s = open_store(f.f_url, 0, 1);
    char buf[2048] = {0};
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_store_set(s, "k", buf, 1025, TP_TIMEOUT_DEFAULT, &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_STORE_MAX_VALUE");
    tp_error_unref(err);
    TP_CHECK_OK(tp_store_set(s, "k", buf, 1024, TP_TIMEOUT_DEFAULT, &err), err);
    tp_store_close(s);
    fix_fini(&f);
    unsetenv("TP_STORE_MAX_VALUE");
}

// ---- a get that waits for another process's set ----

typedef struct child_args {
    char url[512];
    int rank;
    int world;
    int rfd; // read the url from here first if >= 0
} child_args;

// The url travels as one fixed-size record: writes of up to PIPE_BUF
// bytes are atomic, so children reading one pipe never interleave.
static void
read_url(child_args *a)
{
    if (a->rfd < 0) {
        return;
    }
    size_t n = 0;
    while (n < sizeof(a->url)) {
        ssize_t r = read(a->rfd, a->url + n, sizeof(a->url) - n);
        if (r <= 0) {
            break;
        }
        n += (size_t)r;
    }
    a->url[sizeof(a->url) - 1] = 0;
}

static void
send_url(int fd, const char *url)
{
    char rec[512] = {0};
    snprintf(rec, sizeof(rec), "%s", url);
    TP_CHECK(write(fd, rec, sizeof(rec)) == (ssize_t)sizeof(rec));
}

static void
child_set_late(void *arg)
{
    child_args *a = arg;
    read_url(a);
    tp_store *s = open_store(a->url, a->rank, a->world);
    usleep(150 * 1000);
    set_str(s, "late", "value");
    tp_store_close(s);
}

static void
get_waits(backend b)
{
    int p[2];
    TP_CHECK(pipe(p) == 0);
    child_args a = {.rank = 1, .world = 2, .rfd = p[0]};
    pid_t pid = spawn(child_set_late, &a); // before any thread
    fixture f;
    fix_init(&f, b);
    send_url(p[1], f.f_url);
    tp_store *s = open_store(f.f_url, 0, 2);
    check_get(s, "late", "value");
    const char *k[] = {"late"};
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_wait(s, k, 1, 1000, &err), err);
    reap_ok(pid);
    tp_store_close(s);
    fix_fini(&f);
    close(p[0]);
    close(p[1]);
}

static void
test_get_waits_file(void)
{
    get_waits(B_FILE);
}
static void
test_get_waits_tcp(void)
{
    get_waits(B_TCP);
}

static void *
mem_setter(void *arg)
{
    usleep(100 * 1000);
    tp_store *s = open_store(arg, 1, 2);
    set_str(s, "late", "value");
    tp_store_close(s);
    return NULL;
}

static void
test_get_waits_mem(void)
{
    tp_store *s = open_store("mem://waits", 0, 2);
    pthread_t th;
    pthread_create(&th, NULL, mem_setter, "mem://waits");
    check_get(s, "late", "value");
    pthread_join(th, NULL);
    tp_store_close(s);
}

// ---- 8 processes add concurrently ----

#define ADDERS  8
#define ADDS_EA 50

static void
child_adder(void *arg)
{
    child_args *a = arg;
    read_url(a);
    tp_store *s = open_store(a->url, a->rank, ADDERS + 1);
    tp_error *err = NULL;
    for (int i = 0; i < ADDS_EA; i++) {
        int64_t v;
        TP_CHECK_OK(tp_store_add(s, "sum", 1, TP_TIMEOUT_DEFAULT, &v, &err),
                    err);
        TP_CHECK(v >= 1 && v <= ADDERS * ADDS_EA);
    }
    int64_t v;
    TP_CHECK_OK(tp_store_add(s, "done", 1, TP_TIMEOUT_DEFAULT, &v, &err), err);
    if (v == ADDERS) {
        set_str(s, "all_done", "1");
    }
    tp_store_close(s);
}

static void
add_procs(backend b)
{
    int p[2];
    TP_CHECK(pipe(p) == 0);
    pid_t pids[ADDERS];
    for (int i = 0; i < ADDERS; i++) {
        child_args a = {.rank = i + 1, .rfd = p[0]};
        pids[i] = spawn(child_adder, &a);
    }
    fixture f;
    fix_init(&f, b);
    for (int i = 0; i < ADDERS; i++) {
        send_url(p[1], f.f_url);
    }
    tp_store *s = open_store(f.f_url, 0, ADDERS + 1);
    check_get(s, "all_done", "1");
    char want[16];
    snprintf(want, sizeof(want), "%d", ADDERS * ADDS_EA);
    check_get(s, "sum", want);
    for (int i = 0; i < ADDERS; i++) {
        reap_ok(pids[i]);
    }
    tp_store_close(s);
    fix_fini(&f);
    close(p[0]);
    close(p[1]);
}

static void
test_add_8proc_file(void)
{
    add_procs(B_FILE);
}
static void
test_add_8proc_tcp(void)
{
    add_procs(B_TCP);
}

// ---- 64 tcp clients at once (threads, each its own connection) ----

#define CLIENTS 64

typedef struct cl_arg {
    const char *url;
    int i;
} cl_arg;

static void *
client_main(void *arg)
{
    cl_arg *a = arg;
    tp_store *s = open_store(a->url, a->i + 1, CLIENTS + 1);
    tp_error *err = NULL;
    char k[32], v[32];
    snprintf(k, sizeof(k), "k%d", a->i);
    snprintf(v, sizeof(v), "v%d", a->i);
    set_str(s, k, v);
    int64_t x;
    TP_CHECK_OK(tp_store_add(s, "arrived", 1, TP_TIMEOUT_DEFAULT, &x, &err),
                err);
    // Everyone waits for everyone (a barrier), then reads a neighbour.
    void *val = NULL;
    size_t n;
    TP_CHECK_OK(tp_store_get(s, "go", TP_TIMEOUT_DEFAULT, &val, &n, &err), err);
    free(val);
    snprintf(k, sizeof(k), "k%d", (a->i + 1) % CLIENTS);
    snprintf(v, sizeof(v), "v%d", (a->i + 1) % CLIENTS);
    check_get(s, k, v);
    tp_store_close(s);
    return NULL;
}

static void
test_tcp_64_clients(void)
{
    fixture f;
    fix_init(&f, B_TCP);
    pthread_t th[CLIENTS];
    cl_arg args[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        args[i] = (cl_arg){f.f_url, i};
        TP_CHECK(pthread_create(&th[i], NULL, client_main, &args[i]) == 0);
    }
    tp_store *s = open_store(f.f_url, 0, CLIENTS + 1);
    tp_error *err = NULL;
    const char *keys[CLIENTS];
    char names[CLIENTS][16];
    for (int i = 0; i < CLIENTS; i++) {
        snprintf(names[i], sizeof(names[i]), "k%d", i);
        keys[i] = names[i];
    }
    TP_CHECK_OK(tp_store_wait(s, keys, CLIENTS, TP_TIMEOUT_DEFAULT, &err), err);
    set_str(s, "go", "1");
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
    }
    int64_t x;
    TP_CHECK_OK(tp_store_add(s, "arrived", 0, TP_TIMEOUT_DEFAULT, &x, &err),
                err);
    TP_CHECK_EQ(x, CLIENTS);
    tp_store_close(s);
    fix_fini(&f);
}

// ---- malformed frames: the server drops that client, serves others ----

static int
raw_connect(tp_store_server *srv)
{
    const char *addr = tp_store_server_addr(srv); // tcp://127.0.0.1:P
    int port = atoi(strrchr(addr, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TP_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

// A raw connection past the hellos (ours sent, the server's read).
static int
raw_connect_hello(tp_store_server *srv)
{
    int fd = raw_connect(srv);
    uint8_t h[TP_STORE_HELLO_LEN];
    memcpy(h, TP_STORE_HELLO_MAGIC, 8);
    tp__put_u32le(h + 8, TP_STORE_HELLO_VERSION);
    tp__put_u32le(h + 12, 0);
    TP_CHECK(send(fd, h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h));
    size_t got = 0;
    while (got < sizeof(h)) {
        ssize_t r = recv(fd, h + got, sizeof(h) - got, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        TP_CHECK(r > 0);
        got += (size_t)r;
    }
    TP_CHECK(memcmp(h, TP_STORE_HELLO_MAGIC, 8) == 0);
    return fd;
}

// Sends @n bytes after the hellos and expects the server to close the
// connection (EOF).
static void
send_expect_close(tp_store_server *srv, const uint8_t *b, size_t n)
{
    int fd = raw_connect_hello(srv);
    TP_CHECK(send(fd, b, n, MSG_NOSIGNAL) == (ssize_t)n);
    char c;
    ssize_t r = recv(fd, &c, 1, 0);
    TP_CHECKF(r == 0 || (r < 0 && errno == ECONNRESET),
              "server did not close a malformed connection (r=%zd)", r);
    close(fd);
}

static void
test_tcp_garbage(void)
{
    fixture f;
    fix_init(&f, B_TCP);
    tp_store *s = open_store(f.f_url, 0, 1);
    set_str(s, "k", "v");

    // Garbage (bad magic).
    uint8_t g[64];
    for (size_t i = 0; i < sizeof(g); i++) {
        g[i] = (uint8_t)(i * 37 + 11);
    }
    send_expect_close(f.f_srv, g, sizeof(g));

    uint8_t h[TP_STORE_HDR_LEN + 16] = {0};
    tp__put_u32le(h, TP_STORE_MAGIC);
    // Unknown operation.
    h[4] = 99;
    send_expect_close(f.f_srv, h, TP_STORE_HDR_LEN);
    // A key length over the bound (nothing allocated for it).
    h[4] = TP_STORE_OP_GET;
    tp__put_u32le(h + TP_STORE_HDR_LEN, 0xffffffffu);
    send_expect_close(f.f_srv, h, TP_STORE_HDR_LEN + 4);
    // A value length over the bound.
    h[4] = TP_STORE_OP_SET;
    tp__put_u32le(h + TP_STORE_HDR_LEN, 1);
    h[TP_STORE_HDR_LEN + 4] = 'x';
    tp__put_u64le(h + TP_STORE_HDR_LEN + 5, UINT64_MAX);
    send_expect_close(f.f_srv, h, TP_STORE_HDR_LEN + 13);
    // A wait with zero keys / too many keys.
    h[4] = TP_STORE_OP_WAIT;
    tp__put_u32le(h + TP_STORE_HDR_LEN, 1u << 30);
    send_expect_close(f.f_srv, h, TP_STORE_HDR_LEN + 4);
    // A truncated frame, then the client goes away.
    for (size_t cut = 1; cut < TP_STORE_HDR_LEN + 5; cut += 3) {
        h[4] = TP_STORE_OP_SET;
        tp__put_u32le(h + TP_STORE_HDR_LEN, 4);
        int fd = raw_connect_hello(f.f_srv);
        TP_CHECK(send(fd, h, cut, MSG_NOSIGNAL) == (ssize_t)cut);
        close(fd);
    }
    // A client waiting in get that hangs up.
    {
        h[4] = TP_STORE_OP_GET;
        tp__put_u64le(h + 8, 0);
        tp__put_u32le(h + TP_STORE_HDR_LEN, 2);
        memcpy(h + TP_STORE_HDR_LEN + 4, "zz", 2);
        int fd = raw_connect_hello(f.f_srv);
        TP_CHECK(send(fd, h, TP_STORE_HDR_LEN + 6, MSG_NOSIGNAL) ==
                 TP_STORE_HDR_LEN + 6);
        close(fd);
    }

    // The server still serves the well-behaved client.
    check_get(s, "k", "v");
    set_str(s, "k2", "v2");
    check_get(s, "k2", "v2");
    tp_store_close(s);
    fix_fini(&f); // stops with no stray thread left
}

// ---- init methods ----

static void
child_open_set(void *arg)
{
    child_args *a = arg;
    tp_store *s = open_store(a->url, a->rank, a->world);
    char k[32];
    snprintf(k, sizeof(k), "hello%d", a->rank < 0 ? 1 : a->rank);
    set_str(s, k, "hi");
    check_get(s, "from0", "yes");
    tp_store_close(s);
}

// Rank 0 (this process) hosts; the child connects (retrying until the
// server is up).
static void
two_ranks(const char *url, int child_rank)
{
    child_args a = {.rank = child_rank, .world = 2, .rfd = -1};
    snprintf(a.url, sizeof(a.url), "%s", url);
    pid_t pid = spawn(child_open_set, &a);
    usleep(50 * 1000); // the child connects first: it must retry
    tp_store *s = open_store(url, 0, 2);
    char k[32];
    snprintf(k, sizeof(k), "hello%d", child_rank);
    check_get(s, k, "hi");
    set_str(s, "from0", "yes");
    reap_ok(pid);
    tp_store_close(s);
}

static void
test_init_tcp(void)
{
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tp_test_free_port());
    two_ranks(url, 1);
}

static void
test_init_file(void)
{
    char path[] = "/tmp/tp_store_init_XXXXXX";
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    char url[64];
    snprintf(url, sizeof(url), "file://%s", path);
    two_ranks(url, 1);
    unlink(path);
}

static void
clear_rank_env(void)
{
    const char *v[] = {"RANK",
                       "WORLD_SIZE",
                       "LOCAL_RANK",
                       "SLURM_PROCID",
                       "SLURM_NTASKS",
                       "SLURM_LOCALID",
                       "OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK"};
    for (size_t i = 0; i < TP_ARRAY_LEN(v); i++) {
        unsetenv(v[i]);
    }
}

static void
child_env(void *arg)
{
    child_args *a = arg;
    // The child's rank comes from the variables named in a->url.
    clear_rank_env();
    if (strcmp(a->url, "slurm") == 0) {
        setenv("SLURM_PROCID", "1", 1);
        setenv("SLURM_NTASKS", "2", 1);
        setenv("SLURM_LOCALID", "1", 1);
    } else if (strcmp(a->url, "ompi") == 0) {
        setenv("OMPI_COMM_WORLD_RANK", "1", 1);
        setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    } else {
        setenv("RANK", "1", 1);
        setenv("WORLD_SIZE", "2", 1);
    }
    snprintf(a->url, sizeof(a->url), "env://");
    a->rank = -1;
    a->world = -1;
    child_open_set(a);
}

static void
env_case(const char *kind)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", tp_test_free_port());
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    child_args a = {.rfd = -1};
    snprintf(a.url, sizeof(a.url), "%s", kind);
    pid_t pid = spawn(child_env, &a);
    clear_rank_env();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    tp_store *s = open_store("env://", -1, -1);
    check_get(s, "hello1", "hi");
    set_str(s, "from0", "yes");
    reap_ok(pid);
    tp_store_close(s);
}

static void
test_init_env_rank(void)
{
    env_case("rank");
}
static void
test_init_env_slurm(void)
{
    env_case("slurm");
}
static void
test_init_env_ompi(void)
{
    env_case("ompi");
}

static void
test_env_ranks(void)
{
    int r, w, l;
    tp_error *err = NULL;
    clear_rank_env();
    TP_CHECK_EQ(tp__store_env_ranks(&r, &w, &l, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "SLURM_PROCID");
    tp_error_unref(err);
    err = NULL;
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    TP_CHECK_OK(tp__store_env_ranks(&r, &w, &l, &err), err);
    TP_CHECK(r == 3 && w == 8 && l == 1);
    setenv("SLURM_PROCID", "5", 1); // Slurm wins over OpenMPI
    setenv("SLURM_NTASKS", "6", 1);
    setenv("SLURM_LOCALID", "2", 1);
    TP_CHECK_OK(tp__store_env_ranks(&r, &w, &l, &err), err);
    TP_CHECK(r == 5 && w == 6 && l == 2);
    setenv("RANK", "0", 1); // RANK/WORLD_SIZE win over both
    setenv("WORLD_SIZE", "4", 1);
    TP_CHECK_OK(tp__store_env_ranks(&r, &w, &l, &err), err);
    TP_CHECK(r == 0 && w == 4 && l == -1);
    setenv("RANK", "4", 1); // rank >= world size
    TP_CHECK_EQ(tp__store_env_ranks(&r, &w, &l, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "RANK=4");
    tp_error_unref(err);
    err = NULL;
    clear_rank_env();
    unsetenv("MASTER_ADDR");
    tp_store *s = NULL;
    TP_CHECK_EQ(tp_store_open("env://", 0, 1, 100, &s, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "MASTER_ADDR");
    tp_error_unref(err);
}

static void
test_eaddrinuse(void)
{
    tp_store_server *srv = NULL, *srv2 = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_server_start("tcp://127.0.0.1:0", &srv, &err), err);
    const char *addr = tp_store_server_addr(srv);
    TP_CHECK(tp_store_server_start(addr, &srv2, &err) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), addr);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "EADDRINUSE");
    tp_error_unref(err);
    err = NULL;
    // Rank 0 of tcp:// on the same port.
    tp_store *s = NULL;
    TP_CHECK(tp_store_open(addr, 0, 2, 1000, &s, &err) != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), addr);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "EADDRINUSE");
    tp_error_unref(err);
    tp_store_server_stop(srv);
}

static void
test_bad_init(void)
{
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_store_open("tcp://127.0.0.1:0", 0, 2, 100, &s, &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "port 0");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_store_open("udp://x:1", 0, 2, 100, &s, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "unknown init method");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_store_open("file://rel/path", 0, 2, 100, &s, &err),
                TP_EINVAL);
    tp_error_unref(err);
}

// A rank that is not 0 gives up connecting at its deadline, naming the
// address.
static void
test_connect_timeout(void)
{
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tp_test_free_port());
    tp_store *s = NULL;
    tp_error *err = NULL;
    uint64_t t0 = tp__now_ns();
    TP_CHECK_EQ(tp_store_open(url, 3, 4, 300, &s, &err), TP_ETIMEDOUT);
    TP_CHECK(tp__now_ns() - t0 >= 290u * 1000000u);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), url);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 3");
    tp_error_unref(err);
}

// Closing the server fails a client's later calls with a clear error.
static void
test_server_gone(void)
{
    fixture f;
    fix_init(&f, B_TCP);
    tp_store *s = open_store(f.f_url, 0, 1);
    set_str(s, "k", "v");
    tp_store_server_stop(f.f_srv);
    f.f_srv = NULL;
    tp_error *err = NULL;
    void *v;
    size_t n;
    tp_status st = tp_store_get(s, "k", 2000, &v, &n, &err);
    TP_CHECK(st != TP_OK);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "get \"k\"");
    tp_error_unref(err);
    tp_store_close(s);
    fix_fini(&f);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_ops_mem),
    TP_TEST_CASE(test_ops_file),
    TP_TEST_CASE(test_ops_tcp),
    TP_TEST_CASE(test_max_value),
    TP_TEST_CASE(test_get_waits_mem),
    TP_TEST_CASE(test_get_waits_file),
    TP_TEST_CASE(test_get_waits_tcp),
    TP_TEST_CASE_T(test_add_8proc_file, 60),
    TP_TEST_CASE_T(test_add_8proc_tcp, 60),
    TP_TEST_CASE_T(test_tcp_64_clients, 60),
    TP_TEST_CASE(test_tcp_garbage),
    TP_TEST_CASE(test_init_tcp),
    TP_TEST_CASE(test_init_file),
    TP_TEST_CASE(test_init_env_rank),
    TP_TEST_CASE(test_init_env_slurm),
    TP_TEST_CASE(test_init_env_ompi),
    TP_TEST_CASE(test_env_ranks),
    TP_TEST_CASE(test_eaddrinuse),
    TP_TEST_CASE(test_bad_init),
    TP_TEST_CASE(test_connect_timeout),
    TP_TEST_CASE(test_server_gone),
};

TP_TEST_MAIN(cases)
