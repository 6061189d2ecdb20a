// SPDX-License-Identifier: Apache-2.0
// bench_collective_run.c - `tpipe bench collective`: one repetition
// in this process (fork the ranks, read their lines, a deadline).

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/platform.h"
#include "tool.h"
#include "bench_collective.h"

// ---- this process: the repetitions ---------------------------------------

// Removes the store's temporary directory and what the store left in it.
static void
bc_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
                continue;
            }
            char p[512];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static void bc_rep_err(bc_rep *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
bc_rep_err(bc_rep *p, const char *fmt, ...)
{
    size_t off = strlen(p->rp_err);
    if (off > 0 && off + 2 < sizeof(p->rp_err)) {
        memcpy(p->rp_err + off, "; ", 3);
        off += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    if (off < sizeof(p->rp_err)) {
        vsnprintf(p->rp_err + off, sizeof(p->rp_err) - off, fmt, ap);
    }
    va_end(ap);
    p->rp_failed = true;
}

// One line from a rank: "<rank> engine|result|error|abort|done ...".
static void
bc_rep_line(bc_rep *p, char *line)
{
    const bc_opts *o = p->rp_opts;
    char *rest = NULL;
    long rank = strtol(line, &rest, 10);
    if (rest == line || *rest != ' ' || rank < 0 || rank >= o->bo_world) {
        bc_rep_err(p, "a rank sent a malformed line \"%.200s\"", line);
        return;
    }
    rest++;
    if (strncmp(rest, "engine ", 7) == 0) {
        snprintf(p->rp_res->rs_engine, sizeof(p->rp_res->rs_engine), "%s",
                 rest + 7);
        tool_verbose(o->bo_verbose, "bench collective",
                     "repetition %u: engine %s", p->rp_rep + 1, rest + 7);
    } else if (strncmp(rest, "result ", 7) == 0) {
        // "result IDX US ITERS REP": REP counts the repetitions run in
        // the rank's one group (launched), from this repetition.
        char *end = NULL;
        unsigned long long idx = strtoull(rest + 7, &end, 10);
        double us = strtod(end, &end);
        double iters = strtod(end, &end);
        unsigned long long sub = strtoull(end, NULL, 10);
        if (idx >= p->rp_ncells || !(us > 0) ||
            sub >= p->rp_res->rs_reps - p->rp_rep) {
            bc_rep_err(p, "rank 0 sent a malformed result \"%.200s\"", rest);
            return;
        }
        unsigned rep = p->rp_rep + (unsigned)sub;
        size_t k = (size_t)idx * p->rp_res->rs_reps + rep;
        p->rp_res->rs_time[k] = us;
        p->rp_res->rs_iters[k] = iters;
        p->rp_nresults++;
        char name[96];
        bc_cell_name(&p->rp_cells[idx], name, sizeof(name));
        tool_verbose(o->bo_verbose, "bench collective",
                     "repetition %u: %s: %.2f us per call (%.0f calls)",
                     rep + 1, name, us, iters);
        if (rep + 1 == p->rp_res->rs_reps) {
            bc_print_row(o, p->rp_res, &p->rp_cells[idx], (size_t)idx);
        }
    } else if (strncmp(rest, "error ", 6) == 0) {
        bc_rep_err(p, "rank %ld: %s", rank, rest + 6);
    } else if (strcmp(rest, "abort") == 0) {
        p->rp_failed = true; // the rank that saw the wrong value says it
    } else if (strcmp(rest, "done") == 0) {
        if (!p->rp_done[rank]) {
            p->rp_done[rank] = true;
            p->rp_ndone++;
        }
    } else {
        bc_rep_err(p, "rank %ld sent an unknown line \"%.200s\"", rank, rest);
    }
}

// Reads the ranks' lines until every write end closed, the deadline, or
// a little after the first error. False when the deadline passed.
static bool
bc_rep_read(bc_rep *p, int fd, uint64_t deadline)
{
    uint64_t fail_deadline = UINT64_MAX;
    for (;;) {
        uint64_t now = tp__now_ns();
        if (p->rp_failed && fail_deadline == UINT64_MAX) {
            fail_deadline = now + (uint64_t)(BC_ERROR_GRACE_S * 1e9);
        }
        uint64_t dl = deadline < fail_deadline ? deadline : fail_deadline;
        if (now >= dl) {
            return now < deadline;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ms = (int)((dl - now) / 1000000u) + 1;
        int pr = poll(&pfd, 1, ms > 200 ? 200 : ms);
        if (pr < 0 && errno != EINTR) {
            bc_rep_err(p, "poll: %s", strerror(errno));
            return true;
        }
        if (pr <= 0) {
            continue;
        }
        ssize_t n =
            read(fd, p->rp_buf + p->rp_len, sizeof(p->rp_buf) - 1 - p->rp_len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return true; // every rank closed its end
        }
        p->rp_len += (size_t)n;
        p->rp_buf[p->rp_len] = '\0';
        char *start = p->rp_buf, *nl;
        while ((nl = strchr(start, '\n')) != NULL) {
            *nl = '\0';
            bc_rep_line(p, start);
            start = nl + 1;
        }
        p->rp_len -= (size_t)(start - p->rp_buf);
        memmove(p->rp_buf, start, p->rp_len);
        if (p->rp_len == sizeof(p->rp_buf) - 1) {
            p->rp_len = 0; // a line longer than any rank writes
        }
    }
}

// One repetition: fresh ranks. False after writing what failed to
// p->rp_err.
bool
bc_run_rep(bc_rep *p)
{
    const bc_opts *o = p->rp_opts;
    char url[600], dir[256] = "";
    if (o->bo_launch.bl_on) {
        snprintf(url, sizeof(url), "%s", o->bo_launch.bl_url);
    } else if (o->bo_tcp) {
        char why[256];
        int port = tool_free_port(why, sizeof(why));
        if (port < 0) {
            bc_rep_err(p, "%s", why);
            return false;
        }
        snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/tpipe-bench-coll-XXXXXX",
                 tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
        if (mkdtemp(dir) == NULL) {
            bc_rep_err(p, "mkdtemp(%s): %s", dir, strerror(errno));
            return false;
        }
        snprintf(url, sizeof(url), "file://%s/store", dir);
    }
    int pfd[2];
    if (pipe(pfd) != 0) {
        bc_rep_err(p, "pipe: %s", strerror(errno));
        if (dir[0] != '\0') {
            bc_rmdir(dir);
        }
        return false;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    int started = 0;
    for (int rank = p->rp_first; rank < p->rp_first + p->rp_nlocal; rank++) {
        pid_t pid = fork();
        if (pid < 0) {
            bc_rep_err(p, "fork of rank %d: %s", rank, strerror(errno));
            break;
        }
        if (pid == 0) {
            close(pfd[0]);
            // Die with this process, whatever happens to it.
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) {
                _exit(TOOL_EXIT_FAIL);
            }
            bc_rank_main(o, p->rp_cells, p->rp_ncells, rank, url, pfd[1]);
        }
        p->rp_pid[started++] = pid;
    }
    close(pfd[1]);
    bool in_time = true;
    // Launched: every repetition runs in this one (--timeout each).
    unsigned reps = o->bo_launch.bl_on ? o->bo_reps : 1;
    double limit_s = o->bo_timeout_s * reps;
    // Rank 0 reports the results: one per cell and repetition run here.
    size_t want = p->rp_first == 0 ? p->rp_ncells * reps : 0;
    if (!p->rp_failed) {
        uint64_t deadline = tp__now_ns() + (uint64_t)(limit_s * 1e9);
        in_time = bc_rep_read(p, pfd[0], deadline);
    }
    close(pfd[0]);
    bool ok = !p->rp_failed && in_time && p->rp_ndone == started &&
              p->rp_nresults == want;
    if (!in_time) {
        char last[128] = "none";
        for (size_t i = p->rp_ncells; i-- > 0;) {
            if (!isnan(
                    p->rp_res->rs_time[i * p->rp_res->rs_reps + p->rp_rep])) {
                bc_cell_name(&p->rp_cells[i], last, sizeof(last));
                break;
            }
        }
        char pending[256] = "";
        size_t off = 0;
        for (int i = 0; i < started && off < sizeof(pending); i++) {
            if (!p->rp_done[p->rp_first + i]) {
                off +=
                    (size_t)snprintf(pending + off, sizeof(pending) - off,
                                     "%s%d", off ? ", " : "", p->rp_first + i);
            }
        }
        bc_rep_err(p,
                   "did not finish within %g s (--timeout %g s%s; last "
                   "measurement reported: %s; ranks not done: %s); killed "
                   "the ranks",
                   limit_s, o->bo_timeout_s, reps > 1 ? " per repetition" : "",
                   last, pending[0] ? pending : "none");
    }
    // Reap every rank; one that failed without saying why is reported, and
    // one that died of a signal before we killed the rest (a crash, the
    // OOM killer) always is: the others' errors are then its consequence.
    for (int i = 0; i < started; i++) {
        int r = p->rp_first + i;
        int status = -1;
        bool dead = waitpid(p->rp_pid[i], &status, WNOHANG) == p->rp_pid[i];
        if (!dead) {
            status = tool_reap(p->rp_pid[i], ok ? 5000 : 0, !ok);
        }
        bool exited0 =
            status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (ok && !exited0) {
            ok = false;
        }
        if (dead && WIFSIGNALED(status)) {
            bc_rep_err(p, "rank %d (pid %d) died of signal %d (%s)", r,
                       (int)p->rp_pid[i], WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
        } else if (!exited0 && !p->rp_failed) {
            if (status != -1 && WIFSIGNALED(status)) {
                bc_rep_err(p, "rank %d (pid %d) killed by signal %d", r,
                           (int)p->rp_pid[i], WTERMSIG(status));
            } else {
                bc_rep_err(p, "rank %d (pid %d) exited with status %d", r,
                           (int)p->rp_pid[i],
                           status == -1 ? -1 : WEXITSTATUS(status));
            }
        }
    }
    if (ok && p->rp_nresults != want) {
        ok = false;
    }
    if (!ok && p->rp_err[0] == '\0') {
        bc_rep_err(p,
                   "the ranks ended after %zu of %zu measurements without "
                   "an error message",
                   p->rp_nresults, want);
    }
    if (dir[0] != '\0') {
        bc_rmdir(dir);
    }
    return ok;
}
