// SPDX-License-Identifier: Apache-2.0
// mem.c - the in-process store, "mem://NAME": stores opened with the same
// NAME in one process share one engine (refcounted, in a global list).
//
// Lock order: mem_mtx (the list) before an engine's kv_mtx (never nested in
// practice: the list lock is released before using the engine).

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "store_int.h"

typedef struct mem_store {
    struct mem_store *m_next;
    char *m_name;
    int m_refs; // under mem_mtx
    tp__kv m_kv;
} mem_store;

static pthread_mutex_t mem_mtx = PTHREAD_MUTEX_INITIALIZER;
static mem_store *mem_list;

tp_status
tp__store_mem_open(const char *name, void **impl_p, tp_error **err_p)
{
    pthread_mutex_lock(&mem_mtx);
    mem_store *m = mem_list;
    while (m != NULL && strcmp(m->m_name, name) != 0) {
        m = m->m_next;
    }
    if (m == NULL) {
        m = tp__zalloc(sizeof(*m));
        char *nm = tp__strdup(name);
        if (m == NULL || nm == NULL) {
            tp__free(m);
            tp__free(nm);
            pthread_mutex_unlock(&mem_mtx);
            return tp__error_set(err_p, TP_ENOMEM, "out of memory");
        }
        m->m_name = nm;
        tp__kv_init(&m->m_kv);
        m->m_next = mem_list;
        mem_list = m;
    }
    m->m_refs++;
    pthread_mutex_unlock(&mem_mtx);
    *impl_p = m;
    return TP_OK;
}

static void
mem_close(void *impl)
{
    mem_store *m = impl;
    pthread_mutex_lock(&mem_mtx);
    bool last = --m->m_refs == 0;
    if (last) {
        mem_store **pp = &mem_list;
        while (*pp != m) {
            pp = &(*pp)->m_next;
        }
        *pp = m->m_next;
    }
    pthread_mutex_unlock(&mem_mtx);
    if (last) {
        tp__kv_fini(&m->m_kv);
        tp__free(m->m_name);
        tp__free(m);
    }
}

static tp_status
mem_set(void *impl, const char *key, const void *val, size_t len,
        int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    return tp__kv_set(&((mem_store *)impl)->m_kv, key, val, len, err_p);
}

static tp_status
mem_get(void *impl, const char *key, int64_t timeout_ms, uint64_t deadline_ns,
        uint8_t **val_p, size_t *len_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    return tp__kv_get(&((mem_store *)impl)->m_kv, key, deadline_ns, val_p,
                      len_p, err_p);
}

static tp_status
mem_add(void *impl, const char *key, int64_t delta, int64_t timeout_ms,
        uint64_t deadline_ns, int64_t *value_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    return tp__kv_add(&((mem_store *)impl)->m_kv, key, delta, value_p, err_p);
}

static tp_status
mem_wait(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
         uint64_t deadline_ns, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    return tp__kv_wait(&((mem_store *)impl)->m_kv, keys, n, deadline_ns, err_p);
}

static tp_status
mem_compare_set(void *impl, const char *key, const void *exp, size_t elen,
                const void *des, size_t dlen, int64_t timeout_ms,
                uint64_t deadline_ns, uint8_t **val_p, size_t *len_p,
                tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    return tp__kv_compare_set(&((mem_store *)impl)->m_kv, key, exp, elen, des,
                              dlen, val_p, len_p, err_p);
}

static tp_status
mem_delete_prefix(void *impl, const char *prefix, int64_t timeout_ms,
                  uint64_t deadline_ns, int64_t *n_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    TP_UNUSED(err_p);
    tp__kv_delete_prefix(&((mem_store *)impl)->m_kv, prefix, n_p);
    return TP_OK;
}

static tp_status
mem_delete(void *impl, const char *key, int64_t timeout_ms,
           uint64_t deadline_ns, bool *deleted_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    TP_UNUSED(err_p);
    return tp__kv_delete(&((mem_store *)impl)->m_kv, key, deleted_p);
}

static tp_status
mem_num_keys(void *impl, int64_t timeout_ms, uint64_t deadline_ns, int64_t *n_p,
             tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    TP_UNUSED(err_p);
    *n_p = tp__kv_num_keys(&((mem_store *)impl)->m_kv);
    return TP_OK;
}

static tp_status
mem_append(void *impl, const char *key, const void *val, size_t len,
           int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    return tp__kv_append(&((mem_store *)impl)->m_kv, key, val, len, 0, err_p);
}

static tp_status
mem_check(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
          uint64_t deadline_ns, bool *all_p, tp_error **err_p)
{
    TP_UNUSED(timeout_ms);
    TP_UNUSED(deadline_ns);
    TP_UNUSED(err_p);
    *all_p = tp__kv_check(&((mem_store *)impl)->m_kv, keys, n);
    return TP_OK;
}

const tp__store_ops tp__store_mem_ops = {
    .so_set = mem_set,
    .so_get = mem_get,
    .so_add = mem_add,
    .so_wait = mem_wait,
    .so_compare_set = mem_compare_set,
    .so_delete = mem_delete,
    .so_delete_prefix = mem_delete_prefix,
    .so_num_keys = mem_num_keys,
    .so_append = mem_append,
    .so_check = mem_check,
    .so_close = mem_close,
};
