// SPDX-License-Identifier: Apache-2.0
// error.c - refcounted, immutable error objects.
//
// An error's message is built once, at creation, and includes the messages
// of its causes, so tp_error_message() is the whole story in one line.

#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"

struct tp_error {
    _Atomic long e_refs; // < 0: static, never freed
    tp_status e_status;
    int e_errno;
    tp_error *e_cause;
    char *e_msg;
};

static tp_error error_nomem = {
    .e_refs = -1,
    .e_status = TP_ENOMEM,
    .e_errno = ENOMEM,
    .e_cause = NULL,
    .e_msg = "out of memory",
};

tp_error *
tp__error_nomem(void)
{
    return &error_nomem;
}

tp_status
tp_error_status(const tp_error *err)
{
    return err ? err->e_status : TP_OK;
}

int
tp_error_errno(const tp_error *err)
{
    return err ? err->e_errno : 0;
}

const char *
tp_error_message(const tp_error *err)
{
    return err ? err->e_msg : "success";
}

const tp_error *
tp_error_cause(const tp_error *err)
{
    return err ? err->e_cause : NULL;
}

tp_error *
tp_error_ref(const tp_error *cerr)
{
    tp_error *err = (tp_error *)cerr;
    if (err != NULL &&
        atomic_load_explicit(&err->e_refs, memory_order_relaxed) >= 0) {
        atomic_fetch_add_explicit(&err->e_refs, 1, memory_order_relaxed);
    }
    return err;
}

void
tp_error_unref(tp_error *err)
{
    while (err != NULL) {
        if (atomic_load_explicit(&err->e_refs, memory_order_relaxed) < 0) {
            return;
        }
        if (atomic_fetch_sub_explicit(&err->e_refs, 1, memory_order_acq_rel) !=
            1) {
            return;
        }
        tp_error *cause = err->e_cause;
        tp__free(err->e_msg);
        tp__free(err);
        err = cause; // drop our reference to the cause, iteratively
    }
}

static tp_error *
error_vnew(tp_status st, int errnum, const tp_error *cause, const char *suffix,
           const char *fmt, va_list ap)
{
    char buf[1024];
    if (vsnprintf(buf, sizeof(buf), fmt, ap) < 0) {
        buf[0] = '\0';
    }
    tp_error *err = tp__zalloc(sizeof(*err));
    if (err == NULL) {
        return &error_nomem;
    }
    if (cause != NULL) {
        err->e_msg =
            tp__asprintf("%s%s: %s", buf, suffix ? suffix : "", cause->e_msg);
    } else {
        err->e_msg = tp__asprintf("%s%s", buf, suffix ? suffix : "");
    }
    if (err->e_msg == NULL) {
        tp__free(err);
        return &error_nomem;
    }
    atomic_init(&err->e_refs, 1);
    err->e_status = st;
    err->e_errno = errnum;
    err->e_cause = tp_error_ref(cause);
    return err;
}

tp_error *
tp__error_new(tp_status st, int errnum, const tp_error *cause, const char *fmt,
              ...)
{
    va_list ap;
    va_start(ap, fmt);
    tp_error *err = error_vnew(st, errnum, cause, NULL, fmt, ap);
    va_end(ap);
    return err;
}

tp_error *
tp_error_create(tp_status st, const tp_error *cause, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tp_error *err = error_vnew(st, 0, cause, NULL, fmt, ap);
    va_end(ap);
    return err;
}

tp_status
tp__error_set(tp_error **err_p, tp_status st, const char *fmt, ...)
{
    if (err_p != NULL) {
        va_list ap;
        va_start(ap, fmt);
        *err_p = error_vnew(st, 0, NULL, NULL, fmt, ap);
        va_end(ap);
    }
    return st;
}

tp_status
tp__error_errno(tp_error **err_p, int errnum, const char *fmt, ...)
{
    tp_status st = tp__status_from_errno(errnum);
    if (err_p != NULL) {
        // Messages are lowercase: "address already in use (EADDRINUSE)".
        char suffix[160];
        snprintf(suffix, sizeof(suffix), ": %s (%s)", strerror(errnum),
                 tp__errno_name(errnum));
        if (suffix[2] >= 'A' && suffix[2] <= 'Z' &&
            !(suffix[3] >= 'A' && suffix[3] <= 'Z')) {
            suffix[2] = (char)(suffix[2] - 'A' + 'a');
        }
        va_list ap;
        va_start(ap, fmt);
        *err_p = error_vnew(st, errnum, NULL, suffix, fmt, ap);
        va_end(ap);
    }
    return st;
}

tp_status
tp__error_wrap(tp_error **err_p, tp_status st, const char *fmt, ...)
{
    if (err_p == NULL || *err_p == NULL) {
        return st;
    }
    tp_error *cause = *err_p;
    va_list ap;
    va_start(ap, fmt);
    tp_error *err =
        error_vnew(cause->e_status, cause->e_errno, cause, NULL, fmt, ap);
    va_end(ap);
    tp_error_unref(cause);
    *err_p = err;
    return err->e_status;
}

tp_status
tp__status_from_errno(int errnum)
{
    switch (errnum) {
    case 0:
        return TP_OK;
    case EINVAL:
    case EBADF:
    case EAFNOSUPPORT:
        return TP_EINVAL;
    case ENOMEM:
    case ENOBUFS:
        return TP_ENOMEM;
    case ETIMEDOUT:
        return TP_ETIMEDOUT;
    case ECANCELED:
        return TP_ECANCELED;
    case ENOSYS:
    case EOPNOTSUPP:
        return TP_ENOTSUP;
    case EAGAIN:
        return TP_EAGAIN;
    case EADDRINUSE:
    case EADDRNOTAVAIL:
        return TP_EADDRINUSE;
    case EPERM:
    case EACCES:
        return TP_EPERM;
    case ENOENT:
    case ENODEV:
        return TP_ENOENT;
    case ECONNREFUSED:
        return TP_ECONNREFUSED;
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
    case ESHUTDOWN:
        return TP_ECONNRESET;
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
        return TP_EUNREACHABLE;
    case EPROTO:
        return TP_EPROTO;
    default:
        return TP_EIO;
    }
}

static const struct {
    int num;
    const char *name;
} errno_names[] = {
#define E(x)                                                                   \
    {                                                                          \
        x, #x                                                                  \
    }
    E(EPERM),        E(ENOENT),       E(EINTR),        E(EIO),
    E(EBADF),        E(EAGAIN),       E(ENOMEM),       E(EACCES),
    E(EFAULT),       E(EBUSY),        E(EEXIST),       E(ENODEV),
    E(EINVAL),       E(EMFILE),       E(ENFILE),       E(ENOSPC),
    E(EPIPE),        E(ENOSYS),       E(EPROTO),       E(EMSGSIZE),
    E(EOPNOTSUPP),   E(EAFNOSUPPORT), E(EADDRINUSE),   E(EADDRNOTAVAIL),
    E(ENETDOWN),     E(ENETUNREACH),  E(ECONNABORTED), E(ECONNRESET),
    E(ENOBUFS),      E(ENOTCONN),     E(ESHUTDOWN),    E(ETIMEDOUT),
    E(ECONNREFUSED), E(EHOSTDOWN),    E(EHOSTUNREACH), E(EINPROGRESS),
    E(ECANCELED),
#undef E
};

const char *
tp__errno_name(int errnum)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(errno_names); i++) {
        if (errno_names[i].num == errnum) {
            return errno_names[i].name;
        }
    }
    return "E?";
}

static const struct {
    tp_status st;
    const char *name;
    const char *desc;
} status_table[] = {
    {TP_OK, "TP_OK", "success"},
    {TP_EINVAL, "TP_EINVAL", "invalid argument"},
    {TP_ENOMEM, "TP_ENOMEM", "out of memory"},
    {TP_ETIMEDOUT, "TP_ETIMEDOUT", "timed out"},
    {TP_ECANCELED, "TP_ECANCELED", "canceled"},
    {TP_ENOTSUP, "TP_ENOTSUP", "not supported"},
    {TP_EAGAIN, "TP_EAGAIN", "try again"},
    {TP_EADDRINUSE, "TP_EADDRINUSE", "address in use or not available"},
    {TP_EPERM, "TP_EPERM", "permission denied"},
    {TP_EIO, "TP_EIO", "i/o error"},
    {TP_ENOENT, "TP_ENOENT", "not found"},
    {TP_ECONNREFUSED, "TP_ECONNREFUSED", "connection refused"},
    {TP_ECONNRESET, "TP_ECONNRESET", "connection reset"},
    {TP_ECLOSED, "TP_ECLOSED", "closed"},
    {TP_EPROTO, "TP_EPROTO", "protocol error"},
    {TP_EREMOTE, "TP_EREMOTE", "remote error"},
    {TP_EUNREACHABLE, "TP_EUNREACHABLE", "unreachable"},
    {TP_EINTERNAL, "TP_EINTERNAL", "internal error"},
    {TP_EDEVICE, "TP_EDEVICE", "device error"},
};

const char *
tp_status_name(tp_status s)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(status_table); i++) {
        if (status_table[i].st == s) {
            return status_table[i].name;
        }
    }
    return "TP_E?";
}

const char *
tp_status_describe(tp_status s)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(status_table); i++) {
        if (status_table[i].st == s) {
            return status_table[i].desc;
        }
    }
    return "unknown status";
}
