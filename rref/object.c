// SPDX-License-Identifier: Apache-2.0
// object.c - remote types and their objects (PyTorch's RemoteModule, in
// C): a process-wide table of types registered by name, and the objects
// that are the values of RRefs made by tp_remote_create.

#include <pthread.h>
#include <string.h>

#include "agent/wire.h"
#include "core/alloc.h"
#include "rr_impl.h"

#define RR_MAX_TYPES 256

struct rr_type {
    char t_name[TP_RPC_MAX_FN_NAME + 1];
    tp_remote_type t_def; // methods point into t_methods
    tp_remote_method *t_methods;
    char (*t_mnames)[TP_RPC_MAX_FN_NAME + 1];
};

static pthread_mutex_t types_mtx = PTHREAD_MUTEX_INITIALIZER;
static rr_type *types[RR_MAX_TYPES];
static _Atomic size_t ntypes;

static bool
same_type(const rr_type *t, const tp_remote_type *d)
{
    if (t->t_def.create != d->create || t->t_def.destroy != d->destroy ||
        t->t_def.to_args != d->to_args || t->t_def.arg != d->arg ||
        t->t_def.serialize != d->serialize ||
        t->t_def.nmethods != d->nmethods) {
        return false;
    }
    for (size_t i = 0; i < d->nmethods; i++) {
        if (t->t_methods[i].fn != d->methods[i].fn ||
            strcmp(t->t_mnames[i], d->methods[i].name) != 0) {
            return false;
        }
    }
    return true;
}

tp_status
tp_remote_type_register(const tp_remote_type *type, tp_error **err_p)
{
    if (type == NULL || type->size < sizeof(tp_remote_type) ||
        type->name == NULL ||
        !tp__ag_fn_name_valid(type->name, strlen(type->name)) ||
        type->create == NULL || (type->nmethods > 0 && type->methods == NULL)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "remote type \"%s\": size, a name of 1..255 "
                             "[A-Za-z0-9_.:/-], a create function and the "
                             "methods are required",
                             type != NULL && type->name != NULL ? type->name
                                                                : "(null)");
    }
    for (size_t i = 0; i < type->nmethods; i++) {
        const tp_remote_method *m = &type->methods[i];
        if (m->name == NULL || m->fn == NULL ||
            !tp__ag_fn_name_valid(m->name, strlen(m->name))) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "remote type \"%s\": method %zu needs a name "
                                 "and a function",
                                 type->name, i);
        }
        for (size_t k = 0; k < i; k++) {
            if (strcmp(type->methods[k].name, m->name) == 0) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "remote type \"%s\": method \"%s\" "
                                     "twice",
                                     type->name, m->name);
            }
        }
    }
    pthread_mutex_lock(&types_mtx);
    size_t n = atomic_load_explicit(&ntypes, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(types[i]->t_name, type->name) == 0) {
            bool same = same_type(types[i], type);
            pthread_mutex_unlock(&types_mtx);
            return same ? TP_OK
                        : tp__error_set(err_p, TP_EINVAL,
                                        "remote type \"%s\" is registered "
                                        "already, with other functions",
                                        type->name);
        }
    }
    if (n == RR_MAX_TYPES) {
        pthread_mutex_unlock(&types_mtx);
        return tp__error_set(err_p, TP_EINVAL,
                             "remote type \"%s\": %d types are registered "
                             "already",
                             type->name, RR_MAX_TYPES);
    }
    // Entries are never freed (process lifetime), as registered functions.
    rr_type *t = tp__zalloc(sizeof(*t));
    size_t nm = type->nmethods;
    if (t != NULL && nm > 0) {
        t->t_methods = tp__zalloc(nm * sizeof(*t->t_methods));
        t->t_mnames = tp__zalloc(nm * sizeof(*t->t_mnames));
    }
    if (t == NULL ||
        (nm > 0 && (t->t_methods == NULL || t->t_mnames == NULL))) {
        pthread_mutex_unlock(&types_mtx);
        if (t != NULL) {
            tp__free(t->t_methods);
            tp__free(t->t_mnames);
        }
        tp__free(t);
        return tp__error_set(err_p, TP_ENOMEM, "remote type: out of memory");
    }
    memcpy(t->t_name, type->name, strlen(type->name) + 1);
    t->t_def = *type;
    t->t_def.name = t->t_name;
    for (size_t i = 0; i < nm; i++) {
        memcpy(t->t_mnames[i], type->methods[i].name,
               strlen(type->methods[i].name) + 1);
        t->t_methods[i].name = t->t_mnames[i];
        t->t_methods[i].fn = type->methods[i].fn;
    }
    t->t_def.methods = t->t_methods;
    types[n] = t;
    atomic_store_explicit(&ntypes, n + 1, memory_order_release);
    pthread_mutex_unlock(&types_mtx);
    return TP_OK;
}

const rr_type *
tp__rr_type_find(const char *name, size_t len)
{
    // Lock-free: entries are published before the count and never change.
    size_t n = atomic_load_explicit(&ntypes, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        if (strlen(types[i]->t_name) == len &&
            memcmp(types[i]->t_name, name, len) == 0) {
            return types[i];
        }
    }
    return NULL;
}

const char *
tp__rr_type_name(const rr_type *t)
{
    return t->t_name;
}

// The failure @st of a type's function (@err from it, taken, may be
// NULL): an error naming the function and the type.
static tp_status
user_error(tp_status st, tp_error *err, tp_error **err_p, const char *what,
           const char *name, const char *type)
{
    tp_error *e =
        tp__error_new(st, 0, err, "%s%s%s%s of remote type \"%s\"%s", what,
                      name[0] ? " \"" : "", name, name[0] ? "\"" : "", type,
                      err != NULL ? "" : " failed");
    tp_error_unref(err);
    if (err_p != NULL) {
        *err_p = e;
    } else {
        tp_error_unref(e);
    }
    return st;
}

tp_status
tp__rr_obj_create(const rr_type *t, const tp_rpc_call_info *call,
                  const tp_args *in, rr_obj **obj_p, tp_error **err_p)
{
    rr_obj *o = tp__zalloc(sizeof(*o));
    if (o == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "remote type \"%s\": out of "
                             "memory",
                             t->t_name);
    }
    tp_error *err = NULL;
    void *state = NULL;
    tp_status st = t->t_def.create(call, in, t->t_def.arg, &state, &err);
    if (st != TP_OK) {
        tp__free(o);
        return user_error(st, err, err_p, "constructor", "", t->t_name);
    }
    tp_error_unref(err);
    o->o_type = t;
    o->o_state = state;
    tp__mtx_init(&o->o_mtx);
    *obj_p = o;
    return TP_OK;
}

void
tp__rr_obj_free(void *obj)
{
    rr_obj *o = obj;
    if (o == NULL) {
        return;
    }
    if (o->o_type->t_def.destroy != NULL) {
        o->o_type->t_def.destroy(o->o_state, o->o_type->t_def.arg);
    }
    tp__mtx_fini(&o->o_mtx);
    tp__free(o);
}

tp_status
tp__rr_obj_call(rr_obj *o, const char *name, size_t len,
                const tp_rpc_call_info *call, const tp_args *in,
                tp_args **out_p, tp_error **err_p)
{
    const rr_type *t = o->o_type;
    const tp_remote_method *m = NULL;
    for (size_t i = 0; i < t->t_def.nmethods; i++) {
        if (strlen(t->t_mnames[i]) == len &&
            memcmp(t->t_mnames[i], name, len) == 0) {
            m = &t->t_methods[i];
            break;
        }
    }
    if (m == NULL) {
        return tp__error_set(err_p, TP_ENOENT,
                             "remote type \"%s\" has no method \"%.*s\"",
                             t->t_name, (int)len, name);
    }
    if (t->t_def.serialize) {
        tp__mtx_lock(&o->o_mtx);
    }
    tp_error *err = NULL;
    tp_args *out = NULL;
    tp_status st = m->fn(call, o->o_state, in, t->t_def.arg, &out, &err);
    if (t->t_def.serialize) {
        tp__mtx_unlock(&o->o_mtx);
    }
    if (st != TP_OK) {
        tp_args_unref(out);
        return user_error(st, err, err_p, "method", m->name, t->t_name);
    }
    tp_error_unref(err);
    *out_p = out;
    return TP_OK;
}

tp_status
tp__rr_obj_to_args(rr_obj *o, tp_args **out_p, tp_error **err_p)
{
    const rr_type *t = o->o_type;
    if (t->t_def.to_args == NULL) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "remote type \"%s\" has no to_args: its objects "
                             "cannot be copied to another worker",
                             t->t_name);
    }
    if (t->t_def.serialize) {
        tp__mtx_lock(&o->o_mtx);
    }
    tp_status st = t->t_def.to_args(o->o_state, t->t_def.arg, out_p, err_p);
    if (t->t_def.serialize) {
        tp__mtx_unlock(&o->o_mtx);
    }
    return st;
}
