// SPDX-License-Identifier: Apache-2.0
// store_server_test.c - the tcp store server on its event loop: many
// parked waiters on one thread, woken by a set or their deadline; its
// bounds: 2000 idle connections next to a working client, the connection
// cap, the idle deadline (and a client reconnecting after it), the
// request deadline against a slow sender, the cap on stored bytes; the
// hello against strangers; the job secret (right, wrong, missing on either
// side; the secret is read once per process, so each side is a forked
// child with its own TP_JOB_TOKEN). Raw clients speak the wire format of
// docs/store.md; loopback only; every read and wait has a timeout.

#include "tp_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/store.h>

#include "core/auth.h"
#include "core/platform.h"
#include "core/wire.h"
#include "store/store_int.h"

#define WAIT_MS 20000

// ---- helpers ----

static int
srv_port(tp_store_server *srv)
{
    const char *addr = tp_store_server_addr(srv); // tcp://127.0.0.1:P
    return atoi(strrchr(addr, ':') + 1);
}

static void send_all(int fd, const void *p, size_t n);
static void recv_all(int fd, void *p, size_t n);

// A raw connection to @srv, with a receive timeout, before any hello.
static int
raw_connect_bare(tp_store_server *srv)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    TP_CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)srv_port(srv))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TP_CHECKF(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "connect: %s",
              strerror(errno));
    struct timeval tv = {.tv_sec = tp_test_ms(WAIT_MS) / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void
make_hello(uint8_t *h, uint32_t flags)
{
    memcpy(h, TP_STORE_HELLO_MAGIC, 8);
    tp__put_u32le(h + 8, TP_STORE_HELLO_VERSION);
    tp__put_u32le(h + 12, flags);
}

// Reads the server's hello; returns its flags.
static uint32_t
recv_hello(int fd)
{
    uint8_t h[TP_STORE_HELLO_LEN];
    recv_all(fd, h, sizeof(h));
    TP_CHECK(memcmp(h, TP_STORE_HELLO_MAGIC, 8) == 0);
    TP_CHECK_EQ(tp__get_u32le(h + 8), TP_STORE_HELLO_VERSION);
    return tp__get_u32le(h + 12);
}

// A raw connection past the hellos.
static int
raw_connect(tp_store_server *srv)
{
    int fd = raw_connect_bare(srv);
    uint8_t h[TP_STORE_HELLO_LEN];
    make_hello(h, 0);
    send_all(fd, h, sizeof(h));
    TP_CHECK_EQ(recv_hello(fd), 0u);
    return fd;
}

static void
send_all(int fd, const void *p, size_t n)
{
    TP_CHECK(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n);
}

static void
recv_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        TP_CHECKF(r > 0, "recv: %zd (%s)", r, r < 0 ? strerror(errno) : "EOF");
        got += (size_t)r;
    }
}

// Sends a get of @key with @timeout_ms (0: none).
static void
send_get(int fd, const char *key, uint64_t timeout_ms)
{
    uint8_t b[TP_STORE_HDR_LEN + 4 + 64] = {0};
    size_t kl = strlen(key);
    tp__put_u32le(b, TP_STORE_MAGIC);
    b[4] = TP_STORE_OP_GET;
    tp__put_u64le(b + 8, timeout_ms);
    tp__put_u32le(b + TP_STORE_HDR_LEN, (uint32_t)kl);
    memcpy(b + TP_STORE_HDR_LEN + 4, key, kl);
    send_all(fd, b, TP_STORE_HDR_LEN + 4 + kl);
}

// Reads a reply header; returns its status.
static int
recv_status(int fd)
{
    uint8_t h[TP_STORE_RHDR_LEN];
    recv_all(fd, h, sizeof(h));
    TP_CHECK_EQ(tp__get_u32le(h), TP_STORE_MAGIC);
    return h[4];
}

// Reads the text of a timeout or error reply into @buf.
static void
recv_text(int fd, char *buf, size_t len)
{
    uint8_t b[4];
    recv_all(fd, b, 4);
    uint32_t n = tp__get_u32le(b);
    TP_CHECK(n < len);
    recv_all(fd, buf, n);
    buf[n] = 0;
}

static int
thread_count(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    TP_CHECK(f != NULL);
    char line[256];
    int n = -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "Threads: %d", &n) == 1) {
            break;
        }
    }
    fclose(f);
    return n;
}

static tp_store_server *
start_server_opts(const tp_store_server_options *o)
{
    tp_store_server *srv = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_server_start_opts("tcp://127.0.0.1:0", o, &srv, &err),
                err);
    return srv;
}

static tp_store_server *
start_server(void)
{
    return start_server_opts(NULL);
}

// Expects EOF (or a reset) on @fd within the receive timeout.
static void
expect_eof(int fd)
{
    char c;
    ssize_t r;
    do {
        r = recv(fd, &c, 1, 0);
    } while (r < 0 && errno == EINTR);
    TP_CHECKF(r == 0 || (r < 0 && errno == ECONNRESET),
              "server did not close the connection (r=%zd)", r);
}

// A num_keys round trip on a raw connection: it has been accepted.
static void
raw_ping(int fd)
{
    uint8_t b[TP_STORE_HDR_LEN] = {0};
    tp__put_u32le(b, TP_STORE_MAGIC);
    b[4] = TP_STORE_OP_NUM_KEYS;
    send_all(fd, b, sizeof(b));
    TP_CHECK_EQ(recv_status(fd), TP_STORE_R_OK);
    recv_all(fd, b, 8);
}

static void
set_str(tp_store *s, const char *key, const char *v)
{
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_set(s, key, v, strlen(v), TP_TIMEOUT_DEFAULT, &err),
                err);
}

static void
check_get(tp_store *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_get(s, key, tp_test_ms(WAIT_MS), &v, &n, &err), err);
    TP_CHECK_EQ(n, strlen(want));
    TP_CHECK(memcmp(v, want, n) == 0);
    free(v);
}

static tp_store *
open_client(tp_store_server *srv)
{
    char url[128];
    snprintf(url, sizeof(url), "%s?server=0", tp_store_server_addr(srv));
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(url, 0, 1, tp_test_ms(WAIT_MS), &s, &err), err);
    return s;
}

// ---- cases ----

// 300 gets park on one loop thread (no thread per client) and one set
// wakes them all; a get with a deadline answers a timeout at it.
static void
test_parked_many(void)
{
    enum { N = 300 };
    tp_store_server *srv = start_server();
    int threads = thread_count();
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(srv);
        send_get(fds[i], "k", 0);
    }
    int tfd = raw_connect(srv);
    uint64_t t0 = tp__now_ns();
    send_get(tfd, "never", 200);
    TP_CHECK_EQ(recv_status(tfd), TP_STORE_R_TIMEOUT);
    uint64_t waited_ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(waited_ms >= 190, "timeout after %llu ms",
              (unsigned long long)waited_ms);
    char msg[256];
    recv_text(tfd, msg, sizeof(msg));
    TP_CHECK_STR_CONTAINS(msg, "key not set");
    close(tfd);
    TP_CHECKF(thread_count() <= threads, "threads %d, were %d", thread_count(),
              threads);

    tp_store *s = open_client(srv);
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_set(s, "k", "hello", 5, TP_TIMEOUT_DEFAULT, &err),
                err);
    for (int i = 0; i < N; i++) {
        TP_CHECK_EQ(recv_status(fds[i]), TP_STORE_R_OK);
        uint8_t b[8 + 5];
        recv_all(fds[i], b, sizeof(b));
        TP_CHECK_EQ(tp__get_u64le(b), 5u);
        TP_CHECK(memcmp(b + 8, "hello", 5) == 0);
        close(fds[i]);
    }
    tp_store_close(s);
    tp_store_server_stop(srv);
}

// 2000 idle connections (fds raised for them, the cap above them) cost
// no thread, and a client next to them is served at once.
static void
test_idle_2000(void)
{
    enum { N = 2000 };
    struct rlimit rl;
    TP_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < 2 * N + 256) {
        rlim_t want = 2 * N + 256;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
            printf("RLIMIT_NOFILE hard limit %llu < %llu: skipped\n",
                   (unsigned long long)rl.rlim_max, (unsigned long long)want);
            exit(77);
        }
        rl.rlim_cur = want;
        TP_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    tp_store_server_options o = {.size = sizeof(o), .max_conns = N + 16};
    tp_store_server *srv = start_server_opts(&o);
    int threads = thread_count();
    static int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(srv);
    }
    raw_ping(fds[N - 1]);
    TP_CHECKF(thread_count() <= threads, "threads %d, were %d", thread_count(),
              threads);
    uint64_t t0 = tp__now_ns();
    tp_store *s = open_client(srv);
    set_str(s, "k", "v");
    check_get(s, "k", "v");
    uint64_t ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(ms < (uint64_t)tp_test_ms(2000), "client served after %llu ms",
              (unsigned long long)ms);
    tp_store_close(s);
    for (int i = 0; i < N; i++) {
        close(fds[i]);
    }
    tp_store_server_stop(srv);
}

// At the cap a new connection is refused (closed at once); one more fits
// when one leaves.
static void
test_max_conns(void)
{
    enum { CAP = 8 };
    tp_store_server_options o = {.size = sizeof(o), .max_conns = CAP};
    tp_store_server *srv = start_server_opts(&o);
    int fds[CAP];
    for (int i = 0; i < CAP; i++) {
        fds[i] = raw_connect(srv);
        raw_ping(fds[i]);
    }
    int extra = raw_connect_bare(srv);
    TP_CHECK(recv_hello(extra) & TP_STORE_HELLO_FULL);
    expect_eof(extra);
    close(extra);
    // A tpipe client is told why.
    char url[128];
    snprintf(url, sizeof(url), "%s?server=0", tp_store_server_addr(srv));
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_store_open(url, 0, 1, tp_test_ms(WAIT_MS), &s, &err),
                TP_ECONNREFUSED);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_STORE_MAX_CONNS");
    tp_error_unref(err);
    close(fds[0]);
    usleep(50 * 1000); // the server notices the close
    fds[0] = raw_connect(srv);
    raw_ping(fds[0]);
    for (int i = 0; i < CAP; i++) {
        close(fds[i]);
    }
    tp_store_server_stop(srv);
}

// An idle connection is closed at the idle deadline with an idle notice;
// a parked one is not; a tpipe client idle that long reconnects on its
// next call.
static void
test_idle_timeout(void)
{
    tp_store_server_options o = {.size = sizeof(o), .idle_timeout_ms = 200};
    tp_store_server *srv = start_server_opts(&o);
    tp_store *s = open_client(srv);
    set_str(s, "a", "1");
    int idle = raw_connect(srv);
    int parked = raw_connect(srv);
    send_get(parked, "late", 0);
    uint64_t t0 = tp__now_ns();
    TP_CHECK_EQ(recv_status(idle), TP_STORE_R_IDLE);
    expect_eof(idle);
    uint64_t ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(ms >= 150, "closed after %llu ms", (unsigned long long)ms);
    close(idle);
    usleep(300 * 1000);      // past the deadline: s was closed as idle too
    set_str(s, "late", "x"); // reconnects; wakes the parked get
    TP_CHECK_EQ(recv_status(parked), TP_STORE_R_OK);
    uint8_t b[9];
    recv_all(parked, b, 9);
    TP_CHECK(b[8] == 'x');
    close(parked);
    check_get(s, "a", "1");
    tp_store_close(s);
    tp_store_server_stop(srv);
}

// A request that does not arrive whole within the request deadline is cut
// with an error reply naming the bound.
static void
test_slow_loris(void)
{
    tp_store_server_options o = {.size = sizeof(o), .request_timeout_ms = 200};
    tp_store_server *srv = start_server_opts(&o);
    int fd = raw_connect(srv);
    uint8_t h[TP_STORE_HDR_LEN] = {0};
    tp__put_u32le(h, TP_STORE_MAGIC);
    h[4] = TP_STORE_OP_SET;
    uint64_t t0 = tp__now_ns();
    for (int i = 0; i < 3; i++) { // a byte every 50 ms, then nothing
        send_all(fd, h + i, 1);
        usleep(50 * 1000);
    }
    TP_CHECK_EQ(recv_status(fd), TP_STORE_R_ERROR);
    uint8_t b[4];
    recv_all(fd, b, 4);
    TP_CHECK_EQ((int32_t)tp__get_u32le(b), TP_ETIMEDOUT);
    char msg[512];
    recv_text(fd, msg, sizeof(msg));
    TP_CHECK_STR_CONTAINS(msg, "TP_STORE_REQUEST_TIMEOUT_MS");
    expect_eof(fd);
    uint64_t ms = (tp__now_ns() - t0) / 1000000u;
    TP_CHECKF(ms >= 190 && ms < (uint64_t)tp_test_ms(5000), "cut after %llu ms",
              (unsigned long long)ms);
    close(fd);
    tp_store_server_stop(srv);
}

// The cap on stored bytes refuses a set that would pass it, naming it;
// replacing a value by a smaller one still works.
static void
test_max_bytes(void)
{
    tp_store_server_options o = {.size = sizeof(o), .max_bytes = 1000};
    tp_store_server *srv = start_server_opts(&o);
    tp_store *s = open_client(srv);
    char big[601];
    memset(big, 'x', 600);
    big[600] = 0;
    set_str(s, "a", big);
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_store_set(s, "b", big, 600, TP_TIMEOUT_DEFAULT, &err),
                TP_ENOMEM);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_STORE_MAX_BYTES");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "\"b\"");
    tp_error_unref(err);
    set_str(s, "a", "small");
    set_str(s, "b", big);
    check_get(s, "a", "small");
    tp_store_close(s);
    tp_store_server_stop(srv);
}

// Malformed bounds in the environment are refused, naming the variable.
static void
test_bad_env(void)
{
    setenv("TP_STORE_MAX_CONNS", "lots", 1);
    tp_store_server *srv = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_store_server_start("tcp://127.0.0.1:0", &srv, &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_STORE_MAX_CONNS=lots");
    tp_error_unref(err);
    unsetenv("TP_STORE_MAX_CONNS");
    setenv("TP_STORE_MAX_BYTES", "2M", 1);
    TP_CHECK_OK(tp_store_server_start("tcp://127.0.0.1:0", &srv, &err), err);
    tp_store_server_stop(srv);
}

// A client that is not a tpipe store client is dropped at its first
// wrong byte (after the server's hello); the server keeps serving.
static void
test_hello_stranger(void)
{
    tp_store_server *srv = start_server();
    int fd = raw_connect_bare(srv);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, http, strlen(http));
    TP_CHECK_EQ(recv_hello(fd), 0u);
    expect_eof(fd);
    close(fd);
    // A wrong version.
    fd = raw_connect_bare(srv);
    uint8_t h[TP_STORE_HELLO_LEN];
    make_hello(h, 0);
    tp__put_u32le(h + 8, 99);
    send_all(fd, h, sizeof(h));
    recv_hello(fd);
    expect_eof(fd);
    close(fd);
    tp_store *s = open_client(srv);
    set_str(s, "k", "v");
    check_get(s, "k", "v");
    tp_store_close(s);
    tp_store_server_stop(srv);
}

// A client that reaches a program that is not a tpipe store fails at
// once, saying so.
static void
test_hello_not_a_store(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TP_CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
    TP_CHECK(listen(lfd, 4) == 0);
    socklen_t al = sizeof(a);
    getsockname(lfd, (struct sockaddr *)&a, &al);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) { // an HTTP server, more or less
        int c = accept(lfd, NULL, NULL);
        const char *resp = "HTTP/1.1 400 Bad Request\r\n\r\n";
        TP_UNUSED(send(c, resp, strlen(resp), MSG_NOSIGNAL));
        sleep(30);
        _exit(0);
    }
    close(lfd);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%u?server=0",
             (unsigned)ntohs(a.sin_port));
    tp_store *s = NULL;
    tp_error *err = NULL;
    uint64_t t0 = tp__now_ns();
    TP_CHECK_EQ(tp_store_open(url, 1, 2, tp_test_ms(WAIT_MS), &s, &err),
                TP_EPROTO);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "not a tpipe store");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "sent 48"); // "H"
    tp_error_unref(err);
    TP_CHECK((tp__now_ns() - t0) / 1000000u < 5000u);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

// ---- the job secret ----

#define TOKEN_A "job-secret-aaaaaaaaaaaaaaaaaaaaaaaaa"
#define TOKEN_B "job-secret-bbbbbbbbbbbbbbbbbbbbbbbbb"

static void
set_token(const char *tok)
{
    unsetenv("TP_JOB_TOKEN_FILE");
    if (tok != NULL) {
        setenv("TP_JOB_TOKEN", tok, 1);
    } else {
        unsetenv("TP_JOB_TOKEN");
    }
}

// Forks a store server holding @tok (NULL: none); returns its pid and its
// port in *@port_p. The child serves until killed.
static pid_t
auth_server(const char *tok, int *port_p)
{
    int p[2];
    TP_CHECK(pipe(p) == 0);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        set_token(tok);
        tp_store_server *srv = start_server();
        int port = srv_port(srv);
        TP_UNUSED(write(p[1], &port, sizeof(port)));
        for (int i = 0; i < 600; i++) {
            usleep(100 * 1000);
        }
        _exit(0);
    }
    close(p[1]);
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    TP_CHECK(poll(&pf, 1, (int)tp_test_ms(WAIT_MS)) == 1);
    TP_CHECK(read(p[0], port_p, sizeof(*port_p)) == sizeof(*port_p));
    close(p[0]);
    return pid;
}

// Waits for @pid until the deadline (kills it then); returns its exit code.
static int
reap(pid_t pid)
{
    uint64_t dl = tp__now_ns() + (uint64_t)tp_test_ms(WAIT_MS) * 1000000u;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (tp__now_ns() > dl) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(5 * 1000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define WRONG_SECRET_MSG    "does not hold this job's secret"
#define WRONG_SECRET_CLOSED "it does not accept this job secret"

// In a forked child holding @tok: opens the store on @port and expects
// set/get to work (@want NULL) or the open to fail with TP_EPERM and a
// message holding @want. Returns the child's exit code (0: as expected).
static int
auth_client(const char *tok, int port, const char *want)
{
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        set_token(tok);
        char url[64];
        snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?server=0", port);
        tp_store *s = NULL;
        tp_error *err = NULL;
        tp_status st = tp_store_open(url, 1, 2, tp_test_ms(WAIT_MS), &s, &err);
        if (want == NULL) {
            TP_CHECK_OK(st, err);
            set_str(s, "k", "v");
            check_get(s, "k", "v");
            tp_store_close(s);
        } else {
            TP_CHECK_EQ(st, TP_EPERM);
            // A wrong secret: the client finds the server's proof wrong,
            // or (when the server checked the client's proof first and
            // closed before sending its own) sees the close during the
            // exchange. Both name the secret; which one is a race.
            const char *msg = tp_error_message(err);
            TP_CHECKF(strstr(msg, want) != NULL ||
                          (strcmp(want, WRONG_SECRET_MSG) == 0 &&
                           strstr(msg, WRONG_SECRET_CLOSED) != NULL),
                      "\"%s\" contains neither \"%s\" nor, for a wrong "
                      "secret, \"%s\"",
                      msg, want, WRONG_SECRET_CLOSED);
            tp_error_unref(err);
        }
        _exit(0);
    }
    return reap(pid);
}

static void
auth_case(const char *srv_tok, const char *cli_tok, const char *want)
{
#if !TP_HAVE_CRYPTO
    TP_UNUSED(srv_tok);
    TP_UNUSED(cli_tok);
    TP_UNUSED(want);
    printf("built without libcrypto: skipped\n");
    exit(77);
#else
    int port = 0;
    pid_t srv = auth_server(srv_tok, &port);
    int rc = auth_client(cli_tok, port, want);
    kill(srv, SIGKILL);
    reap(srv);
    TP_CHECKF(rc == 0, "client child exited %d", rc);
#endif
}

static void
test_auth_ok(void)
{
    auth_case(TOKEN_A, TOKEN_A, NULL);
}

static void
test_auth_wrong_secret(void)
{
    auth_case(TOKEN_A, TOKEN_B, WRONG_SECRET_MSG);
}

static void
test_auth_client_lacks_secret(void)
{
    auth_case(TOKEN_A, NULL, "requires the job secret (TP_JOB_TOKEN");
}

static void
test_auth_server_lacks_secret(void)
{
    auth_case(NULL, TOKEN_A, "has no job secret; refusing to trust it");
}

// A raw client without the secret that sends a request right after its
// hello gets the server's hello (flagged) and then EOF: no request is
// served before the exchange.
static void
test_auth_no_request_before(void)
{
#if !TP_HAVE_CRYPTO
    printf("built without libcrypto: skipped\n");
    exit(77);
#else
    int port = 0;
    pid_t srv = auth_server(TOKEN_A, &port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TP_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    struct timeval tv = {.tv_sec = tp_test_ms(WAIT_MS) / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    uint8_t b[TP_STORE_HELLO_LEN + TP_STORE_HDR_LEN] = {0};
    make_hello(b, 0);
    tp__put_u32le(b + TP_STORE_HELLO_LEN, TP_STORE_MAGIC);
    b[TP_STORE_HELLO_LEN + 4] = TP_STORE_OP_NUM_KEYS;
    send_all(fd, b, sizeof(b));
    TP_CHECK(recv_hello(fd) & TP_AUTH_HELLO_FLAG);
    expect_eof(fd);
    close(fd);
    kill(srv, SIGKILL);
    reap(srv);
#endif
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_parked_many),
    TP_TEST_CASE_T(test_idle_2000, 120),
    TP_TEST_CASE(test_max_conns),
    TP_TEST_CASE(test_idle_timeout),
    TP_TEST_CASE(test_slow_loris),
    TP_TEST_CASE(test_max_bytes),
    TP_TEST_CASE(test_bad_env),
    TP_TEST_CASE(test_hello_stranger),
    TP_TEST_CASE(test_hello_not_a_store),
    TP_TEST_CASE(test_auth_ok),
    TP_TEST_CASE(test_auth_wrong_secret),
    TP_TEST_CASE(test_auth_client_lacks_secret),
    TP_TEST_CASE(test_auth_server_lacks_secret),
    TP_TEST_CASE(test_auth_no_request_before),
};

TP_TEST_MAIN(cases)
