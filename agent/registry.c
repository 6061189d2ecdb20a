// SPDX-License-Identifier: Apache-2.0
// registry.c - the process's registered RPC functions, by XXH3-64 id.
//
// Registration is rare and lookups are on every request: the table is a
// fixed array of atomic pointers (open addressing, never shrinks, entries
// never freed), written under reg_mtx and read without a lock.

#include <string.h>

#include "agent_int.h"
#include "core/alloc.h"
#include "core/hash.h"
#include "wire.h"

#define REG_SLOTS 4096 /* power of two; at most REG_SLOTS / 2 functions */

static _Atomic(const ag_fn *) reg_slots[REG_SLOTS];
static pthread_mutex_t reg_mtx = PTHREAD_MUTEX_INITIALIZER;
static size_t reg_count;
static pthread_once_t reg_builtins_once = PTHREAD_ONCE_INIT;

const ag_fn *
tp__ag_registry_find(uint64_t id)
{
    pthread_once(&reg_builtins_once, tp__ag_builtins_register);
    for (size_t i = 0; i < REG_SLOTS; i++) {
        size_t slot = (size_t)(id + i) & (REG_SLOTS - 1);
        const ag_fn *f =
            atomic_load_explicit(&reg_slots[slot], memory_order_acquire);
        if (f == NULL) {
            return NULL;
        }
        if (f->fn_id == id) {
            return f;
        }
    }
    return NULL;
}

static tp_status
registry_add(const char *name, tp_rpc_fn sfn, tp_rpc_async_fn afn, void *arg,
             tp_error **err_p)
{
    size_t len = name != NULL ? strlen(name) : 0;
    if (name == NULL || !tp__ag_fn_name_valid(name, len)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc register \"%s\": a function name is 1..%d "
                             "letters, digits and \"_-.:/\"",
                             name != NULL ? name : "(null)",
                             TP_RPC_MAX_FN_NAME);
    }
    if ((sfn == NULL) == (afn == NULL)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc register \"%s\": no function", name);
    }
    uint64_t id = tp__hash64(name, len);
    tp_status st = TP_OK;
    pthread_mutex_lock(&reg_mtx);
    size_t slot = 0;
    for (size_t i = 0; i < REG_SLOTS; i++) {
        slot = (size_t)(id + i) & (REG_SLOTS - 1);
        const ag_fn *f =
            atomic_load_explicit(&reg_slots[slot], memory_order_relaxed);
        if (f == NULL) {
            break;
        }
        if (f->fn_id != id) {
            continue;
        }
        if (strcmp(f->fn_name, name) != 0) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "rpc register \"%s\": its id (XXH3-64 "
                               "%016llx) is taken by \"%s\"",
                               name, (unsigned long long)id, f->fn_name);
        } else if (f->fn_sync != sfn || f->fn_async != afn ||
                   f->fn_arg != arg) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "rpc register \"%s\": the name is registered "
                               "to another function",
                               name);
        }
        pthread_mutex_unlock(&reg_mtx);
        return st; // TP_OK: the same registration again
    }
    if (reg_count >= REG_SLOTS / 2) {
        pthread_mutex_unlock(&reg_mtx);
        return tp__error_set(err_p, TP_ENOMEM,
                             "rpc register \"%s\": %d functions registered "
                             "already",
                             name, REG_SLOTS / 2);
    }
    ag_fn *f = tp__zalloc(sizeof(*f));
    if (f == NULL) {
        pthread_mutex_unlock(&reg_mtx);
        return tp__error_set(err_p, TP_ENOMEM, "rpc register \"%s\"", name);
    }
    f->fn_id = id;
    memcpy(f->fn_name, name, len + 1);
    f->fn_sync = sfn;
    f->fn_async = afn;
    f->fn_arg = arg;
    atomic_store_explicit(&reg_slots[slot], f, memory_order_release);
    reg_count++;
    pthread_mutex_unlock(&reg_mtx);
    return TP_OK;
}

tp_status
tp_rpc_register(const char *fn_name, tp_rpc_fn fn, void *arg, tp_error **err_p)
{
    pthread_once(&reg_builtins_once, tp__ag_builtins_register);
    return registry_add(fn_name, fn, NULL, arg, err_p);
}

tp_status
tp_rpc_register_async(const char *fn_name, tp_rpc_async_fn fn, void *arg,
                      tp_error **err_p)
{
    pthread_once(&reg_builtins_once, tp__ag_builtins_register);
    return registry_add(fn_name, NULL, fn, arg, err_p);
}

tp_status
tp__ag_registry_add_builtin(const char *name, tp_rpc_fn fn)
{
    return registry_add(name, fn, NULL, NULL, NULL);
}
