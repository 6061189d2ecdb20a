// SPDX-License-Identifier: Apache-2.0
// cma_probe.c - the cma channel's side socket, through which the kernel
// names the peer (docs/channel-cma.md, "Trust"). What cross-memory attach
// needs of the host (viability, domain descriptor, the read) is core's
// (core/host.c).

#include "channel/cma/cma_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/log.h"

#define CMA_SIDE_PREFIX "tpipe-cma-"
// Connections a side listener takes before it gives up finding the
// peer's token (others may connect: the name is visible in
// /proc/net/unix).
#define CMA_SIDE_BACKLOG 16

// Linux 6.5; older headers lack it.
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

// ---- side socket -----------------------------------------------------------

// "\0tpipe-cma-<name>": an abstract address (no file, gone with the
// socket).
static socklen_t
cma_side_addr(const char name[TP_CMA_SIDE_NAME_LEN], struct sockaddr_un *sa)
{
    size_t plen = sizeof(CMA_SIDE_PREFIX) - 1;
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, CMA_SIDE_PREFIX, plen);
    memcpy(sa->sun_path + 1 + plen, name, TP_CMA_SIDE_NAME_LEN);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + plen +
                       TP_CMA_SIDE_NAME_LEN);
}

static int
cma_random(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

tp_status
tp__cma_side_listen(tp__cma_side *s, tp_error **err_p)
{
    s->cs_fd = -1;
    uint8_t rnd[TP_CMA_SIDE_NAME_LEN / 2];
    int e = cma_random(rnd, sizeof(rnd));
    if (e == 0) {
        e = cma_random(s->cs_token, sizeof(s->cs_token));
    }
    if (e != 0) {
        return tp__error_errno(err_p, e, "cma: side socket: getrandom");
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(rnd); i++) {
        s->cs_name[2 * i] = hex[rnd[i] >> 4];
        s->cs_name[2 * i + 1] = hex[rnd[i] & 15u];
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "cma: side socket: socket");
    }
    struct sockaddr_un sa;
    socklen_t sl = cma_side_addr(s->cs_name, &sa);
    if (bind(fd, (struct sockaddr *)&sa, sl) != 0 ||
        listen(fd, CMA_SIDE_BACKLOG) != 0) {
        e = errno;
        close(fd);
        return tp__error_errno(err_p, e, "cma: side socket: bind/listen");
    }
    s->cs_fd = fd;
    return TP_OK;
}

tp_status
tp__cma_side_connect(const char name[TP_CMA_SIDE_NAME_LEN],
                     const uint8_t token[TP_CMA_SIDE_TOKEN_LEN],
                     tp_error **err_p)
{
    // Only names of our own form: a peer must not make us connect to (and
    // write to) any other abstract socket of the host.
    for (size_t i = 0; i < TP_CMA_SIDE_NAME_LEN; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "cma: side socket: the peer's name is not "
                                 "%d hex digits",
                                 TP_CMA_SIDE_NAME_LEN);
        }
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "cma: side socket: socket");
    }
    struct sockaddr_un sa;
    socklen_t sl = cma_side_addr(name, &sa);
    // A unix connect to a listening socket completes at once (or fails:
    // EAGAIN when its backlog is full, ECONNREFUSED when there is none,
    // e.g. in another network namespace).
    int r;
    do {
        r = connect(fd, (struct sockaddr *)&sa, sl);
    } while (r != 0 && errno == EINTR);
    if (r != 0) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e,
                               "cma: side socket: connect to the peer's "
                               "(same network namespace?)");
    }
    ssize_t n;
    do {
        n = send(fd, token, TP_CMA_SIDE_TOKEN_LEN, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (n != TP_CMA_SIDE_TOKEN_LEN) {
        return tp__error_errno(err_p, n < 0 ? e : EIO,
                               "cma: side socket: send the token");
    }
    return TP_OK;
}

// Whether the @len bytes differ, in time independent of where.
static bool
cma_differ(const uint8_t *a, const uint8_t *b, size_t len)
{
    uint8_t d = 0;
    for (size_t i = 0; i < len; i++) {
        d |= (uint8_t)(a[i] ^ b[i]);
    }
    return d != 0;
}

// The pidfd of the process at the other end of @fd: >= 0, or -1 if the
// kernel cannot give one, or -2 if that process is gone. SO_PEERPIDFD
// names the very process that connected; pidfd_open(@pid), the fallback
// before Linux 6.5, names whoever has @pid now (the same process unless
// it exited in between and its pid was reused).
static int
cma_peer_pidfd(int fd, pid_t pid)
{
    int pfd = -1;
    socklen_t len = sizeof(pfd);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &len) == 0 && pfd >= 0) {
        return pfd;
    }
    if (errno == ESRCH) {
        return -2;
    }
    long r = syscall(SYS_pidfd_open, pid, 0);
    if (r < 0) {
        return errno == ESRCH ? -2 : -1;
    }
    return (int)r; // pidfds are always close-on-exec
}

tp_status
tp__cma_side_accept(tp__cma_side *s, tp__cma_peer *peer_p, tp_error **err_p)
{
    if (s->cs_fd < 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "cma: side socket: already used");
    }
    for (int i = 0; i < CMA_SIDE_BACKLOG; i++) {
        int fd = accept4(s->cs_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) {
                i--;
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            }
            return tp__error_errno(err_p, errno, "cma: side socket: accept");
        }
        uint8_t tok[TP_CMA_SIDE_TOKEN_LEN];
        ssize_t n;
        do {
            n = recv(fd, tok, sizeof(tok), MSG_DONTWAIT | MSG_WAITALL);
        } while (n < 0 && errno == EINTR);
        if (n != (ssize_t)sizeof(tok) ||
            cma_differ(tok, s->cs_token, sizeof(tok))) {
            // Not the peer (a stray or hostile local process).
            TP_LOG_DEBUG("TP-CMA-SIDE",
                         "cma: side socket: dropped a connection without "
                         "the token");
            close(fd);
            continue;
        }
        struct ucred cr;
        socklen_t len = sizeof(cr);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
            int e = errno;
            close(fd);
            return tp__error_errno(err_p, e, "cma: side socket: SO_PEERCRED");
        }
        peer_p->cp_pid = cr.pid;
        peer_p->cp_uid = cr.uid;
        peer_p->cp_gid = cr.gid;
        int pfd = cma_peer_pidfd(fd, cr.pid);
        close(fd);
        if (pfd == -2) {
            return tp__error_set(err_p, TP_ECONNRESET,
                                 "cma: side socket: the peer's process "
                                 "exited");
        }
        peer_p->cp_pidfd = pfd;
        tp__cma_side_close(s);
        return TP_OK;
    }
    return tp__error_set(err_p, TP_EPROTO,
                         "cma: side socket: no connection presents the "
                         "token the peer was given");
}

void
tp__cma_side_close(tp__cma_side *s)
{
    if (s->cs_fd >= 0) {
        close(s->cs_fd);
        s->cs_fd = -1;
    }
}

void
tp__cma_peer_fini(tp__cma_peer *peer)
{
    if (peer->cp_pidfd >= 0) {
        close(peer->cp_pidfd);
        peer->cp_pidfd = -1;
    }
}

bool
tp__cma_peer_alive(const tp__cma_peer *peer)
{
    if (peer->cp_pidfd < 0) {
        return true;
    }
    struct pollfd pfd = {.fd = peer->cp_pidfd, .events = POLLIN};
    int r;
    do {
        r = poll(&pfd, 1, 0);
    } while (r < 0 && errno == EINTR);
    return !(r > 0 && (pfd.revents & (POLLIN | POLLHUP)) != 0);
}
