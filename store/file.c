// SPDX-License-Identifier: Apache-2.0
// file.c - the file store, "file:///PATH": one shared file holding a log
// of records, appended under an exclusive fcntl OFD lock (per open file,
// so two stores in one process exclude each other too). Each store keeps
// a replica of the keys (an engine) and the offset it has read up to; every
// operation takes the lock, applies the records appended since, then acts.
// Blocking operations (get, wait) poll the file with a growing sleep
// (1 ms to 50 ms) until the deadline; taking the lock is bounded by the
// deadline too (F_OFD_SETLK retried).
//
// Record (little-endian): u8 type (1 set, 2 delete), u32 key length
// (1..4096), key bytes, u64 value length (<= TP_STORE_MAX_VALUE; 0 for
// delete), value bytes. A record out of bounds is TP_EPROTO naming the
// offset. The file is never truncated or removed by the store.

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/wire.h"
#include "core/alloc.h"
#include "store_int.h"
#include "tcp_io.h"

#define REC_SET 1
#define REC_DEL 2

typedef struct file_store {
    int f_fd;
    int64_t f_max_value;
    uint64_t f_pos; // bytes of the file applied to f_kv
    tp__kv f_kv;
} file_store;

tp_status
tp__store_file_open(const char *path, int64_t max_value, void **impl_p,
                    tp_error **err_p)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "open");
    }
    file_store *f = tp__zalloc(sizeof(*f));
    if (f == NULL) {
        close(fd);
        return tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    f->f_fd = fd;
    f->f_max_value = max_value;
    tp__kv_init(&f->f_kv);
    *impl_p = f;
    return TP_OK;
}

static void
file_close(void *impl)
{
    file_store *f = impl;
    close(f->f_fd);
    tp__kv_fini(&f->f_kv);
    tp__free(f);
}

static tp_status
file_lock(file_store *f, short type, uint64_t deadline_ns, tp_error **err_p)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET};
    uint64_t nap = 1;
    for (;;) {
        if (fcntl(f->f_fd, F_OFD_SETLK, &fl) == 0) {
            return TP_OK;
        }
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) {
            return tp__error_errno(err_p, errno, "fcntl lock");
        }
        if (tp__now_ns() >= deadline_ns) {
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "the file lock stayed held by another "
                                 "process");
        }
        tp__io_sleep_ms(nap);
        nap = nap * 2 > 50 ? 50 : nap * 2;
    }
}

static void
file_unlock(file_store *f)
{
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET};
    fcntl(f->f_fd, F_OFD_SETLK, &fl);
}

static tp_status
file_corrupt(uint64_t off, const char *what, tp_error **err_p)
{
    return tp__error_set(err_p, TP_EPROTO,
                         "malformed record at offset %llu: %s",
                         (unsigned long long)off, what);
}

// Forgets the replica; the next sync reads the whole file again.
static void
file_reset(file_store *f)
{
    tp__kv_fini(&f->f_kv);
    tp__kv_init(&f->f_kv);
    f->f_pos = 0;
}

// Applies the records appended since f_pos. Lock held.
static tp_status
file_sync_locked(file_store *f, tp_error **err_p)
{
    struct stat sb;
    if (fstat(f->f_fd, &sb) != 0) {
        return tp__error_errno(err_p, errno, "fstat");
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < f->f_pos) {
        file_reset(f); // someone truncated the file: start over
    }
    if (size == f->f_pos) {
        return TP_OK;
    }
    size_t n = (size_t)(size - f->f_pos);
    uint8_t *buf = tp__alloc(n);
    if (buf == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    tp_status st = TP_OK;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(f->f_fd, buf + got, n - got, (off_t)(f->f_pos + got));
        if (r <= 0) {
            if (r < 0 && errno == EINTR) {
                continue;
            }
            st = r < 0 ? tp__error_errno(err_p, errno, "read")
                       : file_corrupt(f->f_pos + got, "file shrank", err_p);
            goto out;
        }
        got += (size_t)r;
    }
    size_t p = 0;
    char key[TP_STORE_MAX_KEY + 1];
    while (p < n) {
        uint64_t at = f->f_pos + p;
        if (n - p < 5) {
            st = file_corrupt(at, "truncated header", err_p);
            goto out;
        }
        uint8_t type = buf[p];
        uint32_t kl = tp__get_u32le(buf + p + 1);
        if ((type != REC_SET && type != REC_DEL) || kl == 0 ||
            kl > TP_STORE_MAX_KEY || n - p - 5 < (size_t)kl + 8) {
            st = file_corrupt(at, "bad type or key length", err_p);
            goto out;
        }
        memcpy(key, buf + p + 5, kl);
        key[kl] = 0;
        uint64_t vl = tp__get_u64le(buf + p + 5 + kl);
        size_t hdr = 5 + (size_t)kl + 8;
        if (vl > (uint64_t)f->f_max_value || vl > n - p - hdr ||
            strlen(key) != kl) {
            st = file_corrupt(at, "bad value length or key", err_p);
            goto out;
        }
        if (type == REC_SET) {
            st = tp__kv_set(&f->f_kv, key, buf + p + hdr, (size_t)vl, err_p);
            if (st != TP_OK) {
                goto out;
            }
        } else {
            bool d;
            tp__kv_delete(&f->f_kv, key, &d);
        }
        p += hdr + (size_t)vl;
    }
    f->f_pos = size;
out:
    tp__free(buf);
    return st;
}

// Appends a record and applies it. Lock held, synced.
static tp_status
file_append_locked(file_store *f, int type, const char *key, const void *v,
                   size_t vl, tp_error **err_p)
{
    size_t kl = strlen(key);
    size_t n = 5 + kl + 8 + vl;
    uint8_t *b = tp__alloc(n);
    if (b == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    b[0] = (uint8_t)type;
    tp__put_u32le(b + 1, (uint32_t)kl);
    memcpy(b + 5, key, kl);
    tp__put_u64le(b + 5 + kl, (uint64_t)vl);
    if (vl > 0) {
        memcpy(b + 5 + kl + 8, v, vl);
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w =
            pwrite(f->f_fd, b + done, n - done, (off_t)(f->f_pos + done));
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            tp__free(b);
            return tp__error_errno(err_p, errno, "write");
        }
        done += (size_t)w;
    }
    tp__free(b);
    f->f_pos += n;
    if (type == REC_SET) {
        return tp__kv_set(&f->f_kv, key, v, vl, err_p);
    }
    bool d;
    return tp__kv_delete(&f->f_kv, key, &d);
}

static tp_status
file_begin(file_store *f, uint64_t deadline_ns, tp_error **err_p)
{
    tp_status st = file_lock(f, F_WRLCK, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = file_sync_locked(f, err_p);
    if (st != TP_OK) {
        file_unlock(f);
    }
    return st;
}

static tp_status
file_set(void *impl, const char *key, const void *val, size_t len,
         int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = file_append_locked(f, REC_SET, key, val, len, err_p);
    file_unlock(f);
    return st;
}

// Polls until @keys are all set (and, for @val_p, copies the first).
static tp_status
file_poll(file_store *f, const char *const *keys, size_t n,
          uint64_t deadline_ns, uint8_t **val_p, size_t *len_p,
          tp_error **err_p)
{
    uint64_t nap = 1;
    for (;;) {
        tp_status st = file_begin(f, deadline_ns, err_p);
        if (st != TP_OK) {
            return st;
        }
        file_unlock(f);
        // The replica answers without waiting (deadline 0 = now).
        tp_error *e = NULL;
        if (val_p != NULL) {
            st = tp__kv_get(&f->f_kv, keys[0], 0, val_p, len_p, &e);
        } else {
            st = tp__kv_wait(&f->f_kv, keys, n, 0, &e);
        }
        if (st != TP_ETIMEDOUT || tp__now_ns() >= deadline_ns) {
            if (err_p != NULL) {
                *err_p = e;
            } else {
                tp_error_unref(e);
            }
            return st;
        }
        tp_error_unref(e);
        tp__io_sleep_ms(nap);
        nap = nap * 2 > 50 ? 50 : nap * 2;
    }
}

static tp_status
file_get(void *impl, const char *key, int64_t timeout_ms, uint64_t deadline_ns,
         uint8_t **val_p, size_t *len_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    return file_poll(impl, &key, 1, deadline_ns, val_p, len_p, err_p);
}

static tp_status
file_wait(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
          uint64_t deadline_ns, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    return file_poll(impl, keys, n, deadline_ns, NULL, NULL, err_p);
}

static tp_status
file_add(void *impl, const char *key, int64_t delta, int64_t timeout_ms,
         uint64_t deadline_ns, int64_t *value_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t nv = 0;
    // Compute on the replica, then log the resulting value.
    st = tp__kv_add(&f->f_kv, key, delta, &nv, err_p);
    if (st == TP_OK) {
        char buf[32];
        int n = snprintf(buf, sizeof(buf), "%lld", (long long)nv);
        st = file_append_locked(f, REC_SET, key, buf, (size_t)n, err_p);
        if (st != TP_OK) {
            file_reset(f); // the replica ran ahead of the file
        }
    }
    file_unlock(f);
    if (st == TP_OK) {
        *value_p = nv;
    }
    return st;
}

static tp_status
file_compare_set(void *impl, const char *key, const void *exp, size_t elen,
                 const void *des, size_t dlen, int64_t timeout_ms,
                 uint64_t deadline_ns, uint8_t **val_p, size_t *len_p,
                 tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    uint8_t *before = NULL;
    size_t blen = 0;
    tp_status had = tp__kv_get(&f->f_kv, key, 0, &before, &blen, NULL);
    st = tp__kv_compare_set(&f->f_kv, key, exp, elen, des, dlen, val_p, len_p,
                            err_p);
    // A set happened iff the replica's value matched: log it.
    bool set = st == TP_OK && ((had != TP_OK && elen == 0) ||
                               (had == TP_OK && elen == blen &&
                                (elen == 0 || memcmp(before, exp, elen) == 0)));
    if (set) {
        st = file_append_locked(f, REC_SET, key, des, dlen, err_p);
        if (st != TP_OK) {
            tp__free(*val_p);
            file_reset(f); // the replica ran ahead of the file
        }
    }
    tp__free(before);
    file_unlock(f);
    return st;
}

static tp_status
file_delete(void *impl, const char *key, int64_t timeout_ms,
            uint64_t deadline_ns, bool *deleted_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    uint8_t *v = NULL;
    size_t n;
    bool had = tp__kv_get(&f->f_kv, key, 0, &v, &n, NULL) == TP_OK;
    tp__free(v);
    if (had) {
        st = file_append_locked(f, REC_DEL, key, NULL, 0, err_p);
    }
    file_unlock(f);
    *deleted_p = had && st == TP_OK;
    return st;
}

static tp_status
file_delete_prefix(void *impl, const char *prefix, int64_t timeout_ms,
                   uint64_t deadline_ns, int64_t *n_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    char **keys = NULL;
    size_t n = 0;
    int64_t done = 0;
    st = tp__kv_prefix_keys(&f->f_kv, prefix, &keys, &n);
    if (st != TP_OK) {
        st = tp__error_set(err_p, st, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (st == TP_OK) {
            st = file_append_locked(f, REC_DEL, keys[i], NULL, 0, err_p);
            done += st == TP_OK;
        }
        tp__free(keys[i]);
    }
    tp__free(keys);
    file_unlock(f);
    *n_p = done;
    return st;
}

static tp_status
file_num_keys(void *impl, int64_t timeout_ms, uint64_t deadline_ns,
              int64_t *n_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    file_unlock(f);
    *n_p = tp__kv_num_keys(&f->f_kv);
    return TP_OK;
}

static tp_status
file_append(void *impl, const char *key, const void *val, size_t len,
            int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    // Computed on the replica under the lock, logged as a set of the
    // whole value.
    st = tp__kv_append(&f->f_kv, key, val, len, f->f_max_value, err_p);
    uint8_t *v = NULL;
    size_t n = 0;
    if (st == TP_OK) {
        st = tp__kv_get(&f->f_kv, key, 0, &v, &n, err_p);
    }
    if (st == TP_OK) {
        st = file_append_locked(f, REC_SET, key, v, n, err_p);
        if (st != TP_OK) {
            file_reset(f); // the replica ran ahead of the file
        }
    }
    tp__free(v);
    file_unlock(f);
    return st;
}

static tp_status
file_check(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
           uint64_t deadline_ns, bool *all_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    file_store *f = impl;
    tp_status st = file_begin(f, deadline_ns, err_p);
    if (st != TP_OK) {
        return st;
    }
    file_unlock(f);
    *all_p = tp__kv_check(&f->f_kv, keys, n);
    return TP_OK;
}

const tp__store_ops tp__store_file_ops = {
    .so_set = file_set,
    .so_get = file_get,
    .so_add = file_add,
    .so_wait = file_wait,
    .so_compare_set = file_compare_set,
    .so_delete = file_delete,
    .so_delete_prefix = file_delete_prefix,
    .so_num_keys = file_num_keys,
    .so_append = file_append,
    .so_check = file_check,
    .so_close = file_close,
};
