// SPDX-License-Identifier: Apache-2.0
// tp_test.c - fork-per-case runner with deadlines.

#include "tp_test.h"

#include "tp_config.h"
#if TP_HAVE_IBV
#include "ibv_fake.h"
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double
test_multiplier(void)
{
    const char *s = getenv("TP_TEST_TIMEOUT_MULTIPLIER");
    double m = s ? atof(s) : 1.0;
    return m > 0 ? m : 1.0;
}

int64_t
tp_test_ms(int64_t ms)
{
    return (int64_t)((double)ms * test_multiplier());
}

void
tp_test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(1);
}

void
tp_test_skip(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "skipped: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(77);
}

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

// Runs one case in a child; returns 0 pass, 1 fail, 77 skip.
static int
run_case(const tp_test_case *tc)
{
    int timeout_s = tc->timeout_s > 0 ? tc->timeout_s : 30;
    double limit = (double)timeout_s * test_multiplier();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        // Own process group so a timeout also kills helper peers.
        setpgid(0, 0);
        tc->fn();
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
    setpgid(pid, pid);
    double t0 = now_s();
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            if (WIFEXITED(st)) {
                int code = WEXITSTATUS(st);
                return code == 0 ? 0 : code == 77 ? 77 : 1;
            }
            fprintf(stderr, "case %s: killed by signal %d (%s)\n", tc->name,
                    WTERMSIG(st), strsignal(WTERMSIG(st)));
            kill(-pid, SIGKILL);
            return 1;
        }
        if (now_s() - t0 > limit) {
            fprintf(stderr, "case %s: timed out after %.0f s\n", tc->name,
                    limit);
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            return 1;
        }
        usleep(2000);
    }
}

void
tp_test_install_fakes(void)
{
#if TP_HAVE_IBV
    // TP_IBV_FAKE=1: the ibv transport runs on the in-memory verbs fake.
    tp__ibv_fake_install_from_env();
#endif
}

int
tp_test_main(int argc, char **argv, const tp_test_case *cases, size_t n)
{
    int passed = 0, failed = 0, skipped = 0;
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    tp_test_install_fakes();
    for (size_t i = 0; i < n; i++) {
        bool want = argc <= 1;
        for (int a = 1; a < argc; a++) {
            if (strcmp(argv[a], "--list") == 0) {
                printf("%s\n", cases[i].name);
                want = false;
                break;
            }
            if (strstr(cases[i].name, argv[a]) != NULL) {
                want = true;
            }
        }
        if (!want) {
            continue;
        }
        double t0 = now_s();
        int r = run_case(&cases[i]);
        double dt = now_s() - t0;
        if (r == 0) {
            passed++;
            printf("ok      %-40s %.3fs\n", cases[i].name, dt);
        } else if (r == 77) {
            skipped++;
            printf("skip    %-40s\n", cases[i].name);
        } else {
            failed++;
            printf("FAIL    %-40s %.3fs\n", cases[i].name, dt);
        }
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed > 0) {
        return 1;
    }
    if (passed == 0 && skipped > 0) {
        return 77;
    }
    return 0;
}

// The port stays reserved: the socket is kept bound (SO_REUSEADDR, not
// listening) until this process exits. While it is bound the kernel never
// hands the port out to bind(0) or as the source port of a connect(), so
// no other test can take it; a server that sets SO_REUSEADDR (the tcp
// store does) can still bind and listen on it. The descriptor is
// close-on-exec and inherited by forked workers, which is harmless.
int
tp_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TP_CHECK(fd >= 0);
    int one = 1;
    TP_CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TP_CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    socklen_t l = sizeof(a);
    TP_CHECK(getsockname(fd, (struct sockaddr *)&a, &l) == 0);
    return ntohs(a.sin_port); // fd deliberately kept open: the reservation
}
