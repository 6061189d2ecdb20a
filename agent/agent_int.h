/* SPDX-License-Identifier: Apache-2.0 */
/* agent_int.h (internal) - what the agent's files share: the args object,
 * the function registry, the builtins, and hooks for tests. */
#ifndef TP_AGENT_INT_H
#define TP_AGENT_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/pipe.h>
#include <tpipe/rpc.h>

#include "core/error.h"

struct tp__args_obj_ops;

/* An object of a protocol above the agent carried by args (an RRef). */
typedef struct ag_obj {
    void *o_ptr;
    const struct tp__args_obj_ops *o_ops;
} ag_obj;

/* Arguments or a result: bytes + contiguous CPU tensors + objects of
 * protocols (RRefs). The bytes are either owned (malloc) or borrowed from
 * a received message (a_msg, freed with the args). Immutable once given
 * to a call. */
struct tp_args {
    _Atomic long a_refs;
    const void *a_bytes;
    size_t a_len;
    void *a_owned;     /* freed with the args (a copy of the bytes) */
    tp_message *a_msg; /* a received message whose payload holds a_bytes */
    tp_tensor **a_tensors;
    tp_device *a_src_devs; /* received: the sender's device of each tensor
                              (NULL: all CPU) */
    size_t a_ntensors;
    size_t a_cap;
    ag_obj *a_objs; /* referenced; released with the args */
    size_t a_nobjs, a_objs_cap;
};

/* The most objects one args carries. */
#define AG_MAX_OBJS 4096

/* Args with room for @ntensors tensors and no bytes. */
tp_status tp__ag_args_create_empty(size_t ntensors, tp_args **args_p);
/* Appends @t without a contiguity check (taking the reference). */
void tp__ag_args_push_tensor(tp_args *args, tp_tensor *t);
/* Sum of the bytes and tensor bytes. */
uint64_t tp__ag_args_nbytes(const tp_args *args);
/* A copy of @in (may be NULL) with its bytes copied, its tensors cloned
 * (own storage) with @clone_tensors or else shared, and its objects
 * referenced again, after @first (with @first_ops) as object 0 if not
 * NULL. */
tp_status tp__ag_args_copy(const tp_args *in, bool clone_tensors, void *first,
                           const struct tp__args_obj_ops *first_ops,
                           tp_args **out_p, tp_error **err_p);
/* tp__ag_args_copy with cloned tensors and no first object (calls to self). */
tp_status tp__ag_args_clone(const tp_args *in, tp_args **out_p,
                            tp_error **err_p);

/* A registered function. Entries are never freed (process lifetime). */
typedef struct ag_fn {
    uint64_t fn_id; /* XXH3-64 of the name */
    char fn_name[TP_RPC_MAX_FN_NAME + 1];
    tp_rpc_fn fn_sync;
    tp_rpc_async_fn fn_async;
    void *fn_arg;
} ag_fn;

/* The function with @id, NULL if none; registers the builtins first. */
const ag_fn *tp__ag_registry_find(uint64_t id);
/* Registers "tp.noop", "tp.echo", "tp.add" once (builtins.c). */
void tp__ag_builtins_register(void);
/* For tp__ag_builtins_register, which runs inside the registry's
 * pthread_once and must not re-enter it. */
tp_status tp__ag_registry_add_builtin(const char *name, tp_rpc_fn fn);

/* For tests: the URL of the agent's listener (its best transport). */
const char *tp__agent_listen_url(const tp_agent *a);
/* For tests: the connections the agent holds (live and not yet freed). */
size_t tp__agent_nconns(const tp_agent *a);

#endif
