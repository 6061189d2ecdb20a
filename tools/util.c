// SPDX-License-Identifier: Apache-2.0
// util.c - argument parsing, JSON output, aligned tables and the
// benchmarks' shared helpers for the tpipe command.

#include <errno.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/platform.h"
#include "tool.h"

void
tool_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tpipe: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

bool
tool_parse_u64(const char *s, uint64_t *v_p)
{
    if (s == NULL || *s < '0' || *s > '9') {
        return false;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *v_p = v;
    return true;
}

bool
tool_parse_double(const char *s, double *v_p)
{
    if (s == NULL || *s == '\0' || *s == '-') {
        return false;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v < 0) {
        return false;
    }
    *v_p = v;
    return true;
}

bool
tool_parse_size(const char *s, uint64_t *v_p)
{
    if (s == NULL || *s < '0' || *s > '9') {
        return false;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) {
        return false;
    }
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        return false;
    }
    // Accept "K", "KB", "KiB" alike: all are binary multiples here.
    if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0) {
        end += strlen(end);
    }
    if (*end != '\0' || (shift > 0 && v > (UINT64_MAX >> shift))) {
        return false;
    }
    *v_p = (uint64_t)v << shift;
    return true;
}

void
tool_format_size(uint64_t v, char *buf, size_t len)
{
    if (v >= (1u << 30) && v % (1u << 30) == 0) {
        snprintf(buf, len, "%lluG", (unsigned long long)(v >> 30));
    } else if (v >= (1u << 20) && v % (1u << 20) == 0) {
        snprintf(buf, len, "%lluM", (unsigned long long)(v >> 20));
    } else if (v >= 1024 && v % 1024 == 0) {
        snprintf(buf, len, "%lluK", (unsigned long long)(v >> 10));
    } else {
        snprintf(buf, len, "%llu", (unsigned long long)v);
    }
}

bool
tool_opt_value(int argc, char **argv, int *i, const char *name,
               const char **value_p, bool *bad_p)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) {
        return false;
    }
    if (a[n] == '=') {
        *value_p = a + n + 1;
        return true;
    }
    if (a[n] != '\0') {
        return false;
    }
    if (*i + 1 >= argc) {
        tool_err("option %s needs a value", name);
        *bad_p = true;
        return true;
    }
    *i += 1;
    *value_p = argv[*i];
    return true;
}

void
tool_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        default:
            if (*p < 0x20) {
                fprintf(f, "\\u%04x", *p);
            } else {
                fputc(*p, f);
            }
        }
    }
    fputc('"', f);
}

void
tool_json_num(FILE *f, double v)
{
    if (!isfinite(v)) {
        fputs("null", f);
    } else if (v == floor(v) && fabs(v) < 1e15) {
        fprintf(f, "%.0f", v);
    } else {
        fprintf(f, "%.6g", v);
    }
}

void
tool_table_init(tool_table *t, size_t ncols)
{
    memset(t, 0, sizeof(*t));
    t->tt_ncols = ncols < 16 ? ncols : 16;
}

void
tool_table_add(tool_table *t, const char *const *cells)
{
    if (t->tt_nrows == t->tt_cap) {
        size_t cap = t->tt_cap ? 2 * t->tt_cap : 16;
        char **nc = realloc(t->tt_cells, cap * t->tt_ncols * sizeof(char *));
        if (nc == NULL) {
            return; // out of memory: the row is dropped
        }
        t->tt_cells = nc;
        t->tt_cap = cap;
    }
    for (size_t c = 0; c < t->tt_ncols; c++) {
        const char *s = cells[c] ? cells[c] : "";
        t->tt_cells[t->tt_nrows * t->tt_ncols + c] = strdup(s);
    }
    t->tt_nrows++;
}

void
tool_table_print(const tool_table *t, FILE *f)
{
    size_t w[16] = {0};
    for (size_t r = 0; r < t->tt_nrows; r++) {
        for (size_t c = 0; c < t->tt_ncols; c++) {
            const char *s = t->tt_cells[r * t->tt_ncols + c];
            size_t n = s ? strlen(s) : 0;
            w[c] = n > w[c] ? n : w[c];
        }
    }
    for (size_t r = 0; r < t->tt_nrows; r++) {
        for (size_t c = 0; c < t->tt_ncols; c++) {
            const char *s = t->tt_cells[r * t->tt_ncols + c];
            s = s ? s : "";
            bool last = c + 1 == t->tt_ncols;
            if (t->tt_right[c]) {
                fprintf(f, "%*s", (int)w[c], s);
            } else if (last) {
                fputs(s, f); // no trailing blanks
            } else {
                fprintf(f, "%-*s", (int)w[c], s);
            }
            if (!last) {
                fputs("  ", f);
            }
        }
        fputc('\n', f);
    }
}

void
tool_table_fini(tool_table *t)
{
    for (size_t i = 0; i < t->tt_nrows * t->tt_ncols; i++) {
        free(t->tt_cells[i]);
    }
    free(t->tt_cells);
    memset(t, 0, sizeof(*t));
}

uint64_t
tool_cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) *
               1000000000u +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) *
               1000u;
}

// ---- shared by the benchmarks ----------------------------------------------

int
tool_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double
tool_median(double *v, size_t n)
{
    if (n == 0) {
        return NAN;
    }
    qsort(v, n, sizeof(double), tool_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double
tool_quantile(const double *v, size_t n, double q)
{
    if (n == 0) {
        return NAN;
    }
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

void
tool_fmt_num(char *buf, size_t len, double v, int prec)
{
    if (isfinite(v)) {
        snprintf(buf, len, "%.*f", prec, v);
    } else {
        snprintf(buf, len, "-");
    }
}

void
tool_verbose(bool on, const char *prefix, const char *fmt, ...)
{
    if (!on) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fputs("tpipe: ", stderr);
    if (prefix != NULL) {
        fprintf(stderr, "%s: ", prefix);
    }
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

tool_line_status
tool_read_line(int fd, uint64_t deadline_ns, char *buf, size_t len, char *why,
               size_t why_len)
{
    size_t got = 0;
    while (got < len - 1 && memchr(buf, '\n', got) == NULL) {
        uint64_t now = tp__now_ns();
        if (now >= deadline_ns) {
            return TOOL_LINE_TIMEOUT;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)((deadline_ns - now) / 1000000u) + 1);
        if (pr < 0 && errno != EINTR) {
            snprintf(why, why_len, "poll: %s", strerror(errno));
            return TOOL_LINE_ERROR;
        }
        if (pr <= 0) {
            continue;
        }
        ssize_t n = read(fd, buf + got, len - 1 - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return TOOL_LINE_EOF;
        }
        got += (size_t)n;
    }
    buf[got] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl != NULL) {
        *nl = '\0';
    }
    return TOOL_LINE_OK;
}

int
tool_reap(pid_t pid, int grace_ms, bool kill_now)
{
    int status = -1;
    if (kill_now) {
        kill(pid, SIGKILL);
    }
    for (int waited = 0;; waited += 10) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            return status;
        }
        if (w < 0 && errno != EINTR) {
            return -1;
        }
        if (waited >= grace_ms) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            return status;
        }
        usleep(10000);
    }
}

// The teardown alarm's message, built before the alarm is armed.
static char tool_alarm_msg[160];
static size_t tool_alarm_len;

static void
tool_alarm_handler(int sig)
{
    (void)sig;
    if (write(2, tool_alarm_msg, tool_alarm_len) < 0) {
        // Nothing more to do.
    }
    _exit(TOOL_EXIT_FAIL);
}

void
tool_install_teardown_alarm(const char *what, unsigned seconds)
{
    alarm(0); // a pending one must not see the message half rewritten
    int n =
        snprintf(tool_alarm_msg, sizeof(tool_alarm_msg),
                 "tpipe: %s: teardown after an error hung; exiting\n", what);
    tool_alarm_len = n < 0 ? 0
                     : (size_t)n < sizeof(tool_alarm_msg)
                         ? (size_t)n
                         : sizeof(tool_alarm_msg) - 1;
    signal(SIGALRM, tool_alarm_handler);
    alarm(seconds);
}

bool
tool_stream_measure(uint64_t window, uint64_t iters, double budget,
                    bool (*run)(void *arg, uint64_t count, double *secs_p),
                    void *arg, uint64_t *count_p, double *secs_p)
{
    uint64_t w = window;
    uint64_t lo = 2 * w > 16 ? 2 * w : 16;
    uint64_t hi = iters > lo ? iters : lo;
    // Warm-up (untimed), which also estimates the message rate so that the
    // measured run fills about the budget.
    double secs = 0;
    uint64_t count = 2 * w;
    if (!run(arg, count, &secs)) {
        return false;
    }
    for (int attempt = 0;; attempt++) {
        double per_msg = secs / (double)count;
        double want = per_msg > 0 ? budget / per_msg : (double)hi;
        count = want < (double)lo   ? lo
                : want > (double)hi ? hi
                                    : (uint64_t)want;
        if (!run(arg, count, &secs)) {
            return false;
        }
        // A run far shorter than the budget (the warm-up estimate was
        // pessimistic) is repeated with a better estimate, twice at most.
        if (attempt >= 2 || count >= hi || secs >= budget / 2) {
            break;
        }
    }
    *count_p = count;
    *secs_p = secs;
    return true;
}

int
tool_free_port(char *err, size_t err_len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        snprintf(err, err_len, "a free port on 127.0.0.1: %s", strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    close(fd);
    return ntohs(sa.sin_port);
}
