// SPDX-License-Identifier: Apache-2.0
// tcp_io.c - blocking socket reads and writes with a deadline (poll).

#include "tcp_io.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/platform.h"

int
tp__io_poll_ms(uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX) {
        return -1;
    }
    uint64_t now = tp__now_ns();
    if (now >= deadline_ns) {
        return 0;
    }
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > 1000000000u ? 1000000000 : (int)ms;
}

void
tp__io_sleep_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// Waits for @events on @fd until @deadline_ns: TP_OK, TP_ETIMEDOUT or an
// errno status.
static tp_status
io_wait(int fd, short events, uint64_t deadline_ns, char *why, size_t len)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, tp__io_poll_ms(deadline_ns));
        if (r > 0) {
            return TP_OK;
        }
        if (r == 0) {
            snprintf(why, len, "deadline passed");
            return TP_ETIMEDOUT;
        }
        if (errno != EINTR) {
            snprintf(why, len, "poll: %s", strerror(errno));
            return tp__status_from_errno(errno);
        }
    }
}

tp_status
tp__io_write_all(int fd, const void *p, size_t n, uint64_t deadline_ns,
                 char *why, size_t why_len)
{
    const char *b = p;
    while (n > 0) {
        tp_status st = io_wait(fd, POLLOUT, deadline_ns, why, why_len);
        if (st != TP_OK) {
            return st;
        }
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                continue;
            }
            snprintf(why, why_len, "%s (%s)", strerror(errno),
                     tp__errno_name(errno));
            return tp__status_from_errno(errno);
        }
        b += w;
        n -= (size_t)w;
    }
    return TP_OK;
}

tp_status
tp__io_read_all(int fd, void *p, size_t n, uint64_t deadline_ns, char *why,
                size_t why_len)
{
    char *b = p;
    size_t got = 0;
    while (got < n) {
        tp_status st = io_wait(fd, POLLIN, deadline_ns, why, why_len);
        if (st != TP_OK) {
            return st;
        }
        ssize_t r = recv(fd, b + got, n - got, MSG_DONTWAIT);
        if (r == 0) {
            snprintf(why, why_len, "connection closed by the peer");
            return got == 0 ? TP_ECLOSED : TP_ECONNRESET;
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                continue;
            }
            snprintf(why, why_len, "%s (%s)", strerror(errno),
                     tp__errno_name(errno));
            return tp__status_from_errno(errno);
        }
        got += (size_t)r;
    }
    return TP_OK;
}
