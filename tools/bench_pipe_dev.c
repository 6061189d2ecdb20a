// SPDX-License-Identifier: Apache-2.0
// bench_pipe_dev.c - `tpipe bench pipe --device SPEC`: where the tensors
// are (CPU or a CUDA device, through core/cuda.h, which loads libcudart
// at first use), the forked probe and measuring processes that keep this
// one free of CUDA until its last fork, and the cudaMemcpy baseline.
//
// SPEC is `cpu`, `cuda:N` (both ends), or a pair `SRC->DST` / `SRC,DST`:
// the measuring side's tensors (it sends them) on SRC, the serving side's
// (it receives them into its own buffers, and echoes from them) on DST.
// Both sides of a run across hosts take the same SPEC, as they take the
// same --sizes: the server allocates its buffers from it, and it checks
// the device each message's descriptor names against SRC.

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_pipe.h"
#include "core/cuda.h"
#include "core/platform.h"
#include "tool.h"

// ---- the spec --------------------------------------------------------------

void
bp_dev_name(tp_device d, char *buf, size_t len)
{
    if (d.type == TP_DEVICE_CUDA) {
        snprintf(buf, len, "cuda:%d", d.index);
    } else {
        snprintf(buf, len, "cpu");
    }
}

// One device: "cpu" or "cuda:N" (N a decimal index below 1024).
static bool
bp_dev_parse_one(const char *s, size_t n, tp_device *d)
{
    if (n == 3 && strncmp(s, "cpu", 3) == 0) {
        *d = (tp_device){.type = TP_DEVICE_CPU, .index = 0};
        return true;
    }
    if (n < 6 || n > 9 || strncmp(s, "cuda:", 5) != 0) {
        return false;
    }
    int idx = 0;
    for (size_t i = 5; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
        idx = idx * 10 + (s[i] - '0');
    }
    if (idx >= 1024) {
        return false;
    }
    *d = (tp_device){.type = TP_DEVICE_CUDA, .index = idx};
    return true;
}

static bool
bp_dev_parse(const char *spec, tp_device *src, tp_device *dst)
{
    const char *arrow = strstr(spec, "->");
    const char *comma = strchr(spec, ',');
    if (arrow != NULL && comma != NULL) {
        return false;
    }
    if (arrow == NULL && comma == NULL) {
        return bp_dev_parse_one(spec, strlen(spec), src) &&
               bp_dev_parse_one(spec, strlen(spec), dst);
    }
    const char *sep = arrow != NULL ? arrow : comma;
    const char *rest = sep + (arrow != NULL ? 2 : 1);
    return bp_dev_parse_one(spec, (size_t)(sep - spec), src) &&
           bp_dev_parse_one(rest, strlen(rest), dst);
}

// ---- the probe -------------------------------------------------------------

// Asks a forked child whether CUDA is usable and how many devices there
// are: this process must not initialise the runtime before it forks its
// servers. Returns 1 (usable, *@ndev_p), 0 (not, @why) or -1 (the probe
// failed, @why).
static int
bp_dev_probe(const bp_opts *o, int *ndev_p, char *why, size_t why_len)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, why_len, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        char reason[512], line[600];
        int n = 0;
        if (tp__cuda_available(reason, sizeof(reason))) {
            snprintf(line, sizeof(line), "OK %d\n", tp__cuda_device_count());
        } else {
            bp_flatten(reason);
            snprintf(line, sizeof(line), "NO %s\n", reason);
        }
        size_t len = strlen(line);
        n = (int)write(fds[1], line, len);
        _exit(n == (int)len ? 0 : 1);
    }
    close(fds[1]);
    char line[700];
    // Initialising a real runtime can take seconds.
    uint64_t deadline =
        tp__now_ns() + (uint64_t)((o->bo_com.bo_stall_s + 30) * 1e9);
    tool_line_status ls =
        tool_read_line(fds[0], deadline, line, sizeof(line), why, why_len);
    close(fds[0]);
    tool_reap(pid, 1000, ls != TOOL_LINE_OK);
    if (ls == TOOL_LINE_OK && strncmp(line, "OK ", 3) == 0) {
        *ndev_p = atoi(line + 3);
        return 1;
    }
    if (ls == TOOL_LINE_OK && strncmp(line, "NO ", 3) == 0) {
        snprintf(why, why_len, "%s", line + 3);
        return 0;
    }
    if (ls != TOOL_LINE_ERROR) {
        snprintf(why, why_len, "the probe process %s",
                 ls == TOOL_LINE_TIMEOUT ? "did not answer in time"
                                         : "exited without an answer");
    }
    return -1;
}

int
bp_dev_check(bp_opts *o)
{
    const char *spec = o->bo_device != NULL ? o->bo_device : "cpu";
    if (!bp_dev_parse(spec, &o->bo_src, &o->bo_dst)) {
        tool_err("bench pipe: --device %s: not a device spec (cpu, cuda:N, "
                 "or a pair SRC->DST or SRC,DST such as cuda:0,cpu)",
                 spec);
        return TOOL_EXIT_USAGE;
    }
    o->bo_cuda =
        o->bo_src.type == TP_DEVICE_CUDA || o->bo_dst.type == TP_DEVICE_CUDA;
    const char *dch = o->bo_device_channel;
    if (dch != NULL && !o->bo_cuda) {
        tool_err("bench pipe: --device-channel %s: only with a CUDA --device "
                 "(CPU tensors never take a device channel)",
                 dch);
        return TOOL_EXIT_USAGE;
    }
    if (dch != NULL && strcmp(dch, "none") != 0) {
        char list[96];
        tool_device_channels(list, sizeof(list));
        size_t n = strlen(dch);
        const char *hit = strstr(list, dch);
        if (n == 0 || hit == NULL || (hit != list && hit[-1] != ',') ||
            (hit[n] != '\0' && hit[n] != ',')) {
            tool_err("bench pipe: --device-channel %s: not a device channel "
                     "built here (valid: %s%snone)",
                     dch, list, list[0] ? ", " : "");
            return TOOL_EXIT_USAGE;
        }
    }
    if (!o->bo_cuda) {
        return -1;
    }
    if (o->bo_msgrate) {
        tool_err("bench pipe: --device %s: --test msgrate measures CPU "
                 "messages only (use pingpong, stream or bibw)",
                 spec);
        return TOOL_EXIT_USAGE;
    }
    char why[700];
    int ndev = 0;
    int ok = bp_dev_probe(o, &ndev, why, sizeof(why));
    if (ok < 0) {
        tool_err("bench pipe: --device %s: checking the CUDA runtime: %s", spec,
                 why);
        return TOOL_EXIT_FAIL;
    }
    if (ok == 0) {
        tool_err("bench pipe: --device %s: skipped, CUDA is not usable here: "
                 "%s",
                 spec, why);
        return BP_EXIT_SKIP;
    }
    o->bo_ndev = ndev;
    return -1;
}

int
bp_dev_check_indices(const bp_opts *o)
{
    if (!o->bo_cuda) {
        return -1;
    }
    const char *spec = o->bo_device;
    int ndev = o->bo_ndev;
    // The sides this process plays: the server uses DST, the client SRC.
    bool serve = o->bo_listen || (o->bo_launched && o->bo_rank >= 1);
    bool measure = !o->bo_listen && !(o->bo_launched && o->bo_rank >= 1);
    bool remote = o->bo_listen || o->bo_connect != NULL || o->bo_launched;
    const tp_device *use[2] = {(!remote || measure) ? &o->bo_src : NULL,
                               (!remote || serve) ? &o->bo_dst : NULL};
    for (int i = 0; i < 2; i++) {
        if (use[i] != NULL && use[i]->type == TP_DEVICE_CUDA &&
            use[i]->index >= ndev) {
            tool_err("bench pipe: --device %s: no CUDA device %d here (%d "
                     "device%s, 0..%d)",
                     spec, use[i]->index, ndev, ndev == 1 ? "" : "s", ndev - 1);
            return TOOL_EXIT_USAGE;
        }
    }
    return -1;
}

// ---- buffers ---------------------------------------------------------------

uint8_t *
bp_buf_alloc(tp_device d, uint64_t n, char *why, size_t why_len)
{
    if (d.type != TP_DEVICE_CUDA) {
        uint8_t *p = bt_buf_alloc(n);
        if (p == NULL) {
            snprintf(why, why_len, "out of memory for %llu bytes",
                     (unsigned long long)n);
        }
        return p;
    }
    void *p = NULL;
    tp_error *err = NULL;
    if (tp__cuda_alloc(d.index, (size_t)n, &p, &err) != TP_OK) {
        snprintf(why, why_len, "%llu bytes on cuda:%d: %s",
                 (unsigned long long)n, d.index, tp_error_message(err));
        tp_error_unref(err);
        return NULL;
    }
    return p;
}

void
bp_buf_free(tp_device d, uint8_t *p)
{
    if (d.type == TP_DEVICE_CUDA) {
        tp__cuda_free(d.index, p);
    } else {
        free(p);
    }
}

// Copies @n bytes between host memory and @buf (on @d): to @buf when
// @put.
static bool
bp_dev_xfer(tp_device d, uint8_t *buf, void *host, size_t n, bool put,
            char *why, size_t why_len)
{
    if (d.type != TP_DEVICE_CUDA) {
        memcpy(put ? buf : host, put ? host : buf, n);
        return true;
    }
    tp_error *err = NULL;
    tp_status st = put ? tp__cuda_copy(buf, d.index, host, -1, n, &err)
                       : tp__cuda_copy(host, -1, buf, d.index, n, &err);
    if (st != TP_OK) {
        snprintf(why, why_len, "stamp copy %s cuda:%d: %s", put ? "to" : "from",
                 d.index, tp_error_message(err));
        tp_error_unref(err);
        return false;
    }
    return true;
}

bool
bp_stamp_put(tp_device d, uint8_t *buf, uint64_t size, uint64_t v, char *why,
             size_t why_len)
{
    return bp_dev_xfer(d, buf, &v, 8, true, why, why_len) &&
           bp_dev_xfer(d, buf + size - 8, &v, 8, true, why, why_len);
}

bool
bp_stamp_check(tp_device d, const uint8_t *buf, uint64_t size, uint64_t v,
               bool *ok_p, char *why, size_t why_len)
{
    uint64_t a = 0, b = 0;
    uint8_t *p = (uint8_t *)(uintptr_t)buf;
    if (!bp_dev_xfer(d, p, &a, 8, false, why, why_len) ||
        !bp_dev_xfer(d, p + size - 8, &b, 8, false, why, why_len)) {
        return false;
    }
    *ok_p = a == v && b == v;
    return true;
}

void *
bp_shared_alloc(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void
bp_shared_free(void *p, size_t n)
{
    if (p != NULL) {
        munmap(p, n);
    }
}

// ---- one repetition in a child ---------------------------------------------

typedef struct bp_iso {
    bp_run is_run;
    int is_outcome; // bp_outcome, -1 until the child finished
} bp_iso;

bp_outcome
bp_run_rep_isolated(bp_opts *o, bp_run *r, bench_cell *cells)
{
    size_t nsizes = o->bo_com.bo_nsizes;
    unsigned before[2 * BENCH_MAX_SIZES];
    for (size_t i = 0; i < 2 * nsizes; i++) {
        before[i] = cells[i].bc_n;
    }
    bp_iso *sh = bp_shared_alloc(sizeof(*sh));
    if (sh == NULL) {
        snprintf(r->pr_err, sizeof(r->pr_err), "shared memory: %s",
                 strerror(errno));
        return BP_FAIL;
    }
    sh->is_run = *r;
    sh->is_outcome = -1;
    // The child prints nothing of the rows: this process does, once the
    // child's repetition is in the (shared) cells.
    void (*done_fn)(void *, bench_cell *) = o->bo_com.bo_done_fn;
    o->bo_com.bo_done_fn = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        bp_outcome out = bp_run_rep(&sh->is_run, cells);
        sh->is_outcome = (int)out;
        _exit(0);
    }
    o->bo_com.bo_done_fn = done_fn;
    if (pid < 0) {
        snprintf(r->pr_err, sizeof(r->pr_err), "fork: %s", strerror(errno));
        bp_shared_free(sh, sizeof(*sh));
        return BP_FAIL;
    }
    // The child's every wait has a deadline; this one bounds them all:
    // each measurement its budget three times (warm-up, estimate, run)
    // plus a stall timeout, and the setup and teardown.
    double secs = (double)(2 * nsizes) *
                      (3 * o->bo_com.bo_budget + o->bo_com.bo_stall_s) +
                  4 * o->bo_com.bo_stall_s + 30;
    int ws = tool_reap(pid, (int)(secs * 1000), false);
    bp_outcome out = BP_FAIL;
    if (sh->is_outcome >= 0) {
        out = (bp_outcome)sh->is_outcome;
        memcpy(r->pr_transport, sh->is_run.pr_transport,
               sizeof(r->pr_transport));
        memcpy(r->pr_dchannel, sh->is_run.pr_dchannel, sizeof(r->pr_dchannel));
        memcpy(r->pr_err, sh->is_run.pr_err, sizeof(r->pr_err));
    } else {
        snprintf(r->pr_err, sizeof(r->pr_err),
                 "the measuring process %d ended without a result (%s %d%s)",
                 (int)pid,
                 ws >= 0 && WIFSIGNALED(ws) ? "signal" : "exit status",
                 ws < 0            ? -1
                 : WIFSIGNALED(ws) ? WTERMSIG(ws)
                                   : WEXITSTATUS(ws),
                 ws >= 0 && WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL
                     ? ", killed after its deadline"
                     : "");
    }
    bp_shared_free(sh, sizeof(*sh));
    for (size_t i = 0; i < nsizes && done_fn != NULL; i++) {
        for (size_t t = 0; t < 2; t++) {
            bench_cell *c = &cells[t * nsizes + i];
            if (before[t * nsizes + i] < o->bo_com.bo_reps &&
                c->bc_n == o->bo_com.bo_reps) {
                done_fn(o->bo_com.bo_done_arg, c);
            }
        }
    }
    return out;
}

// ---- the cudaMemcpy baseline -----------------------------------------------

typedef struct bp_copy {
    const char *cp_test;
    tp_device cp_src, cp_dst;
    uint8_t *cp_sbuf, *cp_dbuf;
} bp_copy;

static uint8_t *
bp_copy_buf(tp_device d, uint64_t n, char *why, size_t why_len)
{
    if (d.type == TP_DEVICE_CUDA) {
        return bp_buf_alloc(d, n, why, why_len);
    }
    // Page-locked, as the pipe's staging buffers: the copy's ceiling.
    void *p = NULL;
    tp_error *err = NULL;
    if (tp__cuda_host_alloc((size_t)n, &p, &err) != TP_OK) {
        snprintf(why, why_len, "pinned host memory of %llu bytes: %s",
                 (unsigned long long)n, tp_error_message(err));
        tp_error_unref(err);
        return NULL;
    }
    return p;
}

static void
bp_copy_free(tp_device d, uint8_t *p)
{
    if (d.type == TP_DEVICE_CUDA) {
        tp__cuda_free(d.index, p);
    } else {
        tp__cuda_host_free(p);
    }
}

// @reps timings of @n copies of @size bytes: the median GB/s into *@gbps_p.
static bool
bp_copy_measure(const bp_copy *cp, uint64_t size, uint64_t n, unsigned reps,
                double *gbps_p, char *why, size_t why_len)
{
    double g[64];
    tp_error *err = NULL;
    int sd = cp->cp_src.type == TP_DEVICE_CUDA ? cp->cp_src.index : -1;
    int dd = cp->cp_dst.type == TP_DEVICE_CUDA ? cp->cp_dst.index : -1;
    for (unsigned r = 0; r <= reps; r++) {
        uint64_t t0 = tp__now_ns();
        for (uint64_t i = 0; i < (r == 0 ? 1 : n); i++) { // r 0: warm-up
            if (tp__cuda_copy(cp->cp_dbuf, dd, cp->cp_sbuf, sd, (size_t)size,
                              &err) != TP_OK) {
                snprintf(why, why_len, "%s of %llu bytes: %s", cp->cp_test,
                         (unsigned long long)size, tp_error_message(err));
                tp_error_unref(err);
                return false;
            }
        }
        uint64_t dt = tp__now_ns() - t0;
        if (r > 0) {
            g[r - 1] = (double)size * (double)n / (double)(dt ? dt : 1);
        }
    }
    *gbps_p = tool_median(g, reps);
    return true;
}

bool
bp_dev_baseline(const bp_opts *o, bench_out *out)
{
    tp_device src = o->bo_src, dst = o->bo_dst;
    bp_copy cps[2];
    size_t ncp = 0;
    if (o->bo_connect != NULL || o->bo_launched) {
        // The destination device is the other host's: only this side's
        // source device is measured here.
        if (src.type != TP_DEVICE_CUDA) {
            fflush(stdout);
            fprintf(stderr,
                    "tpipe: bench pipe: --device %s: no cudaMemcpy baseline "
                    "here (this side's tensors are on the CPU; the CUDA "
                    "device is the server's)\n",
                    o->bo_device);
            return true;
        }
        dst = dst.type == TP_DEVICE_CUDA ? src : dst;
    }
    if (src.type == TP_DEVICE_CUDA && dst.type == TP_DEVICE_CUDA) {
        cps[ncp++] = (bp_copy){"copy_d2d", src, dst, NULL, NULL};
    } else {
        tp_device cu = src.type == TP_DEVICE_CUDA ? src : dst;
        cps[ncp++] = (bp_copy){"copy_d2d", cu, cu, NULL, NULL};
        cps[ncp++] =
            (bp_copy){src.type == TP_DEVICE_CUDA ? "copy_d2h" : "copy_h2d", src,
                      dst, NULL, NULL};
    }
    // The median of at least 5 timings, each of enough copies to move
    // 64 MiB (2..1000 copies).
    unsigned reps = o->bo_com.bo_reps < 5 ? 5 : o->bo_com.bo_reps;
    reps = reps > 64 ? 64 : reps;
    char why[1024] = "";
    bool ok = true;
    for (size_t k = 0; k < ncp && ok; k++) {
        bp_copy *cp = &cps[k];
        cp->cp_sbuf =
            bp_copy_buf(cp->cp_src, o->bo_com.bo_max_size, why, sizeof(why));
        cp->cp_dbuf = cp->cp_sbuf == NULL
                          ? NULL
                          : bp_copy_buf(cp->cp_dst, o->bo_com.bo_max_size, why,
                                        sizeof(why));
        ok = cp->cp_dbuf != NULL;
    }
    for (size_t i = 0; i < o->bo_com.bo_nsizes && ok; i++) {
        uint64_t size = o->bo_com.bo_sizes[i];
        uint64_t n = (64u << 20) / size;
        n = n < 2 ? 2 : n > 1000 ? 1000 : n;
        for (size_t k = 0; k < ncp && ok; k++) {
            double gbps = NAN;
            ok = bp_copy_measure(&cps[k], size, n, reps, &gbps, why,
                                 sizeof(why));
            if (ok) {
                bp_print_copy(out, o, cps[k].cp_test, cps[k].cp_src,
                              cps[k].cp_dst, size, gbps, n * reps, reps);
            }
        }
    }
    for (size_t k = 0; k < ncp; k++) {
        bp_copy_free(cps[k].cp_src, cps[k].cp_sbuf);
        bp_copy_free(cps[k].cp_dst, cps[k].cp_dbuf);
    }
    if (!ok) {
        fflush(stdout);
        tool_err("bench pipe: --device %s: cudaMemcpy baseline: %s",
                 o->bo_device, why);
    }
    return ok;
}
