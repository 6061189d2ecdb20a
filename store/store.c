// SPDX-License-Identifier: Apache-2.0
// store.c - the public store API: argument checks, deadlines, error
// context, and the init methods (env://, tcp://, file://, mem://) that pick
// a backend.
//
// Lock order: s_mtx (one store's calls) before any lock of its backend.

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "core/alloc.h"
#include "launch.h"
#include "store_int.h"
#include "transport/sockaddr.h"

// ---- init methods ----

static bool
store_env_int(const char *name, int *v_p)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') {
        return false;
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v > (1L << 30)) {
        *v_p = -2; // present but malformed
        return true;
    }
    *v_p = (int)v;
    return true;
}

tp_status
tp__store_env_ranks(int *rank_p, int *world_p, int *local_p, tp_error **err_p)
{
    static const char *const sets[][3] = {
        {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
         "OMPI_COMM_WORLD_LOCAL_RANK"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(sets); i++) {
        int r = -1, w = -1, l = -1;
        bool hr = store_env_int(sets[i][0], &r);
        bool hw = store_env_int(sets[i][1], &w);
        if (!hr && !hw) {
            continue;
        }
        if (!hr || !hw || r < 0 || w <= 0 || r >= w) {
            return tp__error_set(
                err_p, TP_EINVAL,
                "env://: %s=%s and %s=%s are not a rank "
                "and a world size",
                sets[i][0], getenv(sets[i][0]) ? getenv(sets[i][0]) : "(unset)",
                sets[i][1],
                getenv(sets[i][1]) ? getenv(sets[i][1]) : "(unset)");
        }
        if (!store_env_int(sets[i][2], &l) || l < 0) {
            l = -1;
        }
        *rank_p = r;
        *world_p = w;
        *local_p = l;
        return TP_OK;
    }
    return tp__error_set(err_p, TP_EINVAL,
                         "env://: none of RANK/WORLD_SIZE, "
                         "SLURM_PROCID/SLURM_NTASKS, "
                         "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE is set");
}

static tp_status
store_open_tcp(tp_store *s, const char *url, int rank, uint64_t deadline_ns,
               tp_error **err_p)
{
    // "tcp://H:P" or "tcp://H:P?server=0".
    char addr[TP_SOCKADDR_STRLEN + 256];
    bool host_server = rank == 0;
    const char *q = strchr(url, '?');
    size_t alen = q ? (size_t)(q - url) : strlen(url);
    if (alen >= sizeof(addr)) {
        return tp__error_set(err_p, TP_EINVAL, "store %.64s...: too long", url);
    }
    memcpy(addr, url, alen);
    addr[alen] = 0;
    if (q != NULL) {
        if (strcmp(q, "?server=0") == 0) {
            host_server = false;
        } else if (strcmp(q, "?server=1") != 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "store %s: unknown option \"%s\" (accepted: "
                                 "?server=0, ?server=1)",
                                 url, q);
        }
    }
    tp_hostport hp;
    tp_status st = tp__sockaddr_split(addr, 0, &hp, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "store");
    }
    snprintf(s->s_addr, sizeof(s->s_addr), "%s", addr);
    tp_store_server *srv = NULL;
    if (host_server) {
        if (hp.hp_port == 0) {
            return tp__error_set(
                err_p, TP_EINVAL,
                "store %s: port 0 is only for a standalone server "
                "(tp_store_server_start, `tpipe store`): the other ranks "
                "could not learn the port",
                addr);
        }
        // Shared with the other opens of this address in this process
        // (RPC and a process group on one tcp:// store).
        st = tp__store_server_acquire(addr, &srv, err_p);
        if (st != TP_OK) {
            return st;
        }
    }
    st =
        tp__store_tcp_open(srv ? tp_store_server_addr(srv) : addr,
                           s->s_max_value, deadline_ns, srv, &s->s_impl, err_p);
    if (st != TP_OK) {
        tp__store_server_release(srv);
        return tp__error_wrap(err_p, st, "store %s: connect (rank %d)", addr,
                              rank);
    }
    s->s_ops = &tp__store_tcp_ops;
    return TP_OK;
}

// env:// under a PMIx launcher: rank 0 serves on every interface (port
// MASTER_PORT, else any) and publishes "tcp://<hostname>:<port>" through
// PMIx; everyone connects to what rank 0 published.
static tp_status
store_open_pmix(tp_store *s, int rank, uint64_t deadline_ns, tp_error **err_p)
{
    char adv[TP_SOCKADDR_STRLEN + 300];
    tp_store_server *srv = NULL;
    tp_status st;
    if (rank == 0) {
        const char *ep = getenv("MASTER_PORT");
        char bind_addr[64], hn[256];
        snprintf(bind_addr, sizeof(bind_addr), "tcp://0.0.0.0:%s",
                 ep != NULL && *ep != '\0' ? ep : "0");
        st = tp_store_server_start(bind_addr, &srv, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "env://: PMIx");
        }
        const char *sa = tp_store_server_addr(srv);
        const char *colon = strrchr(sa, ':');
        if (gethostname(hn, sizeof(hn)) != 0) {
            snprintf(hn, sizeof(hn), "127.0.0.1");
        }
        hn[sizeof(hn) - 1] = '\0';
        snprintf(adv, sizeof(adv), "tcp://%s%s", hn, colon ? colon : ":0");
    }
    int64_t left_ms = s->s_timeout_ms;
    st = tp__pmix_exchange(rank == 0 ? adv : NULL, rank, left_ms, adv,
                           sizeof(adv), err_p);
    if (st != TP_OK) {
        tp_store_server_stop(srv);
        return st;
    }
    snprintf(s->s_addr, sizeof(s->s_addr), "%s", adv);
    st =
        tp__store_tcp_open(srv ? tp_store_server_addr(srv) : adv,
                           s->s_max_value, deadline_ns, srv, &s->s_impl, err_p);
    if (st != TP_OK) {
        tp_store_server_stop(srv);
        return tp__error_wrap(err_p, st,
                              "store %s (from PMIx): connect (rank "
                              "%d)",
                              adv, rank);
    }
    s->s_ops = &tp__store_tcp_ops;
    return TP_OK;
}

static tp_status
store_open_env(tp_store *s, int *rank, int *world, uint64_t deadline_ns,
               tp_error **err_p)
{
    if (*rank < 0 || *world < 0) {
        int r, w, l;
        tp_status st = tp__store_env_ranks(&r, &w, &l, err_p);
        if (st != TP_OK) {
            return st;
        }
        if (*rank < 0) {
            *rank = r;
        }
        if (*world < 0) {
            *world = w;
        }
    }
    // MASTER_ADDR/MASTER_PORT, else what the launcher tells: Slurm's node
    // list and job id, or rank 0's address through PMIx.
    char host[TP_SOCKADDR_STRLEN + 1] = "", port[16] = "";
    const char *eh = getenv("MASTER_ADDR"), *ep = getenv("MASTER_PORT");
    if (eh != NULL && *eh != '\0') {
        snprintf(host, sizeof(host), "%s", eh);
    }
    if (ep != NULL && *ep != '\0') {
        snprintf(port, sizeof(port), "%s", ep);
    }
    if (host[0] == '\0' || port[0] == '\0') {
        bool slurm = false;
        tp_status st = tp__slurm_master(host, sizeof(host), port, sizeof(port),
                                        &slurm, err_p);
        if (st != TP_OK) {
            return st;
        }
        if (!slurm && host[0] == '\0' && tp__pmix_present()) {
            return store_open_pmix(s, *rank, deadline_ns, err_p);
        }
    }
    if (host[0] == '\0' || port[0] == '\0') {
        return tp__error_set(err_p, TP_EINVAL,
                             "env://: MASTER_ADDR and MASTER_PORT must be "
                             "set (MASTER_ADDR=%s, MASTER_PORT=%s), or the "
                             "job started by Slurm (SLURM_JOB_NODELIST and "
                             "SLURM_JOB_ID)%s",
                             eh ? eh : "(unset)", ep ? ep : "(unset)",
                             TP_HAVE_PMIX ? " or a PMIx launcher (mpirun)"
                                          : "");
    }
    char url[TP_SOCKADDR_STRLEN + 300];
    bool v6 = strchr(host, ':') != NULL && host[0] != '[';
    snprintf(url, sizeof(url), "tcp://%s%s%s:%s", v6 ? "[" : "", host,
             v6 ? "]" : "", port);
    return store_open_tcp(s, url, *rank, deadline_ns, err_p);
}

tp_status
tp_store_open(const char *init_method, int rank, int world_size,
              int64_t timeout_ms, tp_store **store_p, tp_error **err_p)
{
    if (init_method == NULL || store_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_store_open: init_method and store_p are "
                             "required");
    }
    // A malformed URL is reported first; then -1 comes from the
    // environment and the ranks are checked, on every backend.
    tp_status st =
        tp__store_resolve_ranks(init_method, &rank, &world_size, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_config cfg;
    st = tp__config_load(&cfg, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_store *s = tp__zalloc(sizeof(*s));
    if (s == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "store: out of memory");
    }
    tp__mtx_init(&s->s_mtx);
    s->s_rank = rank;
    s->s_timeout_ms = timeout_ms < 0 ? cfg.store_timeout_ms : timeout_ms;
    s->s_max_value = cfg.store_max_value;
    uint64_t deadline_ns = tp__deadline_after_ms(s->s_timeout_ms);
    snprintf(s->s_addr, sizeof(s->s_addr), "%s", init_method);

    if (strncmp(init_method, "mem://", 6) == 0) {
        st = tp__store_mem_open(init_method + 6, &s->s_impl, err_p);
        s->s_ops = &tp__store_mem_ops;
    } else if (strncmp(init_method, "file://", 7) == 0) {
        const char *path = init_method + 7;
        if (*path != '/') {
            st = tp__error_set(err_p, TP_EINVAL,
                               "store %s: the path must be absolute "
                               "(file:///path)",
                               init_method);
        } else {
            st = tp__store_file_open(path, s->s_max_value, &s->s_impl, err_p);
            s->s_ops = &tp__store_file_ops;
            if (st != TP_OK) {
                st = tp__error_wrap(err_p, st, "store %s", init_method);
            }
        }
    } else if (strncmp(init_method, "tcp://", 6) == 0) {
        st = store_open_tcp(s, init_method, rank, deadline_ns, err_p);
    } else if (strcmp(init_method, "env://") == 0) {
        st = store_open_env(s, &rank, &world_size, deadline_ns, err_p);
        s->s_rank = rank;
    } else {
        st = tp__error_set(err_p, TP_EINVAL,
                           "store %s: unknown init method (accepted: env://, "
                           "tcp://HOST:PORT, file:///PATH, mem://NAME)",
                           init_method);
    }
    if (st != TP_OK) {
        tp__mtx_fini(&s->s_mtx);
        tp__free(s);
        return st;
    }
    s->s_world = world_size;
    *store_p = s;
    return TP_OK;
}

void
tp_store_close(tp_store *s)
{
    if (s == NULL) {
        return;
    }
    s->s_ops->so_close(s->s_impl);
    tp__mtx_fini(&s->s_mtx);
    tp__free(s);
}

bool
tp__store_is_host(const tp_store *s)
{
    if (s == NULL) {
        return false;
    }
    if (s->s_ops == &tp__store_tcp_ops) {
        return tp__store_tcp_hosts(s->s_impl);
    }
    return s->s_ops == &tp__store_mem_ops;
}

const char *
tp_store_addr(const tp_store *s)
{
    return s != NULL ? s->s_addr : "(no store)";
}

// ---- operations ----

// A public call given no store (or no output pointer it needs).
static tp_status
store_null(const char *fn, const char *what, tp_error **err_p)
{
    return tp__error_set(err_p, TP_EINVAL, "%s: %s is NULL", fn, what);
}

#define STORE_CHECK_NULL(fn, ptr)                                              \
    do {                                                                       \
        if ((ptr) == NULL) {                                                   \
            return store_null(fn, #ptr, err_p);                                \
        }                                                                      \
    } while (0)

typedef struct store_call {
    tp_store *c_s;
    const char *c_op;
    char c_what[600]; // "\"key\"" or a list of keys
    int64_t c_timeout_ms;
    uint64_t c_deadline_ns;
} store_call;

static void
store_call_init(store_call *c, tp_store *s, const char *op,
                const char *const *keys, size_t n, int64_t timeout_ms)
{
    c->c_s = s;
    c->c_op = op;
    c->c_timeout_ms = timeout_ms < 0 ? s->s_timeout_ms : timeout_ms;
    c->c_deadline_ns = tp__deadline_after_ms(c->c_timeout_ms);
    size_t off = 0;
    c->c_what[0] = 0;
    for (size_t i = 0; i < n && off < sizeof(c->c_what) - 1; i++) {
        if (i == 4) {
            snprintf(c->c_what + off, sizeof(c->c_what) - off,
                     " ... (%zu keys)", n);
            break;
        }
        int w =
            snprintf(c->c_what + off, sizeof(c->c_what) - off, "%s\"%.100s\"",
                     i ? ", " : " ", keys[i] ? keys[i] : "(null)");
        off += (size_t)w;
    }
}

// Adds the store, operation, keys and rank to the error in *err_p.
static tp_status
store_call_fail(const store_call *c, tp_status st, tp_error **err_p)
{
    if (err_p == NULL) {
        return st;
    }
    if (st == TP_ETIMEDOUT && *err_p != NULL) {
        tp_error *inner = *err_p;
        *err_p = NULL;
        tp__error_set(err_p, st,
                      "store %s: %s%s (rank %d): timed out after %" PRId64
                      " ms: %s",
                      c->c_s->s_addr, c->c_op, c->c_what, c->c_s->s_rank,
                      c->c_timeout_ms, tp_error_message(inner));
        tp_error_unref(inner);
        return st;
    }
    return tp__error_wrap(err_p, st, "store %s: %s%s (rank %d)", c->c_s->s_addr,
                          c->c_op, c->c_what, c->c_s->s_rank);
}

static tp_status
store_check_key(const store_call *c, const char *key, tp_error **err_p)
{
    if (key == NULL || *key == '\0') {
        tp__error_set(err_p, TP_EINVAL, "the key is empty");
        return store_call_fail(c, TP_EINVAL, err_p);
    }
    size_t n = strnlen(key, TP_STORE_MAX_KEY + 1);
    if (n > TP_STORE_MAX_KEY) {
        tp__error_set(err_p, TP_EINVAL, "the key is longer than %d bytes",
                      TP_STORE_MAX_KEY);
        return store_call_fail(c, TP_EINVAL, err_p);
    }
    return TP_OK;
}

static tp_status
store_check_value(const store_call *c, const void *v, size_t len,
                  tp_error **err_p)
{
    if (len > (uint64_t)c->c_s->s_max_value) {
        tp__error_set(err_p, TP_EINVAL,
                      "a value of %zu bytes is larger than "
                      "TP_STORE_MAX_VALUE (%" PRId64 ")",
                      len, c->c_s->s_max_value);
        return store_call_fail(c, TP_EINVAL, err_p);
    }
    if (len > 0 && v == NULL) {
        tp__error_set(err_p, TP_EINVAL, "value is NULL");
        return store_call_fail(c, TP_EINVAL, err_p);
    }
    return TP_OK;
}

tp_status
tp_store_set(tp_store *s, const char *key, const void *val, size_t len,
             int64_t timeout_ms, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_set", s);
    store_call c;
    store_call_init(&c, s, "set", &key, 1, timeout_ms);
    tp_status st = store_check_key(&c, key, err_p);
    if (st == TP_OK) {
        st = store_check_value(&c, val, len, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    tp__mtx_lock(&s->s_mtx);
    st = s->s_ops->so_set(s->s_impl, key, val, len, c.c_timeout_ms,
                          c.c_deadline_ns, err_p);
    tp__mtx_unlock(&s->s_mtx);
    return st == TP_OK ? TP_OK : store_call_fail(&c, st, err_p);
}

tp_status
tp_store_get(tp_store *s, const char *key, int64_t timeout_ms, void **val_p,
             size_t *len_p, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_get", s);
    STORE_CHECK_NULL("tp_store_get", val_p);
    store_call c;
    store_call_init(&c, s, "get", &key, 1, timeout_ms);
    tp_status st = store_check_key(&c, key, err_p);
    if (st != TP_OK) {
        return st;
    }
    uint8_t *v = NULL;
    size_t n = 0;
    tp__mtx_lock(&s->s_mtx);
    st = s->s_ops->so_get(s->s_impl, key, c.c_timeout_ms, c.c_deadline_ns, &v,
                          &n, err_p);
    tp__mtx_unlock(&s->s_mtx);
    if (st != TP_OK) {
        return store_call_fail(&c, st, err_p);
    }
    *val_p = v;
    if (len_p != NULL) {
        *len_p = n;
    }
    return TP_OK;
}

tp_status
tp_store_add(tp_store *s, const char *key, int64_t delta, int64_t timeout_ms,
             int64_t *value_p, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_add", s);
    store_call c;
    store_call_init(&c, s, "add", &key, 1, timeout_ms);
    tp_status st = store_check_key(&c, key, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t v = 0;
    tp__mtx_lock(&s->s_mtx);
    st = s->s_ops->so_add(s->s_impl, key, delta, c.c_timeout_ms,
                          c.c_deadline_ns, &v, err_p);
    tp__mtx_unlock(&s->s_mtx);
    if (st != TP_OK) {
        return store_call_fail(&c, st, err_p);
    }
    if (value_p != NULL) {
        *value_p = v;
    }
    return TP_OK;
}

tp_status
tp_store_wait(tp_store *s, const char *const *keys, size_t n,
              int64_t timeout_ms, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_wait", s);
    // The count is checked before the array is read (for the message).
    store_call c;
    bool bad = n > TP_STORE_MAX_WAIT || (n > 0 && keys == NULL);
    store_call_init(&c, s, "wait", keys, bad ? 0 : n, timeout_ms);
    if (bad) {
        tp__error_set(err_p, TP_EINVAL, "%zu keys (at most %d)", n,
                      TP_STORE_MAX_WAIT);
        return store_call_fail(&c, TP_EINVAL, err_p);
    }
    for (size_t i = 0; i < n; i++) {
        tp_status st = store_check_key(&c, keys[i], err_p);
        if (st != TP_OK) {
            return st;
        }
    }
    if (n == 0) {
        return TP_OK;
    }
    tp__mtx_lock(&s->s_mtx);
    tp_status st = s->s_ops->so_wait(s->s_impl, keys, n, c.c_timeout_ms,
                                     c.c_deadline_ns, err_p);
    tp__mtx_unlock(&s->s_mtx);
    return st == TP_OK ? TP_OK : store_call_fail(&c, st, err_p);
}

tp_status
tp_store_compare_set(tp_store *s, const char *key, const void *expected,
                     size_t elen, const void *desired, size_t dlen,
                     int64_t timeout_ms, void **val_p, size_t *len_p,
                     tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_compare_set", s);
    store_call c;
    store_call_init(&c, s, "compare_set", &key, 1, timeout_ms);
    tp_status st = store_check_key(&c, key, err_p);
    if (st == TP_OK) {
        st = store_check_value(&c, expected, elen, err_p);
    }
    if (st == TP_OK) {
        st = store_check_value(&c, desired, dlen, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    uint8_t *v = NULL;
    size_t n = 0;
    tp__mtx_lock(&s->s_mtx);
    st = s->s_ops->so_compare_set(s->s_impl, key, expected, elen, desired, dlen,
                                  c.c_timeout_ms, c.c_deadline_ns, &v, &n,
                                  err_p);
    tp__mtx_unlock(&s->s_mtx);
    if (st != TP_OK) {
        return store_call_fail(&c, st, err_p);
    }
    if (val_p != NULL) {
        *val_p = v;
    } else {
        tp__free(v);
    }
    if (len_p != NULL) {
        *len_p = n;
    }
    return TP_OK;
}

tp_status
tp_store_delete_key(tp_store *s, const char *key, int64_t timeout_ms,
                    bool *deleted_p, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_delete_key", s);
    store_call c;
    store_call_init(&c, s, "delete_key", &key, 1, timeout_ms);
    tp_status st = store_check_key(&c, key, err_p);
    if (st != TP_OK) {
        return st;
    }
    bool d = false;
    tp__mtx_lock(&s->s_mtx);
    st = s->s_ops->so_delete(s->s_impl, key, c.c_timeout_ms, c.c_deadline_ns,
                             &d, err_p);
    tp__mtx_unlock(&s->s_mtx);
    if (st != TP_OK) {
        return store_call_fail(&c, st, err_p);
    }
    if (deleted_p != NULL) {
        *deleted_p = d;
    }
    return TP_OK;
}

tp_status
tp__store_delete_prefix(tp_store *s, const char *prefix, int64_t timeout_ms,
                        int64_t *n_p, tp_error **err_p)
{
    STORE_CHECK_NULL("delete_prefix", s);
    store_call c;
    store_call_init(&c, s, "delete_prefix", &prefix, 1, timeout_ms);
    tp_status st = store_check_key(&c, prefix, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t n = 0;
    tp__mtx_lock(&s->s_mtx);
    st = s->s_ops->so_delete_prefix(s->s_impl, prefix, c.c_timeout_ms,
                                    c.c_deadline_ns, &n, err_p);
    tp__mtx_unlock(&s->s_mtx);
    if (st != TP_OK) {
        return store_call_fail(&c, st, err_p);
    }
    if (n_p != NULL) {
        *n_p = n;
    }
    return TP_OK;
}

tp_status
tp_store_num_keys(tp_store *s, int64_t timeout_ms, int64_t *n_p,
                  tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_num_keys", s);
    STORE_CHECK_NULL("tp_store_num_keys", n_p);
    store_call c;
    store_call_init(&c, s, "num_keys", NULL, 0, timeout_ms);
    int64_t n = 0;
    tp__mtx_lock(&s->s_mtx);
    tp_status st = s->s_ops->so_num_keys(s->s_impl, c.c_timeout_ms,
                                         c.c_deadline_ns, &n, err_p);
    tp__mtx_unlock(&s->s_mtx);
    if (st != TP_OK) {
        return store_call_fail(&c, st, err_p);
    }
    *n_p = n;
    return TP_OK;
}

tp_status
tp_store_append(tp_store *s, const char *key, const void *val, size_t len,
                int64_t timeout_ms, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_append", s);
    store_call c;
    store_call_init(&c, s, "append", &key, 1, timeout_ms);
    tp_status st = store_check_key(&c, key, err_p);
    if (st == TP_OK) {
        st = store_check_value(&c, val, len, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    tp__mtx_lock(&s->s_mtx);
    st = s->s_ops->so_append(s->s_impl, key, val, len, c.c_timeout_ms,
                             c.c_deadline_ns, err_p);
    tp__mtx_unlock(&s->s_mtx);
    return st == TP_OK ? TP_OK : store_call_fail(&c, st, err_p);
}

// The checks of a call on @n keys: the count before the array is read.
static tp_status
store_check_keys(store_call *c, tp_store *s, const char *op,
                 const char *const *keys, size_t n, int64_t timeout_ms,
                 tp_error **err_p)
{
    bool bad = n > TP_STORE_MAX_WAIT || (n > 0 && keys == NULL);
    store_call_init(c, s, op, keys, bad ? 0 : n, timeout_ms);
    if (bad) {
        tp__error_set(err_p, TP_EINVAL, "%zu keys (at most %d)", n,
                      TP_STORE_MAX_WAIT);
        return store_call_fail(c, TP_EINVAL, err_p);
    }
    for (size_t i = 0; i < n; i++) {
        tp_status st = store_check_key(c, keys[i], err_p);
        if (st != TP_OK) {
            return st;
        }
    }
    return TP_OK;
}

tp_status
tp_store_check(tp_store *s, const char *const *keys, size_t n,
               int64_t timeout_ms, bool *all_set_p, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_check", s);
    STORE_CHECK_NULL("tp_store_check", all_set_p);
    store_call c;
    tp_status st = store_check_keys(&c, s, "check", keys, n, timeout_ms, err_p);
    if (st != TP_OK) {
        return st;
    }
    bool all = true;
    if (n > 0) {
        tp__mtx_lock(&s->s_mtx);
        st = s->s_ops->so_check(s->s_impl, keys, n, c.c_timeout_ms,
                                c.c_deadline_ns, &all, err_p);
        tp__mtx_unlock(&s->s_mtx);
    }
    if (st != TP_OK) {
        return store_call_fail(&c, st, err_p);
    }
    *all_set_p = all;
    return TP_OK;
}

tp_status
tp_store_multi_set(tp_store *s, const char *const *keys,
                   const void *const *vals, const size_t *lens, size_t n,
                   int64_t timeout_ms, tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_multi_set", s);
    store_call c;
    tp_status st =
        store_check_keys(&c, s, "multi_set", keys, n, timeout_ms, err_p);
    if (st == TP_OK && n > 0 && (vals == NULL || lens == NULL)) {
        tp__error_set(err_p, TP_EINVAL, "vals and lens are required");
        st = store_call_fail(&c, TP_EINVAL, err_p);
    }
    for (size_t i = 0; st == TP_OK && i < n; i++) {
        st = store_check_value(&c, vals[i], lens[i], err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    // One deadline for all, the store held throughout: no other call of
    // this handle runs between the sets.
    tp__mtx_lock(&s->s_mtx);
    for (size_t i = 0; st == TP_OK && i < n; i++) {
        st = s->s_ops->so_set(s->s_impl, keys[i], vals[i], lens[i],
                              c.c_timeout_ms, c.c_deadline_ns, err_p);
    }
    tp__mtx_unlock(&s->s_mtx);
    return st == TP_OK ? TP_OK : store_call_fail(&c, st, err_p);
}

tp_status
tp_store_multi_get(tp_store *s, const char *const *keys, size_t n,
                   int64_t timeout_ms, void **vals, size_t *lens,
                   tp_error **err_p)
{
    STORE_CHECK_NULL("tp_store_multi_get", s);
    store_call c;
    tp_status st =
        store_check_keys(&c, s, "multi_get", keys, n, timeout_ms, err_p);
    if (st == TP_OK && n > 0 && vals == NULL) {
        tp__error_set(err_p, TP_EINVAL, "vals is required");
        st = store_call_fail(&c, TP_EINVAL, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    size_t got = 0;
    tp__mtx_lock(&s->s_mtx);
    for (; st == TP_OK && got < n; got++) {
        uint8_t *v = NULL;
        size_t len = 0;
        st = s->s_ops->so_get(s->s_impl, keys[got], c.c_timeout_ms,
                              c.c_deadline_ns, &v, &len, err_p);
        if (st != TP_OK) {
            break;
        }
        vals[got] = v;
        if (lens != NULL) {
            lens[got] = len;
        }
    }
    tp__mtx_unlock(&s->s_mtx);
    if (st != TP_OK) {
        for (size_t i = 0; i < got; i++) {
            tp__free(vals[i]);
            vals[i] = NULL;
        }
        return store_call_fail(&c, st, err_p);
    }
    return TP_OK;
}
