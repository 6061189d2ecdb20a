// SPDX-License-Identifier: Apache-2.0
// store_server_test.c - the tcp store server on its event loop: many
// parked waiters on one thread, woken by a set or their deadline. Raw
// clients speak the wire format of docs/store.md; loopback only; every
// read has a timeout.

#include "tp_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tpipe/store.h>

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

// A raw connection to @srv, with a receive timeout.
static int
raw_connect(tp_store_server *srv)
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
start_server(void)
{
    tp_store_server *srv = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_server_start("tcp://127.0.0.1:0", &srv, &err), err);
    return srv;
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

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_parked_many),
};

TP_TEST_MAIN(cases)
