// SPDX-License-Identifier: Apache-2.0
// tp_test_pipe.c - pipes to test: contexts, in-process pairs, descriptor
// reads and forked peers (tp_test_pipe.h).

#include "tp_test_pipe.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/platform.h"
#include "tp_test.h"
#include "tp_test_op.h"

tp_context *
tp_test_ctx(const char *name, const char *transports, const char *channels)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.name = name;
    o.transports = transports;
    o.channels = channels;
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    tp_status st = tp_context_create(&o, &ctx, &err);
    TP_CHECKF(st == TP_OK, "context %s (transports %s, channels %s): %s: %s",
              name ? name : "(unnamed)", transports ? transports : "all",
              channels ? channels : "all", tp_status_name(st),
              tp_error_message(err));
    return ctx;
}

void
tp_test_pair_open(tp_test_pair *pr, tp_context *a, tp_context *b,
                  const char *url, int64_t ms)
{
    memset(pr, 0, sizeof(*pr));
    pr->a = a;
    pr->b = b;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_context_listen(a, url ? &url : NULL, url ? 1 : 0, &pr->l, &err),
        err);
    TP_CHECK_OK(tp_context_connect(b, tp_pipe_listener_addr(pr->l, NULL),
                                   &pr->pb, &err),
                err);
    pr->pa = op_pipe_accept(pr->l, ms);
    TP_CHECK_OK(tp_pipe_wait_ready(pr->pb, tp_test_ms(ms), &err), err);
}

void
tp_test_pair_close(tp_test_pair *pr)
{
    tp_pipe_unref(pr->pa);
    tp_pipe_unref(pr->pb);
    tp_pipe_listener_destroy(pr->l);
    tp_context_destroy(pr->b);
    tp_context_destroy(pr->a);
    memset(pr, 0, sizeof(*pr));
}

tp_message *
tp_test_read_desc(tp_pipe *p, int64_t ms)
{
    op d;
    op_init(&d, ms);
    tp_pipe_read_descriptor(p, d.aio);
    op_wait(&d, ms);
    TP_CHECK_OK(tp_aio_status(d.aio), tp_aio_error(d.aio));
    tp_message *m = tp_aio_get_output(d.aio, 0);
    op_fini(&d);
    return m;
}

// ---- a forked peer process --------------------------------------------------

// The poll(2) timeout until @deadline (a tp__now_ns value; UINT64_MAX:
// none).
static int
peer_poll_ms(uint64_t deadline)
{
    if (deadline == UINT64_MAX) {
        return -1;
    }
    int64_t left = tp__ms_left(deadline);
    return left > INT_MAX ? INT_MAX : (int)left;
}

void
tp_test_peer_fork(tp_test_peer *pe, const char *name, tp_test_peer_dir dir,
                  tp_test_peer_fn fn, void *arg)
{
    int fds[2]; // [0] read end, [1] write end
    TP_CHECKF(pipe2(fds, O_CLOEXEC) == 0, "peer %s: pipe: %s", name,
              strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    TP_CHECKF(pid >= 0, "peer %s: fork: %s", name, strerror(errno));
    // The parent keeps the end it uses, the child the other.
    int mine = dir == TP_TEST_PEER_DOWN ? 1 : 0;
    if (pid == 0) {
        close(fds[mine]);
        tp_test_peer self = {name, 0, fds[1 - mine]};
        fn(&self, arg);
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
    close(fds[1 - mine]);
    pe->name = name;
    pe->pid = pid;
    pe->fd = fds[mine];
}

void
tp_test_peer_send(tp_test_peer *pe, const char *line)
{
    TP_CHECKF(pe->fd >= 0, "peer %s: its pipe was used already", pe->name);
    size_t n = strlen(line);
    TP_CHECKF(memchr(line, '\n', n) == NULL, "peer %s: \"%s\" is not one line",
              pe->name, line);
    char *buf = malloc(n + 1);
    TP_CHECK(buf != NULL);
    memcpy(buf, line, n);
    buf[n] = '\n';
    size_t off = 0;
    while (off < n + 1) {
        ssize_t w = write(pe->fd, buf + off, n + 1 - off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        TP_CHECKF(w > 0, "peer %s: writing \"%s\" to its pipe: %s", pe->name,
                  line, w < 0 ? strerror(errno) : "nothing written");
        off += (size_t)w;
    }
    free(buf);
    close(pe->fd);
    pe->fd = -1;
}

bool
tp_test_peer_recv(tp_test_peer *pe, char *buf, size_t len, int64_t ms)
{
    TP_CHECK(len > 0);
    buf[0] = '\0';
    if (pe->fd < 0) {
        return false;
    }
    uint64_t deadline = tp__deadline_after_ms(tp_test_ms(ms));
    size_t got = 0;
    bool ok = false;
    // A byte at a time: what follows the line is not ours to consume.
    for (;;) {
        struct pollfd pfd = {.fd = pe->fd, .events = POLLIN};
        int r = poll(&pfd, 1, peer_poll_ms(deadline));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 || (r == 0 && tp__now_ns() >= deadline)) {
            break; // an error, or the deadline
        }
        if (r == 0) {
            continue; // woken before the deadline (rounding)
        }
        char c;
        ssize_t n = read(pe->fd, &c, 1);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break; // end of file or an error
        }
        if (c == '\n') {
            ok = true;
            break;
        }
        if (got + 1 >= len) {
            break; // does not fit
        }
        buf[got++] = c;
    }
    buf[ok ? got : 0] = '\0';
    close(pe->fd);
    pe->fd = -1;
    return ok;
}

int
tp_test_peer_wait_status(tp_test_peer *pe, int64_t ms)
{
    uint64_t deadline = tp__deadline_after_ms(tp_test_ms(ms));
    // A pidfd becomes readable when the child exits: no polling loop where
    // the kernel has one (5.3+).
    int pidfd = (int)syscall(SYS_pidfd_open, pe->pid, 0);
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pe->pid, &status, WNOHANG);
        if (r == pe->pid) {
            break;
        }
        if (r < 0 && errno != EINTR) {
            int e = errno;
            if (pidfd >= 0) {
                close(pidfd);
            }
            TP_CHECKF(false, "peer %s (pid %d): waitpid: %s", pe->name,
                      (int)pe->pid, strerror(e));
        }
        if (tp__now_ns() >= deadline) {
            kill(pe->pid, SIGKILL);
            waitpid(pe->pid, NULL, 0);
            if (pidfd >= 0) {
                close(pidfd);
            }
            TP_CHECKF(false, "peer %s (pid %d) did not exit within %lld ms",
                      pe->name, (int)pe->pid, (long long)tp_test_ms(ms));
        }
        if (pidfd >= 0) {
            struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
            (void)poll(&pfd, 1, peer_poll_ms(deadline));
        } else {
            usleep(2000);
        }
    }
    if (pidfd >= 0) {
        close(pidfd);
    }
    pe->pid = 0;
    return status;
}

void
tp_test_peer_wait(tp_test_peer *pe, int64_t ms)
{
    const char *name = pe->name;
    int pid = (int)pe->pid;
    int st = tp_test_peer_wait_status(pe, ms);
    if (WIFSIGNALED(st)) {
        TP_CHECKF(false, "peer %s (pid %d) was killed by signal %d (%s)", name,
                  pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
    }
    TP_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "peer %s (pid %d) failed: exit status %d (status 0x%x)", name,
              pid, WIFEXITED(st) ? WEXITSTATUS(st) : -1, (unsigned)st);
}

void
tp_test_peer_kill(tp_test_peer *pe)
{
    TP_CHECKF(kill(pe->pid, SIGKILL) == 0, "peer %s (pid %d): kill: %s",
              pe->name, (int)pe->pid, strerror(errno));
    (void)tp_test_peer_wait_status(pe, 20000);
}
