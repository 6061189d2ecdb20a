// SPDX-License-Identifier: Apache-2.0
// slurm.c - env:// under Slurm without MASTER_ADDR/MASTER_PORT: rank 0's
// host is the first of the step's (or job's) node list, a hostlist
// expression such as "gpu-[001-004]-ib,login1", and the port is derived
// from the job id, so that every task computes the same address alone.

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

#define SLURM_HOST_MAX 256 // a host name and its NUL

typedef struct slurm_walk {
    const char *w_list; // the whole list, for messages
    tp__slurm_host_fn w_fn;
    void *w_arg;
    bool w_stopped; // @w_fn returned false: keep checking, stop calling
    size_t w_count;
} slurm_walk;

static tp_status
slurm_bad(slurm_walk *w, tp_error **err_p, const char *why)
{
    return tp__error_set(err_p, TP_EINVAL, "slurm node list \"%s\": %s",
                         w->w_list, why);
}

// Expands @p..@end (one item of the list, no top-level comma) after the
// @olen bytes already in @out.
static tp_status
slurm_expand(slurm_walk *w, const char *p, const char *end, char *out,
             size_t olen, tp_error **err_p)
{
    const char *lb = memchr(p, '[', (size_t)(end - p));
    const char *stop = lb ? lb : end;
    if (memchr(p, ']', (size_t)(stop - p)) != NULL) {
        return slurm_bad(w, err_p, "\"]\" without \"[\"");
    }
    size_t plen = (size_t)(stop - p);
    if (olen + plen >= SLURM_HOST_MAX) {
        return slurm_bad(w, err_p, "a host name longer than 255 bytes");
    }
    memcpy(out + olen, p, plen);
    olen += plen;
    if (lb == NULL) {
        out[olen] = '\0';
        if (olen == 0) {
            return slurm_bad(w, err_p, "an empty host name");
        }
        if (++w->w_count > TP__SLURM_MAX_HOSTS) {
            return slurm_bad(w, err_p, "more than 1000000 hosts");
        }
        if (!w->w_stopped && !w->w_fn(w->w_arg, out)) {
            w->w_stopped = true;
        }
        return TP_OK;
    }
    const char *rb = memchr(lb, ']', (size_t)(end - lb));
    if (rb == NULL) {
        return slurm_bad(w, err_p, "unclosed \"[\"");
    }
    if (memchr(lb + 1, '[', (size_t)(rb - lb - 1)) != NULL) {
        return slurm_bad(w, err_p, "nested \"[\"");
    }
    if (rb == lb + 1) {
        return slurm_bad(w, err_p, "an empty range \"[]\"");
    }
    // Ranges: "lo" or "lo-hi", comma separated; lo's digit count is the
    // width (zero padding) of every number of that range.
    const char *q = lb + 1;
    while (q < rb) {
        const char *d = q;
        while (q < rb && *q >= '0' && *q <= '9') {
            q++;
        }
        size_t width = (size_t)(q - d);
        if (width == 0 || width > 18) {
            return slurm_bad(w, err_p,
                             width ? "a number with more than 18 digits"
                                   : "a range that is not a number or "
                                     "LOW-HIGH");
        }
        unsigned long long lo = strtoull(d, NULL, 10), hi = lo;
        if (q < rb && *q == '-') {
            const char *h = ++q;
            while (q < rb && *q >= '0' && *q <= '9') {
                q++;
            }
            if (q == h || q - h > 18) {
                return slurm_bad(w, err_p, "a range LOW-HIGH without a HIGH");
            }
            hi = strtoull(h, NULL, 10);
            if (hi < lo) {
                return slurm_bad(w, err_p, "a descending range");
            }
        }
        if (q < rb && *q != ',') {
            return slurm_bad(w, err_p,
                             "a range that is not a number or LOW-HIGH");
        }
        if (q < rb && q + 1 == rb) {
            return slurm_bad(w, err_p, "a range list ending in \",\"");
        }
        if (hi - lo >= TP__SLURM_MAX_HOSTS) {
            return slurm_bad(w, err_p, "more than 1000000 hosts");
        }
        for (unsigned long long v = lo; v <= hi; v++) {
            char num[32];
            int nl = snprintf(num, sizeof(num), "%0*llu", (int)width, v);
            if (olen + (size_t)nl >= SLURM_HOST_MAX) {
                return slurm_bad(w, err_p, "a host name longer than 255 bytes");
            }
            memcpy(out + olen, num, (size_t)nl);
            tp_status st =
                slurm_expand(w, rb + 1, end, out, olen + (size_t)nl, err_p);
            if (st != TP_OK) {
                return st;
            }
        }
        if (q < rb) {
            q++; // the comma
        }
    }
    return TP_OK;
}

tp_status
tp__slurm_nodelist_visit(const char *list, tp__slurm_host_fn fn, void *arg,
                         tp_error **err_p)
{
    slurm_walk w = {.w_list = list, .w_fn = fn, .w_arg = arg};
    if (*list == '\0') {
        return slurm_bad(&w, err_p, "empty");
    }
    char out[SLURM_HOST_MAX];
    const char *item = list;
    int depth = 0;
    for (const char *p = list;; p++) {
        if (*p == ' ' || *p == '\t' || *p == '\n') {
            return slurm_bad(&w, err_p, "white space");
        }
        if (*p == '[') {
            depth++;
        } else if (*p == ']' && depth > 0) {
            depth--;
        }
        if (*p == '\0' || (*p == ',' && depth == 0)) {
            if (p == item) {
                return slurm_bad(&w, err_p, "an empty host name");
            }
            tp_status st = slurm_expand(&w, item, p, out, 0, err_p);
            if (st != TP_OK) {
                return st;
            }
            if (*p == '\0') {
                return TP_OK;
            }
            item = p + 1;
        }
    }
}

typedef struct slurm_first {
    char *f_buf;
    size_t f_len;
    bool f_fits;
} slurm_first;

static bool
slurm_first_cb(void *arg, const char *host)
{
    slurm_first *f = arg;
    f->f_fits = strlen(host) < f->f_len;
    if (f->f_fits) {
        strcpy(f->f_buf, host);
    }
    return false;
}

tp_status
tp__slurm_first_host(const char *list, char *buf, size_t len, tp_error **err_p)
{
    slurm_first f = {.f_buf = buf, .f_len = len};
    tp_status st = tp__slurm_nodelist_visit(list, slurm_first_cb, &f, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (!f.f_fits) {
        return tp__error_set(err_p, TP_EINVAL,
                             "slurm node list \"%s\": the first host does "
                             "not fit %zu bytes",
                             list, len);
    }
    return TP_OK;
}

unsigned
tp__slurm_port(uint64_t job_id)
{
    return TP__SLURM_PORT_BASE + (unsigned)(job_id % TP__SLURM_PORT_SPAN);
}

static const char *
slurm_env(const char *const *names, size_t n, const char **name_p)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = getenv(names[i]);
        if (v != NULL && *v != '\0') {
            *name_p = names[i];
            return v;
        }
    }
    return NULL;
}

tp_status
tp__slurm_master(char *host, size_t hlen, char *port, size_t plen,
                 bool *found_p, tp_error **err_p)
{
    // The step's list first: rank 0 of a step that runs on part of the
    // allocation is on the step's first node, not the job's.
    static const char *const lists[] = {"SLURM_STEP_NODELIST",
                                        "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
    static const char *const ids[] = {"SLURM_JOB_ID", "SLURM_JOBID"};
    const char *lname = NULL, *iname = NULL;
    const char *list = slurm_env(lists, 3, &lname);
    const char *id = slurm_env(ids, 2, &iname);
    if (list == NULL || id == NULL) {
        *found_p = false;
        return TP_OK;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long jid = strtoull(id, &end, 10);
    if (errno != 0 || *end != '\0' || id[0] < '0' || id[0] > '9') {
        return tp__error_set(err_p, TP_EINVAL,
                             "env://: %s=%s is not a job id (a number)", iname,
                             id);
    }
    if (host[0] == '\0') {
        tp_status st = tp__slurm_first_host(list, host, hlen, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "env://: %s", lname);
        }
    }
    if (port[0] == '\0') {
        snprintf(port, plen, "%u", tp__slurm_port(jid));
    }
    *found_p = true;
    return TP_OK;
}
