// SPDX-License-Identifier: Apache-2.0
// run.c - `tpipe run -n N [--] PROGRAM ARGS...`: a single-node launcher.
// Starts N processes with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT set, re-emits their output line by line with
// a "[rank] " prefix, and when one fails stops the others (SIGTERM, then
// SIGKILL after a grace period) and exits with the failing status.

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tool.h"
#include "tp_config.h"

#define RUN_MAX_RANKS    1024
#define RUN_EXIT_NOEXEC  127
#define RUN_EXIT_TIMEOUT 124
// A line longer than this is emitted in pieces (only the first prefixed).
#define RUN_LINE_MAX (1u << 20)
// After SIGKILL, how long the launcher waits at most for the ranks to go.
#define RUN_FINAL_MS 5000
// Once every rank is reaped, how long pipes still held open by their
// descendants are read before the launcher exits.
#define RUN_DRAIN_MS 200

typedef struct run_stream {
    int rs_fd;       // read end, -1 once closed
    int rs_out;      // 1 or 2
    char *rs_buf;    // pending bytes (no newline among them)
    size_t rs_len;   // bytes pending
    size_t rs_cap;   // capacity of rs_buf
    bool rs_midline; // a piece of an over-long line was already emitted
} run_stream;

typedef struct run_rank {
    pid_t rr_pid; // 0 once reaped
    run_stream rr_s[2];
} run_rank;

static volatile sig_atomic_t run_got_signal;
static int run_wake_fd = -1; // write end of the self-pipe

static void
run_on_signal(int sig)
{
    int saved = errno;
    if (sig != SIGCHLD) {
        run_got_signal = sig;
    }
    char c = 0;
    if (write(run_wake_fd, &c, 1) < 0) {
        // Full pipe: a wake-up is pending anyway.
    }
    errno = saved;
}

static uint64_t
run_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void
run_usage(FILE *f)
{
    fputs("usage: tpipe run -n N [options] [--] PROGRAM [ARGS...]\n"
          "  Starts N local processes of PROGRAM with RANK, WORLD_SIZE, "
          "LOCAL_RANK,\n"
          "  LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; prefixes "
          "each line of\n"
          "  their stdout/stderr with \"[rank] \". When one exits non-zero "
          "or is killed,\n"
          "  the others get SIGTERM, then SIGKILL after the grace period; "
          "the exit\n"
          "  status is the first failing rank's (128+signal for a "
          "signal).\n"
          "  -n N                number of processes, 1..1024\n"
          "  --master-addr A     MASTER_ADDR (default 127.0.0.1)\n"
          "  --master-port P     MASTER_PORT (default: a free port on A)\n"
          "  --grace SECONDS     SIGTERM-to-SIGKILL delay (default 5)\n"
          "  --timeout SECONDS   stop the whole job after this long, exit "
          "124\n"
          "                      (default: no limit)\n"
          "  --no-job-token      do not give the ranks a job secret (by "
          "default a\n"
          "                      fresh random TP_JOB_TOKEN authenticates "
          "their\n"
          "                      connections, unless TP_JOB_TOKEN or\n"
          "                      TP_JOB_TOKEN_FILE is already set: "
          "docs/security.md)\n",
          f);
}

// Gives the ranks a job secret: a fresh random TP_JOB_TOKEN (64 hex
// digits), unless the user set TP_JOB_TOKEN or TP_JOB_TOKEN_FILE (several
// launchers sharing one secret). Never printed. False after reporting.
static bool
run_job_token(bool none)
{
    if (none) {
        unsetenv("TP_JOB_TOKEN");
        unsetenv("TP_JOB_TOKEN_FILE");
        return true;
    }
    if (getenv("TP_JOB_TOKEN") != NULL || getenv("TP_JOB_TOKEN_FILE") != NULL) {
        return true;
    }
#if !TP_HAVE_CRYPTO
    return true; // the library could not check one: run without
#endif
    unsigned char rnd[32];
    size_t got = 0;
    while (got < sizeof(rnd)) {
        ssize_t r = getrandom(rnd + got, sizeof(rnd) - got, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            tool_err("run: getrandom for the job secret: %s", strerror(errno));
            return false;
        }
        got += (size_t)r;
    }
    char hex[2 * sizeof(rnd) + 1];
    for (size_t k = 0; k < sizeof(rnd); k++) {
        snprintf(hex + 2 * k, 3, "%02x", rnd[k]);
    }
    setenv("TP_JOB_TOKEN", hex, 1);
    return true;
}

// Finds a free tcp port by binding port 0 on @addr. Returns the port, or
// 0 after reporting the error.
static unsigned
run_free_port(const char *addr)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(addr, "0", &hints, &ai);
    if (rc != 0) {
        tool_err("run: cannot resolve master address \"%s\": %s", addr,
                 gai_strerror(rc));
        return 0;
    }
    unsigned port = 0;
    int err = 0;
    for (struct addrinfo *p = ai; p != NULL && port == 0; p = p->ai_next) {
        int fd =
            socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (bind(fd, p->ai_addr, p->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            if (ss.ss_family == AF_INET) {
                port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            } else if (ss.ss_family == AF_INET6) {
                port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
            }
        } else {
            err = errno;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    if (port == 0) {
        tool_err("run: cannot find a free port on \"%s\": %s", addr,
                 strerror(err ? err : EADDRNOTAVAIL));
    }
    return port;
}

static void
run_write_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return; // e.g. EPIPE: the output is discarded
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
}

// Emits @len bytes of @p (one line's content, or a piece of one) with the
// rank prefix unless continuing a line; @nl appends a newline.
static void
run_emit(run_stream *s, const char *prefix, const char *p, size_t len, bool nl)
{
    struct iovec iov[3];
    int n = 0;
    if (!s->rs_midline) {
        iov[n++] = (struct iovec){(void *)prefix, strlen(prefix)};
    }
    iov[n++] = (struct iovec){(void *)p, len};
    if (nl) {
        iov[n++] = (struct iovec){"\n", 1};
    }
    run_write_all(s->rs_out, iov, n);
    s->rs_midline = !nl;
}

static void
run_close_stream(run_stream *s, const char *prefix)
{
    if (s->rs_len > 0 || s->rs_midline) {
        run_emit(s, prefix, s->rs_buf, s->rs_len, true); // partial last line
    }
    s->rs_len = 0;
    if (s->rs_fd >= 0) {
        close(s->rs_fd);
        s->rs_fd = -1;
    }
}

// Reads what is available from @s and emits its complete lines.
static void
run_read_stream(run_stream *s, const char *prefix)
{
    if (s->rs_cap - s->rs_len < 4096) {
        size_t cap = s->rs_cap ? 2 * s->rs_cap : 8192;
        char *nb = realloc(s->rs_buf, cap);
        if (nb == NULL) {
            // Out of memory: emit what is pending as a piece.
            run_emit(s, prefix, s->rs_buf, s->rs_len, false);
            s->rs_len = 0;
        } else {
            s->rs_buf = nb;
            s->rs_cap = cap;
        }
    }
    ssize_t n = read(s->rs_fd, s->rs_buf + s->rs_len, s->rs_cap - s->rs_len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        return;
    }
    if (n <= 0) {
        run_close_stream(s, prefix);
        return;
    }
    size_t scan = s->rs_len;
    s->rs_len += (size_t)n;
    size_t start = 0;
    char *nl;
    while ((nl = memchr(s->rs_buf + scan, '\n', s->rs_len - scan)) != NULL) {
        size_t end = (size_t)(nl - s->rs_buf);
        run_emit(s, prefix, s->rs_buf + start, end - start, true);
        start = end + 1;
        scan = start;
    }
    memmove(s->rs_buf, s->rs_buf + start, s->rs_len - start);
    s->rs_len -= start;
    if (s->rs_len >= RUN_LINE_MAX) {
        run_emit(s, prefix, s->rs_buf, s->rs_len, false);
        s->rs_len = 0;
    }
}

// Status of a reaped child as a shell reports it.
static int
run_exit_code(int status)
{
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return TOOL_EXIT_FAIL;
}

static void
run_signal_all(run_rank *r, int n, int sig)
{
    for (int i = 0; i < n; i++) {
        if (r[i].rr_pid > 0) {
            kill(r[i].rr_pid, sig);
        }
    }
}

// The child's side of a fork: environment is already set by the parent.
static void
run_child(pid_t parent, int out_w, int err_w, char **prog,
          const struct rlimit *nofile)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(TOOL_EXIT_FAIL); // the launcher already died
    }
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setrlimit(RLIMIT_NOFILE, nofile);
    if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) {
        _exit(TOOL_EXIT_FAIL);
    }
    if (out_w > 2) {
        close(out_w);
    }
    if (err_w > 2) {
        close(err_w);
    }
    execvp(prog[0], prog);
    int e = errno;
    dprintf(2, "tpipe: run: cannot execute \"%s\": %s\n", prog[0], strerror(e));
    _exit(RUN_EXIT_NOEXEC);
}

static bool
run_parse_seconds(const char *opt, const char *v, double *out)
{
    if (!tool_parse_double(v, out) || *out > 1e7) {
        tool_err("run: %s needs a number of seconds, not \"%s\"", opt, v);
        return false;
    }
    return true;
}

int
tool_run_main(int argc, char **argv)
{
    const char *n_s = NULL, *addr = "127.0.0.1", *port_s = NULL;
    const char *grace_s = NULL, *timeout_s = NULL;
    bool bad = false, no_token = false;
    int i = 1;
    for (; i < argc && !bad; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            run_usage(stdout);
            return TOOL_EXIT_OK;
        }
        if (strncmp(a, "-n", 2) == 0 && a[2] != '\0' && a[2] != '=') {
            n_s = a + 2; // -n4
            continue;
        }
        if (strcmp(a, "--no-job-token") == 0) {
            no_token = true;
            continue;
        }
        if (tool_opt_value(argc, argv, &i, "-n", &n_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--nproc", &n_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--master-addr", &addr, &bad) ||
            tool_opt_value(argc, argv, &i, "--master-port", &port_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--grace", &grace_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--timeout", &timeout_s, &bad)) {
            continue;
        }
        if (a[0] == '-') {
            tool_err("run: unknown option \"%s\" (try tpipe run --help)", a);
            return TOOL_EXIT_USAGE;
        }
        break; // PROGRAM
    }
    if (bad) {
        return TOOL_EXIT_USAGE;
    }
    uint64_t n64 = 0;
    if (n_s == NULL) {
        tool_err("run: -n N is required (try tpipe run --help)");
        return TOOL_EXIT_USAGE;
    }
    if (!tool_parse_u64(n_s, &n64) || n64 < 1 || n64 > RUN_MAX_RANKS) {
        tool_err("run: -n must be between 1 and %d, not \"%s\"", RUN_MAX_RANKS,
                 n_s);
        return TOOL_EXIT_USAGE;
    }
    if (i >= argc) {
        tool_err("run: no program to run (try tpipe run --help)");
        return TOOL_EXIT_USAGE;
    }
    if (addr[0] == '\0') {
        tool_err("run: --master-addr needs an address");
        return TOOL_EXIT_USAGE;
    }
    uint64_t port = 0;
    if (port_s != NULL &&
        (!tool_parse_u64(port_s, &port) || port < 1 || port > 65535)) {
        tool_err("run: --master-port must be 1..65535, not \"%s\"", port_s);
        return TOOL_EXIT_USAGE;
    }
    double grace = 5, timeout = 0;
    if ((grace_s != NULL && !run_parse_seconds("--grace", grace_s, &grace)) ||
        (timeout_s != NULL &&
         !run_parse_seconds("--timeout", timeout_s, &timeout))) {
        return TOOL_EXIT_USAGE;
    }
    if (timeout_s != NULL && timeout <= 0) {
        tool_err("run: --timeout must be positive");
        return TOOL_EXIT_USAGE;
    }
    if (!run_job_token(no_token)) {
        return TOOL_EXIT_FAIL;
    }
    int n = (int)n64;
    char **prog = argv + i;
    uint64_t grace_ms = (uint64_t)(grace * 1000);

    // Two pipes per rank: make room for them.
    struct rlimit nofile_orig, nofile;
    getrlimit(RLIMIT_NOFILE, &nofile_orig);
    nofile = nofile_orig;
    rlim_t need = (rlim_t)(4 * n + 64);
    if (nofile.rlim_cur != RLIM_INFINITY && nofile.rlim_cur < need) {
        nofile.rlim_cur =
            nofile.rlim_max == RLIM_INFINITY || nofile.rlim_max > need
                ? need
                : nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }

    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        tool_err("run: pipe: %s", strerror(errno));
        return TOOL_EXIT_FAIL;
    }
    run_wake_fd = wake[1];
    struct sigaction sa = {.sa_handler = run_on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    run_rank *ranks = calloc((size_t)n, sizeof(*ranks));
    char(*prefix)[16] = calloc((size_t)n, sizeof(*prefix));
    struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof(*pfd));
    run_stream **pfd_s = calloc((size_t)(2 * n + 1), sizeof(*pfd_s));
    int *pfd_rank = calloc((size_t)(2 * n + 1), sizeof(*pfd_rank));
    int rc = TOOL_EXIT_FAIL;
    int started = 0;
    if (ranks == NULL || prefix == NULL || pfd == NULL || pfd_s == NULL ||
        pfd_rank == NULL) {
        tool_err("run: out of memory");
        goto out;
    }

    if (port == 0) {
        port = run_free_port(addr);
        if (port == 0) {
            goto out;
        }
    }
    char buf[32];
    setenv("MASTER_ADDR", addr, 1);
    snprintf(buf, sizeof(buf), "%u", (unsigned)port);
    setenv("MASTER_PORT", buf, 1);
    snprintf(buf, sizeof(buf), "%d", n);
    setenv("WORLD_SIZE", buf, 1);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    fflush(stdout);
    fflush(stderr);
    pid_t self = getpid();
    for (; started < n; started++) {
        run_rank *r = &ranks[started];
        snprintf(prefix[started], sizeof(prefix[started]), "[%d] ", started);
        snprintf(buf, sizeof(buf), "%d", started);
        setenv("RANK", buf, 1);
        setenv("LOCAL_RANK", buf, 1);
        int po[2], pe[2];
        if (pipe2(po, O_CLOEXEC) != 0) {
            tool_err("run: pipe: %s", strerror(errno));
            break;
        }
        if (pipe2(pe, O_CLOEXEC) != 0) {
            tool_err("run: pipe: %s", strerror(errno));
            close(po[0]);
            close(po[1]);
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            run_child(self, po[1], pe[1], prog, &nofile_orig);
        }
        close(po[1]);
        close(pe[1]);
        if (pid < 0) {
            tool_err("run: fork: %s", strerror(errno));
            close(po[0]);
            close(pe[0]);
            break;
        }
        r->rr_pid = pid;
        r->rr_s[0] = (run_stream){.rs_fd = po[0], .rs_out = 1};
        r->rr_s[1] = (run_stream){.rs_fd = pe[0], .rs_out = 2};
    }

    // -1 until the first failure (or launcher signal / timeout) decides it.
    int code = -1;
    if (started < n) {
        code = TOOL_EXIT_FAIL;
    }
    uint64_t now = run_now_ms();
    uint64_t job_deadline = timeout_s ? now + (uint64_t)(timeout * 1000) : 0;
    uint64_t kill_at = 0;  // when to SIGKILL the remaining children
    uint64_t give_up = 0;  // when to stop waiting altogether
    bool stopping = false; // SIGTERM sent (or about to be)
    bool killed = false;   // SIGKILL sent
    bool drained = false;  // every rank reaped: give_up is near
    int handled_signals = 0;
    int launcher_sig = 0;
    int alive = started;
    if (code != -1) {
        stopping = true;
        run_signal_all(ranks, started, SIGTERM);
        kill_at = now + grace_ms;
    }
    for (;;) {
        now = run_now_ms();
        // Signals to the launcher: forward them; a second one kills.
        int sig = run_got_signal;
        if (sig != 0) {
            run_got_signal = 0;
            handled_signals++;
            if (launcher_sig == 0) {
                launcher_sig = sig;
            }
            if (handled_signals == 1) {
                run_signal_all(ranks, started, sig);
                if (!stopping) {
                    stopping = true;
                    kill_at = now + grace_ms;
                }
            } else if (!killed) {
                kill_at = now;
            }
        }
        // Reap.
        for (int k = 0; k < started; k++) {
            run_rank *r = &ranks[k];
            int st;
            if (r->rr_pid <= 0 || waitpid(r->rr_pid, &st, WNOHANG) <= 0) {
                continue;
            }
            r->rr_pid = 0;
            alive--;
            int c = run_exit_code(st);
            if (c != 0 && code == -1) {
                code = c;
            }
            if (c != 0 && !stopping) {
                stopping = true;
                run_signal_all(ranks, started, SIGTERM);
                kill_at = now + grace_ms;
            }
        }
        if (job_deadline != 0 && now >= job_deadline && !stopping &&
            alive > 0) {
            tool_err("run: timed out after %s s; stopping the job", timeout_s);
            if (code == -1) {
                code = RUN_EXIT_TIMEOUT;
            }
            stopping = true;
            run_signal_all(ranks, started, SIGTERM);
            kill_at = now + grace_ms;
        }
        if (stopping && !killed && alive > 0 && now >= kill_at) {
            killed = true;
            run_signal_all(ranks, started, SIGKILL);
            give_up = now + RUN_FINAL_MS;
        }
        if (alive == 0 && !drained) {
            // Every rank is gone, its last output already in the pipes;
            // pipes still held open by grandchildren must not hang the
            // launcher.
            drained = true;
            if (give_up == 0 || give_up > now + RUN_DRAIN_MS) {
                give_up = now + RUN_DRAIN_MS;
            }
        }
        // Build the poll set.
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = wake[0], .events = POLLIN};
        for (int k = 0; k < started; k++) {
            for (int j = 0; j < 2; j++) {
                run_stream *s = &ranks[k].rr_s[j];
                if (s->rs_fd >= 0) {
                    pfd_s[np] = s;
                    pfd_rank[np] = k;
                    pfd[np++] =
                        (struct pollfd){.fd = s->rs_fd, .events = POLLIN};
                }
            }
        }
        if (alive == 0 && np == 1) {
            break; // all reaped, all output emitted
        }
        if (give_up != 0 && now >= give_up) {
            if (alive > 0) {
                tool_err("run: %d process(es) did not exit after SIGKILL; "
                         "giving up",
                         alive);
            }
            break;
        }
        uint64_t next = 0;
        uint64_t cand[3] = {stopping && !killed && alive > 0 ? kill_at : 0,
                            !stopping ? job_deadline : 0, give_up};
        for (int k = 0; k < 3; k++) {
            if (cand[k] != 0 && (next == 0 || cand[k] < next)) {
                next = cand[k];
            }
        }
        int wait_ms = next == 0 ? -1
                      : next <= now
                          ? 0
                          : (int)(next - now < 60000 ? next - now : 60000);
        int pr = poll(pfd, (nfds_t)np, wait_ms);
        if (pr < 0) {
            if (errno == EINTR) {
                continue;
            }
            tool_err("run: poll: %s", strerror(errno));
            run_signal_all(ranks, started, SIGKILL);
            code = TOOL_EXIT_FAIL;
            break;
        }
        if (pfd[0].revents != 0) {
            char drain[64];
            while (read(wake[0], drain, sizeof(drain)) > 0) {
            }
        }
        for (int k = 1; k < np; k++) {
            if (pfd[k].revents != 0) {
                run_read_stream(pfd_s[k], prefix[pfd_rank[k]]);
            }
        }
    }
    if (code == -1) {
        code = launcher_sig != 0 ? 128 + launcher_sig : TOOL_EXIT_OK;
    }
    rc = code;

out:
    if (ranks != NULL) {
        for (int k = 0; k < started; k++) {
            for (int j = 0; j < 2; j++) {
                run_close_stream(&ranks[k].rr_s[j], prefix[k]);
                free(ranks[k].rr_s[j].rs_buf);
            }
        }
    }
    free(ranks);
    free(prefix);
    free(pfd);
    free(pfd_s);
    free(pfd_rank);
    close(wake[0]);
    close(wake[1]);
    return rc;
}
