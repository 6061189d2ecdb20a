// SPDX-License-Identifier: Apache-2.0
// tp_test_variants.c - runs one suite per registry variant (see the
// header). Each variant is a child process of this program, so a crash or
// hang of one names it and the others still run.

#include "tp_test_variants.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tp_test.h"

void
tp_test_variant_env(tp_test_variant *v, const char *name, const char *value)
{
    if (v->tv_nenv >= TP_TEST_VARIANT_ENVS) {
        fprintf(stderr, "variant %s: more than %d variables\n", v->tv_label,
                TP_TEST_VARIANT_ENVS);
        exit(1);
    }
    int n = snprintf(v->tv_env[v->tv_nenv], sizeof(v->tv_env[0]), "%s=%s", name,
                     value);
    if (n < 0 || (size_t)n >= sizeof(v->tv_env[0])) {
        fprintf(stderr, "variant %s: %s=%s is too long\n", v->tv_label, name,
                value);
        exit(1);
    }
    v->tv_nenv++;
}

static int64_t
variants_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Runs @v; returns its exit status, or -1 (with @why) when it crashed or
// ran past the deadline.
static int
variants_run_one(const tp_test_variant *v, char **argv, int64_t limit_ms,
                 char *why, size_t why_len)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, why_len, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        for (unsigned i = 0; i < v->tv_nenv; i++) {
            char *eq = strchr(v->tv_env[i], '=');
            *eq = '\0';
            setenv(v->tv_env[i], eq + 1, 1);
        }
        execv("/proc/self/exe", argv);
        fprintf(stderr, "variant %s: execv /proc/self/exe: %s\n", v->tv_label,
                strerror(errno));
        _exit(127);
    }
    int64_t end = variants_now_ms() + limit_ms;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            break;
        }
        if (r < 0 && errno != EINTR) {
            snprintf(why, why_len, "waitpid: %s", strerror(errno));
            return -1;
        }
        if (variants_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            snprintf(why, why_len, "ran past %lld ms, killed",
                     (long long)limit_ms);
            return -1;
        }
        usleep(20000);
    }
    if (WIFSIGNALED(status)) {
        snprintf(why, why_len, "killed by signal %d", WTERMSIG(status));
        return -1;
    }
    return WEXITSTATUS(status);
}

int
tp_test_run_variants(const char *suite, int argc, char **argv,
                     const tp_test_variant *v, size_t n, int deadline_s)
{
    (void)argc;
    int64_t limit_ms = tp_test_ms((int64_t)deadline_s * 1000);
    size_t passed = 0, failed = 0, skipped = 0;
    char summary[4096] = "";
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        char line[700];
        if (v[i].tv_skip[0] != '\0') {
            snprintf(line, sizeof(line), "variant %s: skipped: %s\n",
                     v[i].tv_label, v[i].tv_skip);
            skipped++;
        } else {
            printf("==== %s, variant %s\n", suite, v[i].tv_label);
            char why[160] = "";
            int rc = variants_run_one(&v[i], argv, limit_ms, why, sizeof(why));
            if (rc == 0) {
                snprintf(line, sizeof(line), "variant %s: passed\n",
                         v[i].tv_label);
                passed++;
            } else if (rc == 77) {
                snprintf(line, sizeof(line),
                         "variant %s: skipped (every case skipped itself; "
                         "reasons above)\n",
                         v[i].tv_label);
                skipped++;
            } else {
                if (rc > 0) {
                    snprintf(why, sizeof(why), "exit %d", rc);
                }
                snprintf(line, sizeof(line), "variant %s: FAILED (%s)\n",
                         v[i].tv_label, why);
                failed++;
            }
        }
        int k = snprintf(summary + off, sizeof(summary) - off, "%s", line);
        if (k > 0 && (size_t)k < sizeof(summary) - off) {
            off += (size_t)k;
        }
    }
    printf("==== %s over the registry: %zu passed, %zu failed, %zu skipped\n%s",
           suite, passed, failed, skipped, summary);
    fflush(stdout);
    if (failed > 0) {
        return 1;
    }
    return passed == 0 ? 77 : 0;
}
