// SPDX-License-Identifier: Apache-2.0
// auth_test.c - the job secret (core/auth.h) on the tcp and shm
// transports: matching secrets connect and carry bytes; a wrong secret,
// a missing one on either side, a misconfigured one and a reflected proof
// are refused, and the listener hands no such connection to an accept.
//
// Each pair runs the listener in a forked child (its own environment,
// read again with tp__auth_reload) and the connector in the case process.

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/auth.h"
#include "core/config.h"
#include "core/loop.h"
#include "core/wire.h"
#include <tpipe/log.h>
#include "tp_test.h"
#include "tp_test_op.h"
#include "transport/transport.h"

#define SECRET_A "0123456789abcdef-job-a"
#define SECRET_B "0123456789abcdef-job-b"

typedef struct env {
    tp_config cfg;
    tp_loop *loop;
    tp_transport *t;
} env;

static void
env_init(env *e, const char *transport)
{
    tp_error *err = NULL;
    memset(e, 0, sizeof(*e));
    tp__config_defaults(&e->cfg);
    e->cfg.io_backend = TP_IO_BACKEND_EPOLL;
    e->cfg.handshake_timeout_ms = 3000;
    TP_CHECK_OK(tp__loop_create(&e->cfg, "authtest", &e->loop, &err), err);
    TP_CHECK_OK(tp__transport_create(transport, e->loop, &e->cfg, &e->t, &err),
                err);
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

static void
env_fini(env *e)
{
    tp__transport_destroy(e->t);
    tp__loop_destroy(e->loop);
}

// Sets or clears TP_JOB_TOKEN (and clears TP_JOB_TOKEN_FILE), then makes
// this process read it again.
static void
set_secret(const char *secret)
{
    unsetenv("TP_JOB_TOKEN_FILE");
    if (secret != NULL) {
        setenv("TP_JOB_TOKEN", secret, 1);
    } else {
        unsetenv("TP_JOB_TOKEN");
    }
    tp__auth_reload();
}

static void
write_full(int fd, const void *p, size_t n)
{
    TP_CHECK((size_t)write(fd, p, n) == n);
}

// Reads exactly @n bytes from a pipe within @ms; false on EOF or timeout.
static bool
read_full(int fd, void *p, size_t n, int64_t ms)
{
    size_t got = 0;
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    while (got < n) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int64_t left = (int64_t)(deadline - tp__now_ns()) / 1000000;
        if (tp__now_ns() >= deadline || poll(&pfd, 1, (int)left) <= 0) {
            return false;
        }
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) {
            return false;
        }
        got += (size_t)r;
    }
    return true;
}

// The listener child: listens at @addr, sends the bound address on @out,
// accepts one connection within @accept_ms and echoes 8 bytes on it.
// Exit code: 0 echoed, 1 no connection handed out, 2 other failure.
static void
listener_child(const char *transport, const char *addr, const char *secret,
               int out, int64_t accept_ms)
{
    set_secret(secret);
    env e;
    env_init(&e, transport);
    tp_error *err = NULL;
    tp_listener *l = NULL;
    if (tp__transport_listen(e.t, addr, &l, &err) != TP_OK) {
        fprintf(stderr, "listen: %s\n", tp_error_message(err));
        _exit(2);
    }
    char a[256] = {0};
    snprintf(a, sizeof(a), "%s", tp__listener_addr(l));
    write_full(out, a, sizeof(a));
    op acc;
    op_init(&acc, accept_ms);
    tp__listener_accept(l, acc.aio);
    op_wait(&acc, accept_ms + 5000);
    if (tp_aio_status(acc.aio) != TP_OK) {
        _exit(1);
    }
    tp_conn *s = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    uint8_t b[8];
    op r, w;
    op_init(&r, 5000);
    tp_iov ri = {b, sizeof(b)};
    op_io(&r, s, false, 1, &ri);
    op_wait(&r, 10000);
    if (tp_aio_status(r.aio) != TP_OK) {
        _exit(2);
    }
    op_init(&w, 5000);
    tp_iov wi = {b, sizeof(b)};
    op_io(&w, s, true, 1, &wi);
    op_wait(&w, 10000);
    _exit(tp_aio_status(w.aio) == TP_OK ? 0 : 2);
}

static pid_t
start_listener(const char *transport, const char *secret, int64_t accept_ms,
               char *addr, size_t addr_len)
{
    char want[128];
    if (strcmp(transport, "tcp") == 0) {
        snprintf(want, sizeof(want), "tcp://127.0.0.1:0");
    } else {
        static int seq;
        snprintf(want, sizeof(want), "shm://tp-auth-test-%d-%d", (int)getpid(),
                 seq++);
    }
    int p[2];
    TP_CHECK(pipe(p) == 0);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        listener_child(transport, want, secret, p[1], accept_ms);
    }
    close(p[1]);
    char a[256];
    TP_CHECKF(read_full(p[0], a, sizeof(a), 10000),
              "the listener child did not report its address");
    close(p[0]);
    snprintf(addr, addr_len, "%s", a);
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
            TP_CHECKF(false, "listener child did not exit within %lld ms",
                      (long long)ms);
        }
        usleep(5000);
    }
}

// Connects with @secret to a listener holding @lsecret. Returns the
// connect status; @msg gets the error. On success, checks an echo.
static tp_status
try_pair(const char *transport, const char *lsecret, const char *secret,
         char *msg, size_t msg_len, int *child_rc)
{
    bool expect_ok =
        lsecret != NULL && secret != NULL && strcmp(lsecret, secret) == 0;
    if (lsecret == NULL && secret == NULL) {
        expect_ok = true;
    }
    char addr[256];
    pid_t child = start_listener(transport, lsecret, expect_ok ? 10000 : 1500,
                                 addr, sizeof(addr));
    set_secret(secret);
    env e;
    env_init(&e, transport);
    op o;
    op_init(&o, 5000);
    tp__transport_connect(e.t, addr, o.aio);
    op_wait(&o, 10000);
    tp_status st = tp_aio_status(o.aio);
    snprintf(msg, msg_len, "%s", tp_error_message(tp_aio_error(o.aio)));
    tp_conn *c = tp_aio_get_output(o.aio, 0);
    op_fini(&o);
    if (st == TP_OK) {
        uint8_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {0};
        op w, r;
        op_init(&w, 5000);
        op_init(&r, 5000);
        tp_iov wi = {a, 8}, ri = {b, 8};
        op_io(&r, c, false, 1, &ri);
        op_io(&w, c, true, 1, &wi);
        op_wait(&w, 10000);
        op_wait(&r, 10000);
        TP_CHECK_OK(tp_aio_status(r.aio), tp_aio_error(r.aio));
        TP_CHECK(memcmp(a, b, 8) == 0);
        op_fini(&w);
        op_fini(&r);
        tp__conn_close(c);
        tp__conn_unref(c);
    }
    *child_rc = wait_child(child, 20000);
    env_fini(&e);
    return st;
}

static void
pair_ok(const char *transport, const char *lsecret, const char *secret)
{
    char msg[1024];
    int rc;
    tp_status st = try_pair(transport, lsecret, secret, msg, sizeof(msg), &rc);
    TP_CHECKF(st == TP_OK, "%s: connect failed: %s", transport, msg);
    TP_CHECK_EQ(rc, 0);
}

static void
pair_refused(const char *transport, const char *lsecret, const char *secret,
             const char *needle)
{
    char msg[1024];
    int rc;
    tp_status st = try_pair(transport, lsecret, secret, msg, sizeof(msg), &rc);
    TP_CHECKF(st != TP_OK, "%s: connected although it must be refused",
              transport);
    if (needle != NULL) {
        TP_CHECK_STR_CONTAINS(msg, needle);
    }
    // The listener never handed the connection to its accept.
    TP_CHECK_EQ(rc, 1);
}

static void
tcp_same_secret(void)
{
    pair_ok("tcp", SECRET_A, SECRET_A);
    pair_ok("tcp", NULL, NULL);
}

static void
shm_same_secret(void)
{
    pair_ok("shm", SECRET_A, SECRET_A);
    pair_ok("shm", NULL, NULL);
}

static void
tcp_wrong_secret(void)
{
    // Either side may see the failure first: our check of its MAC, or its
    // close after its check of ours.
    pair_refused("tcp", SECRET_A, SECRET_B, "secret");
}

static void
shm_wrong_secret(void)
{
    pair_refused("shm", SECRET_A, SECRET_B, "secret");
}

static void
tcp_missing_secret(void)
{
    pair_refused("tcp", SECRET_A, NULL, "requires the job secret");
    pair_refused("tcp", NULL, SECRET_A, "presents no job secret");
}

static void
shm_missing_secret(void)
{
    // The listener without a secret drops a connector that has one
    // before its hello reply; a listener with one rejects a connector
    // without one and sends it nothing.
    pair_refused("shm", NULL, SECRET_A, NULL);
    pair_refused("shm", SECRET_A, NULL, NULL);
}

static void
misconfigured_secret(void)
{
    set_secret("short");
    env e;
    env_init(&e, "tcp");
    op o;
    op_init(&o, 5000);
    tp__transport_connect(e.t, "tcp://127.0.0.1:9", o.aio);
    op_wait(&o, 10000);
    TP_CHECK(tp_aio_status(o.aio) == TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(tp_aio_error(o.aio)),
                          "TP_JOB_TOKEN: the job secret is shorter than 16");
    op_fini(&o);
    env_fini(&e);

    // A secret file must be readable by its owner only.
    char path[] = "/tmp/tp-auth-test-XXXXXX";
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    write_full(fd, SECRET_A "\n", strlen(SECRET_A) + 1);
    close(fd);
    TP_CHECK(chmod(path, 0644) == 0);
    unsetenv("TP_JOB_TOKEN");
    setenv("TP_JOB_TOKEN_FILE", path, 1);
    tp__auth_reload();
    bool on = true;
    tp_error *err = NULL;
    TP_CHECK(tp__auth_enabled(&on, &err) == TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "chmod 600");
    tp_error_unref(err);
    err = NULL;
    // Both set: refused rather than guessing which one is meant.
    setenv("TP_JOB_TOKEN", SECRET_A, 1);
    tp__auth_reload();
    TP_CHECK(tp__auth_enabled(&on, &err) == TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "set one of them");
    tp_error_unref(err);
    err = NULL;
    // Mode 600, trailing newline stripped: the same secret as the string.
    TP_CHECK(chmod(path, 0600) == 0);
    unsetenv("TP_JOB_TOKEN");
    tp__auth_reload();
    TP_CHECK_OK(tp__auth_enabled(&on, &err), err);
    TP_CHECK(on);
    unlink(path);
}

// A raw socket to an authenticated tcp listener.
static int
raw_connect(const char *addr)
{
    int port = 0;
    TP_CHECK(sscanf(addr, "tcp://127.0.0.1:%d", &port) == 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TP_CHECK(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    TP_CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    return fd;
}

// Reads until EOF within @ms; returns the bytes read, or -1 on timeout.
static ssize_t
read_to_eof(int fd, int64_t ms)
{
    ssize_t total = 0;
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (tp__now_ns() >= deadline) {
            return -1;
        }
        int left = (int)((deadline - tp__now_ns()) / 1000000u) + 1;
        if (poll(&pfd, 1, left) <= 0) {
            continue;
        }
        char b[256];
        ssize_t r = read(fd, b, sizeof(b));
        if (r <= 0) {
            return total;
        }
        total += r;
    }
}

static void
stray_connection_learns_nothing(void)
{
    char addr[256];
    pid_t child = start_listener("tcp", SECRET_A, 1500, addr, sizeof(addr));
    int fd = raw_connect(addr);
    // Garbage instead of a hello: closed, after nothing but the listener's
    // own 16-byte hello and its 32-byte nonce (random, public).
    write_full(fd, "GET / HTTP/1.0\r\n\r\n", 18);
    TP_CHECK_EQ(read_to_eof(fd, 5000),
                (ssize_t)(TP_HELLO_LEN + TP_AUTH_NONCE_LEN));
    close(fd);
    TP_CHECK_EQ(wait_child(child, 20000), 1);
}

static void
reflected_proof_refused(void)
{
    char addr[256];
    pid_t child = start_listener("tcp", SECRET_A, 1500, addr, sizeof(addr));
    int fd = raw_connect(addr);
    uint8_t hello[TP_HELLO_LEN], nonce[TP_AUTH_NONCE_LEN], mac[TP_AUTH_MAC_LEN];
    TP_CHECK(read_full(fd, hello, sizeof(hello), 5000));
    TP_CHECK_EQ(tp__get_u32le(hello + 12) & TP_AUTH_HELLO_FLAG,
                TP_AUTH_HELLO_FLAG);
    write_full(fd, hello, sizeof(hello)); // claim a secret too
    TP_CHECK(read_full(fd, nonce, sizeof(nonce), 5000));
    write_full(fd, nonce, sizeof(nonce)); // its own nonce back
    TP_CHECK(read_full(fd, mac, sizeof(mac), 5000));
    write_full(fd, mac, sizeof(mac)); // and its own proof back
    TP_CHECK_EQ(read_to_eof(fd, 5000), 0);
    close(fd);
    TP_CHECK_EQ(wait_child(child, 20000), 1);
}

static atomic_int g_open_warnings;

static void
count_open_warnings(tp_log_level level, const char *id, const char *msg,
                    void *arg)
{
    (void)arg;
    if (level == TP_LOG_LEVEL_WARN && strcmp(id, "TP-AUTH-OPEN") == 0 &&
        strstr(msg, "without a job secret") != NULL) {
        atomic_fetch_add(&g_open_warnings, 1);
    }
}

static void
listen_and_close(const char *addr)
{
    env e;
    env_init(&e, "tcp");
    tp_error *err = NULL;
    tp_listener *l = NULL;
    TP_CHECK_OK(tp__transport_listen(e.t, addr, &l, &err), err);
    tp__listener_destroy(l);
    env_fini(&e);
}

static void
open_listener_warns_once(void)
{
    tp_log_set_handler(count_open_warnings, NULL);
    tp_log_set_level(TP_LOG_LEVEL_WARN);
    // Loopback without a secret, and any address with one: no warning.
    set_secret(NULL);
    listen_and_close("tcp://127.0.0.1:0");
    listen_and_close("tcp://[::1]:0");
    set_secret(SECRET_A);
    listen_and_close("tcp://0.0.0.0:0");
    TP_CHECK_EQ(atomic_load(&g_open_warnings), 0);
    // TP_AUTH_WARN=0 (tpipe info) silences it.
    set_secret(NULL);
    setenv("TP_AUTH_WARN", "0", 1);
    listen_and_close("tcp://0.0.0.0:0");
    unsetenv("TP_AUTH_WARN");
    TP_CHECK_EQ(atomic_load(&g_open_warnings), 0);
    // The wildcard address without one: once per process.
    set_secret(NULL);
    listen_and_close("tcp://0.0.0.0:0");
    listen_and_close("tcp://0.0.0.0:0");
    TP_CHECK_EQ(atomic_load(&g_open_warnings), 1);
    tp_log_set_handler(NULL, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(open_listener_warns_once),
    TP_TEST_CASE(tcp_same_secret),
    TP_TEST_CASE(shm_same_secret),
    TP_TEST_CASE(tcp_wrong_secret),
    TP_TEST_CASE(shm_wrong_secret),
    TP_TEST_CASE(tcp_missing_secret),
    TP_TEST_CASE(shm_missing_secret),
    TP_TEST_CASE(misconfigured_secret),
    TP_TEST_CASE(stray_connection_learns_nothing),
    TP_TEST_CASE(reflected_proof_refused),
};

TP_TEST_MAIN(cases)
