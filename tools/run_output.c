// SPDX-License-Identifier: Apache-2.0
// run_output.c - `tpipe run`: the ranks' output, re-emitted line by line
// with a "[rank] " prefix on the launcher's stdout/stderr, and into the
// --log-dir files.

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "run_impl.h"
#include "tool.h"

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

// Emits @len bytes of @p (one line's content, or a piece of one): on the
// launcher's stdout/stderr with the rank prefix unless continuing a line
// (when the rank is shown), and bare into the rank's log file (if any);
// @nl appends a newline.
static void
run_emit(run_stream *s, const char *prefix, const char *p, size_t len, bool nl)
{
    struct iovec iov[3];
    int n = 0;
    if (s->rs_show) {
        if (!s->rs_midline) {
            iov[n++] = (struct iovec){(void *)prefix, strlen(prefix)};
        }
        iov[n++] = (struct iovec){(void *)p, len};
        if (nl) {
            iov[n++] = (struct iovec){"\n", 1};
        }
        run_write_all(s->rs_out, iov, n);
    }
    if (s->rs_log >= 0) {
        n = 0;
        iov[n++] = (struct iovec){(void *)p, len};
        if (nl) {
            iov[n++] = (struct iovec){"\n", 1};
        }
        run_write_all(s->rs_log, iov, n);
    }
    s->rs_midline = !nl;
}

void
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
void
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

// Opens DIR/rank-RANK.log for each rank of this node (creating DIR, not
// its parents). False after reporting.
bool
run_open_logs(const char *dir, run_rank *ranks, int n, uint64_t first)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        tool_err("run: --log-dir %s: mkdir: %s", dir, strerror(errno));
        return false;
    }
    for (int k = 0; k < n; k++) {
        char path[4096];
        int pl = snprintf(path, sizeof(path), "%s/rank-%llu.log", dir,
                          (unsigned long long)(first + (uint64_t)k));
        if (pl < 0 || (size_t)pl >= sizeof(path)) {
            tool_err("run: --log-dir %s: path too long", dir);
            return false;
        }
        ranks[k].rr_log =
            open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (ranks[k].rr_log < 0) {
            tool_err("run: --log-dir: cannot open %s: %s", path,
                     strerror(errno));
            return false;
        }
    }
    return true;
}
