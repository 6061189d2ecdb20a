// SPDX-License-Identifier: Apache-2.0
// tp_test_job.c - jobs of forked worker processes (tp_test_job.h).

#include "tp_test_job.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/platform.h"
#include "tp_test.h"

int64_t
tp_job_now_ms(void)
{
    return (int64_t)(tp__now_ns() / 1000000u);
}

void
tp_job_sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void
tp_job_latch_init(tp_job_latch *l)
{
    TP_CHECK(pipe2(l->l_fd, O_CLOEXEC) == 0);
    TP_CHECK(fcntl(l->l_fd[1], F_SETFL, O_NONBLOCK) == 0);
}

void
tp_job_latch_post(tp_job_latch *l)
{
    TP_CHECK(l->l_fd[1] >= 0);
    ssize_t w;
    while ((w = write(l->l_fd[1], "x", 1)) < 0 && errno == EINTR) {
    }
    TP_CHECKF(w == 1, "latch post: %s", strerror(errno));
}

int
tp_job_latch_wait(tp_job_latch *l, int n, int64_t ms)
{
    TP_CHECK(l->l_fd[0] >= 0);
    int64_t dl = tp_job_now_ms() + tp_test_ms(ms);
    int got = 0;
    while (got < n) {
        int64_t left = dl - tp_job_now_ms();
        if (left <= 0) {
            break;
        }
        struct pollfd p = {.fd = l->l_fd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)(left > 1000 ? 1000 : left));
        if (r < 0 && errno != EINTR) {
            TP_CHECKF(false, "latch poll: %s", strerror(errno));
        }
        if (r <= 0) {
            continue;
        }
        char buf[64];
        size_t want =
            (size_t)(n - got) < sizeof(buf) ? (size_t)(n - got) : sizeof(buf);
        ssize_t rd = read(l->l_fd[0], buf, want);
        if (rd < 0 && errno == EINTR) {
            continue;
        }
        TP_CHECKF(rd > 0, "latch read: %s", rd == 0 ? "eof" : strerror(errno));
        got += (int)rd;
    }
    return got;
}

void
tp_job_latch_fini(tp_job_latch *l)
{
    for (int i = 0; i < 2; i++) {
        if (l->l_fd[i] >= 0) {
            close(l->l_fd[i]);
            l->l_fd[i] = -1;
        }
    }
}

static const char *
job_name(const tp_job *j, int r)
{
    return j->names != NULL ? j->names[r] : "worker";
}

void
tp_job_run(tp_job *j)
{
    int n = j->nstart > 0 ? j->nstart : j->world;
    TP_CHECK(n > 0 && n <= TP_JOB_MAX_WORLD);
    pid_t pid[TP_JOB_MAX_WORLD] = {0};
    bool done[TP_JOB_MAX_WORLD] = {false};
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        TP_CHECK(pid[r] >= 0);
        if (pid[r] == 0) {
            for (int e = 0; e < TP_JOB_MAX_ENV && j->env[e] != NULL; e++) {
                putenv((char *)j->env[e]);
            }
            if (j->setup != NULL) {
                j->setup(r);
            }
            j->fn(r, j->world, j->url, j->arg);
            fflush(stdout);
            fflush(stderr);
            _exit(0);
        }
    }
    int64_t limit = tp_test_ms(j->limit_ms > 0 ? j->limit_ms : 40000);
    int64_t dl = tp_job_now_ms() + limit;
    char why[512] = "";
    for (;;) {
        int left = 0, left_normal = 0;
        for (int r = 0; r < n; r++) {
            if (done[r]) {
                continue;
            }
            int status = 0;
            pid_t w = waitpid(pid[r], &status, WNOHANG);
            if (w != pid[r]) {
                left++;
                left_normal += j->kill_last[r] ? 0 : 1;
                continue;
            }
            done[r] = true;
            if (j->kill_last[r]) {
                snprintf(why, sizeof(why),
                         "rank %d (%s) exited (status 0x%x) before it was "
                         "killed",
                         r, job_name(j, r), status);
            } else if (j->expect_sig[r] != 0) {
                if (!WIFSIGNALED(status) ||
                    WTERMSIG(status) != j->expect_sig[r]) {
                    snprintf(why, sizeof(why),
                             "rank %d (%s) ended with status 0x%x, want "
                             "signal %d",
                             r, job_name(j, r), status, j->expect_sig[r]);
                }
            } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                snprintf(
                    why, sizeof(why), "rank %d (%s) failed (status 0x%x%s%s)",
                    r, job_name(j, r), status, WIFSIGNALED(status) ? ", " : "",
                    WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "");
            }
            if (why[0] != '\0') {
                break;
            }
        }
        if (why[0] == '\0' && left > 0 && left_normal == 0) {
            // Only ranks to kill remain.
            for (int r = 0; r < n; r++) {
                if (!done[r]) {
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                    done[r] = true;
                }
            }
            left = 0;
        }
        if (why[0] == '\0' && left == 0) {
            return;
        }
        if (why[0] == '\0' && tp_job_now_ms() > dl) {
            size_t off = (size_t)snprintf(why, sizeof(why),
                                          "job did not end in %lld ms; still "
                                          "running:",
                                          (long long)limit);
            for (int r = 0; r < n && off < sizeof(why); r++) {
                if (!done[r]) {
                    off += (size_t)snprintf(why + off, sizeof(why) - off,
                                            " rank %d (%s)", r, job_name(j, r));
                }
            }
        }
        if (why[0] != '\0') {
            for (int r = 0; r < n; r++) {
                if (!done[r]) {
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                }
            }
            TP_CHECKF(false, "%s", why);
        }
        tp_job_sleep_ms(2);
    }
}

void
tp_job_tcp(tp_job *j, int world, tp_job_fn fn, void *arg)
{
    memset(j, 0, sizeof(*j));
    j->world = world;
    j->fn = fn;
    j->arg = arg;
    snprintf(j->url, sizeof(j->url), "tcp://127.0.0.1:%d", tp_test_free_port());
}

tp_agent *
tp_job_rpc_join(const char *name, int rank, int world, const char *url,
                int64_t wait_ms, int64_t rpc_timeout_ms)
{
    tp_agent_options o;
    tp_agent_options_init(&o);
    o.init_method = url;
    o.init_timeout_ms = tp_test_ms(wait_ms);
    o.shutdown_timeout_ms = tp_test_ms(wait_ms);
    if (rpc_timeout_ms > 0) {
        o.rpc_timeout_ms = tp_test_ms(rpc_timeout_ms);
    }
    o.num_worker_threads = 4;
    tp_agent *a = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_init(name, rank, world, &o, &a, &err);
    TP_CHECKF(st == TP_OK, "rank %d: init: %s", rank, tp_error_message(err));
    return a;
}

void
tp_job_rpc_leave(tp_agent *a, int rank)
{
    tp_error *err = NULL;
    tp_status st = tp_rpc_shutdown(a, true, &err);
    TP_CHECKF(st == TP_OK, "rank %d: graceful shutdown: %s", rank,
              tp_error_message(err));
}
