// SPDX-License-Identifier: Apache-2.0
// config_test.c - the components' tables of tunables: defaults,
// environment, parsing, bounds, error messages, where values are stored
// (tp_config fields and the components' own structs) and tp_config_visit.
// Each case runs in its own process, so setenv() does not leak between
// cases.

#include "tp_test.h"

#include <ctype.h>

#include <tpipe/log.h>

#include "config.h"
#include "config_rows.h"

static const char *const all_env[] = {
    "TP_LOG_LEVEL",
    "TP_IO_BACKEND",
    "TP_SOCKET_IFNAME",
    "TP_SOCKET_ADDR",
    "TP_TCP_SNDBUF",
    "TP_TCP_RCVBUF",
    "TP_TCP_USER_TIMEOUT_MS",
    "TP_CONNECT_TIMEOUT_MS",
    "TP_HANDSHAKE_TIMEOUT_MS",
    "TP_SHM_RING_SIZE",
    "TP_SHM_SPIN_US",
    "TP_LOOP_SPIN_US",
    "TP_POOL_THREADS",
    "TP_MPT_LANES",
    "TP_MPT_SPLIT_MIN",
    "TP_MPT_INLINE_MAX",
    "TP_CMA_INLINE_MAX",
    "TP_PIPE_MAX_METADATA",
    "TP_PIPE_MAX_PAYLOADS",
    "TP_PIPE_MAX_TENSORS",
    "TP_PIPE_MAX_BUF_BYTES",
    "TP_STORE_TIMEOUT_MS",
    "TP_STORE_MAX_VALUE",
    "TP_NUM_WORKER_THREADS",
    "TP_RPC_TIMEOUT_MS",
    "TP_RPC_INIT_TIMEOUT_MS",
    "TP_RPC_SHUTDOWN_TIMEOUT_MS",
    "TP_COLL_ENGINE",
    "TP_COLL_ALLREDUCE",
    "TP_COLL_BCAST",
    "TP_COLL_SMALL_MAX",
    "TP_COLL_CHUNK",
    "TP_COLL_SHM_SLOT",
    "TP_COLL_TIMEOUT_MS",
    "TP_COLL_INIT_TIMEOUT_MS",
    "TP_DEBUG_COLLECTIVES",
};

// Start every case from a clean environment, whatever ctest inherited.
static void
clear_env(void)
{
    for (size_t i = 0; i < sizeof(all_env) / sizeof(all_env[0]); i++) {
        unsetenv(all_env[i]);
    }
}

static void
check_defaults(const tp_config *cfg)
{
    TP_CHECK_EQ(cfg->log_level, 0);
    TP_CHECK_EQ(cfg->io_backend, TP_IO_BACKEND_AUTO);
    TP_CHECK(strcmp(cfg->socket_ifname, "") == 0);
    TP_CHECK(strcmp(cfg->socket_addr, "") == 0);
    TP_CHECK_EQ(int_of(cfg, "tcp_sndbuf"), 1 << 20);
    TP_CHECK_EQ(int_of(cfg, "tcp_rcvbuf"), 1 << 20);
    TP_CHECK_EQ(int_of(cfg, "tcp_user_timeout_ms"), 30000);
    TP_CHECK_EQ(cfg->connect_timeout_ms, 10000);
    TP_CHECK_EQ(cfg->handshake_timeout_ms, 5000);
    TP_CHECK_EQ(cfg->shm_ring_size, 512 << 10);
    TP_CHECK_EQ(cfg->shm_spin_us, 50);
    TP_CHECK_EQ(cfg->loop_spin_us, 50);
    TP_CHECK_EQ(cfg->pool_threads, 4);
    TP_CHECK_EQ(cfg->mpt_lanes, 2);
    TP_CHECK_EQ(cfg->mpt_split_min, 256 << 10);
    TP_CHECK_EQ(cfg->mpt_inline_max, 64 << 10);
    TP_CHECK_EQ(int_of(cfg, "cma_inline_max"), 16 << 10);
    TP_CHECK_EQ(cfg->pipe_max_metadata, 64 << 20);
    TP_CHECK_EQ(cfg->pipe_max_payloads, 1024);
    TP_CHECK_EQ(cfg->pipe_max_tensors, 1024);
    TP_CHECK_EQ(cfg->pipe_max_buf_bytes, (int64_t)64 << 30);
    TP_CHECK_EQ(cfg->store_timeout_ms, 300000);
    TP_CHECK_EQ(cfg->store_max_value, 64 << 20);
    TP_CHECK_EQ(cfg->num_worker_threads, 16);
    TP_CHECK_EQ(cfg->rpc_timeout_ms, 60000);
    TP_CHECK_EQ(cfg->rpc_init_timeout_ms, 60000);
    TP_CHECK_EQ(cfg->rpc_shutdown_timeout_ms, 60000);
    TP_CHECK_EQ(cfg->coll_engine, TP_COLL_ENGINE_AUTO);
    TP_CHECK_EQ(cfg->coll_allreduce, TP_COLL_ALGO_AUTO);
    TP_CHECK_EQ(cfg->coll_bcast, TP_COLL_ALGO_AUTO);
    TP_CHECK_EQ(cfg->coll_small_max, 64 << 10);
    TP_CHECK_EQ(cfg->coll_chunk, 1 << 20);
    TP_CHECK_EQ(cfg->coll_shm_slot, 64 << 10);
    TP_CHECK_EQ(cfg->coll_timeout_ms, 300000);
    TP_CHECK_EQ(cfg->coll_init_timeout_ms, 60000);
    TP_CHECK_EQ(cfg->debug_collectives, 0);
}

static void
test_defaults(void)
{
    clear_env();
    tp_config cfg;
    tp_config loaded;
    tp_error *err = NULL;

    tp__config_defaults(&cfg);
    check_defaults(&cfg);
    memset(&loaded, 0xa5, sizeof(loaded));
    TP_CHECK_OK(tp__config_load(&loaded, &err), err);
    TP_CHECK(err == NULL);
    check_defaults(&loaded);
}

static void
test_env_override(void)
{
    clear_env();
    setenv("TP_LOG_LEVEL", "debug", 1);
    setenv("TP_IO_BACKEND", "epoll", 1);
    setenv("TP_SOCKET_IFNAME", "lo", 1);
    setenv("TP_SOCKET_ADDR", "::1", 1);
    setenv("TP_TCP_SNDBUF", "0", 1);
    setenv("TP_TCP_RCVBUF", "256K", 1);
    setenv("TP_CONNECT_TIMEOUT_MS", "2s", 1);
    setenv("TP_HANDSHAKE_TIMEOUT_MS", "750ms", 1);
    setenv("TP_SHM_RING_SIZE", "64K", 1);
    setenv("TP_SHM_SPIN_US", "0", 1);
    setenv("TP_LOOP_SPIN_US", "20", 1);
    setenv("TP_POOL_THREADS", "16", 1);

    tp_config cfg;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    TP_CHECK_EQ(cfg.log_level, TP_LOG_LEVEL_DEBUG);
    TP_CHECK_EQ(cfg.io_backend, TP_IO_BACKEND_EPOLL);
    TP_CHECK(strcmp(cfg.socket_ifname, "lo") == 0);
    TP_CHECK(strcmp(cfg.socket_addr, "::1") == 0);
    TP_CHECK_EQ(int_of(&cfg, "tcp_sndbuf"), 0);
    TP_CHECK_EQ(int_of(&cfg, "tcp_rcvbuf"), 256 * 1024);
    TP_CHECK_EQ(cfg.connect_timeout_ms, 2000);
    TP_CHECK_EQ(cfg.handshake_timeout_ms, 750);
    TP_CHECK_EQ(cfg.shm_ring_size, 64 * 1024);
    TP_CHECK_EQ(cfg.shm_spin_us, 0);
    TP_CHECK_EQ(cfg.loop_spin_us, 20);
    TP_CHECK_EQ(cfg.pool_threads, 16);
}

// The environment is read at each load, not cached at the first.
static void
test_env_read_each_load(void)
{
    clear_env();
    tp_config cfg;
    tp_error *err = NULL;

    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    TP_CHECK_EQ(cfg.pool_threads, 4);
    setenv("TP_POOL_THREADS", "7", 1);
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    TP_CHECK_EQ(cfg.pool_threads, 7);
    unsetenv("TP_POOL_THREADS");
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    TP_CHECK_EQ(cfg.pool_threads, 4);
}

static void
test_enum_forms(void)
{
    tp_config cfg;
    tp_error *err = NULL;
    tp__config_defaults(&cfg);

    static const char *const levels[] = {"off",  "error", "warn",
                                         "info", "debug", "trace"};
    for (int i = 0; i < 6; i++) {
        char num[12];
        snprintf(num, sizeof(num), "%d", i);
        TP_CHECK_OK(tp__config_set(&cfg, "log_level", levels[i], &err), err);
        TP_CHECK_EQ(cfg.log_level, i);
        TP_CHECK_OK(tp__config_set(&cfg, "log_level", "off", &err), err);
        TP_CHECK_OK(tp__config_set(&cfg, "log_level", num, &err), err);
        TP_CHECK_EQ(cfg.log_level, i);
    }
    TP_CHECK_OK(tp__config_set(&cfg, "io_backend", "URING", &err), err);
    TP_CHECK_EQ(cfg.io_backend, TP_IO_BACKEND_URING);
    TP_CHECK_OK(tp__config_set(&cfg, "io_backend", "Auto", &err), err);
    TP_CHECK_EQ(cfg.io_backend, TP_IO_BACKEND_AUTO);
    // io_backend has names only; no numeric form.
    TP_CHECK_EQ(tp__config_set(&cfg, "io_backend", "1", NULL), TP_EINVAL);
    TP_CHECK_EQ(tp__config_set(&cfg, "log_level", "6", NULL), TP_EINVAL);
    TP_CHECK_EQ(tp__config_set(&cfg, "log_level", "-1", NULL), TP_EINVAL);
    TP_CHECK_EQ(tp__config_set(&cfg, "log_level", "verbose", NULL), TP_EINVAL);
    TP_CHECK_EQ(cfg.log_level, 5);

    TP_CHECK(strcmp(tp__io_backend_name(TP_IO_BACKEND_AUTO), "auto") == 0);
    TP_CHECK(strcmp(tp__io_backend_name(TP_IO_BACKEND_EPOLL), "epoll") == 0);
    TP_CHECK(strcmp(tp__io_backend_name(TP_IO_BACKEND_URING), "uring") == 0);
    TP_CHECK(strcmp(tp__io_backend_name(42), "unknown") == 0);
    TP_CHECK(strcmp(tp__io_backend_name(-1), "unknown") == 0);
}

static void
test_size_suffixes(void)
{
    static const struct {
        const char *text;
        int64_t bytes;
    } ok[] = {
        {"0", 0},           {"1", 1},          {"4194304", 4194304},
        {"64K", 64 << 10},  {"64k", 64 << 10}, {"3M", 3 << 20},
        {"3m", 3 << 20},    {"1G", 1 << 30},   {"1g", 1 << 30},
        {"1024M", 1 << 30},
    };
    static const char *const bad[] = {
        "",
        "K",
        "4X",
        "4KB",
        "4 M",
        " 4M",
        "4M ",
        "-1",
        "1.5M",
        "0x10",
        "4MM",
        "99999999999999999999",
        "9223372036854775807G",
    };
    tp_config cfg;
    tp__config_defaults(&cfg);
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        tp_error *err = NULL;
        TP_CHECK_OK(tp__config_set(&cfg, "tcp_sndbuf", ok[i].text, &err), err);
        TP_CHECKF(int_of(&cfg, "tcp_sndbuf") == ok[i].bytes, "%s -> %lld",
                  ok[i].text, (long long)int_of(&cfg, "tcp_sndbuf"));
    }
    TP_CHECK_OK(tp__config_set(&cfg, "tcp_sndbuf", "5M", NULL), NULL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tp_error *err = NULL;
        tp_status st = tp__config_set(&cfg, "tcp_sndbuf", bad[i], &err);
        TP_CHECKF(st == TP_EINVAL, "\"%s\" accepted", bad[i]);
        TP_CHECK_EQ(tp_error_status(err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "tcp_sndbuf=");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "K, M or G");
        tp_error_unref(err);
        // A rejected value leaves the field alone.
        TP_CHECK_EQ(int_of(&cfg, "tcp_sndbuf"), 5 << 20);
    }
}

static void
check_set(tp_config *cfg, const char *name, const char *value, bool accept)
{
    tp_error *err = NULL;
    tp_status st = tp__config_set(cfg, name, value, &err);
    if (accept) {
        TP_CHECKF(st == TP_OK, "%s=%s rejected: %s", name, value,
                  tp_error_message(err));
        TP_CHECK(err == NULL);
    } else {
        TP_CHECKF(st == TP_EINVAL, "%s=%s accepted", name, value);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), name);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), value);
        tp_error_unref(err);
    }
}

static void
test_bounds(void)
{
    tp_config cfg;
    tp__config_defaults(&cfg);

    check_set(&cfg, "shm_ring_size", "32K", false);
    check_set(&cfg, "shm_ring_size", "64K", true);
    TP_CHECK_EQ(cfg.shm_ring_size, 65536);
    check_set(&cfg, "shm_ring_size", "1G", true);
    TP_CHECK_EQ(cfg.shm_ring_size, 1 << 30);
    check_set(&cfg, "shm_ring_size", "2G", false);
    check_set(&cfg, "shm_ring_size", "96K", false); // not a power of two
    check_set(&cfg, "shm_ring_size", "0", false);
    TP_CHECK_EQ(cfg.shm_ring_size, 1 << 30);

    check_set(&cfg, "tcp_sndbuf", "1G", true);
    check_set(&cfg, "tcp_sndbuf", "1025M", false);
    check_set(&cfg, "tcp_rcvbuf", "1073741825", false);

    check_set(&cfg, "pool_threads", "0", false);
    check_set(&cfg, "pool_threads", "1", true);
    check_set(&cfg, "pool_threads", "1024", true);
    check_set(&cfg, "pool_threads", "1025", false);
    check_set(&cfg, "pool_threads", "4k", false);
    TP_CHECK_EQ(cfg.pool_threads, 1024);

    check_set(&cfg, "shm_spin_us", "1000000", true);
    check_set(&cfg, "shm_spin_us", "1000001", false);
    check_set(&cfg, "shm_spin_us", "-1", false);
    check_set(&cfg, "loop_spin_us", "0", true);
    check_set(&cfg, "loop_spin_us", "1000001", false);

    check_set(&cfg, "connect_timeout_ms", "0", false);
    check_set(&cfg, "connect_timeout_ms", "1", true);
    check_set(&cfg, "connect_timeout_ms", "86400s", true);
    TP_CHECK_EQ(cfg.connect_timeout_ms, 86400000);
    check_set(&cfg, "connect_timeout_ms", "86401s", false);
    check_set(&cfg, "handshake_timeout_ms", "10x", false);
    check_set(&cfg, "handshake_timeout_ms", "5min", false);

    // Strings must fit their field, NUL included.
    char name[80];
    memset(name, 'a', sizeof(name));
    name[63] = '\0';
    check_set(&cfg, "socket_ifname", name, true);
    TP_CHECK_EQ(strlen(cfg.socket_ifname), 63);
    name[63] = 'a';
    name[64] = '\0';
    check_set(&cfg, "socket_ifname", name, false);
    TP_CHECK_EQ(strlen(cfg.socket_ifname), 63);
    check_set(&cfg, "socket_ifname", "", true);
    TP_CHECK_EQ(strlen(cfg.socket_ifname), 0);
}

// Every malformed variable: TP_EINVAL, a message naming the variable, the
// value and what is accepted; that field keeps its default and the others
// are still applied.
static void
test_malformed_env(void)
{
    static const struct {
        const char *env;
        const char *value;
        const char *accepted;
    } cases[] = {
        {"TP_LOG_LEVEL", "loud",
         "not one of off|error|warn|info|debug|trace or 0..5"},
        {"TP_IO_BACKEND", "kqueue", "not one of auto|epoll|uring"},
        {"TP_SOCKET_IFNAME",
         "an-interface-name-that-is-much-too-long-to-fit-in-sixty-four-bytes",
         "longer than 63 bytes"},
        {"TP_TCP_SNDBUF", "2G", "not a size between 0 and 1G"},
        {"TP_TCP_RCVBUF", "lots", "not a size between 0 and 1G"},
        {"TP_CONNECT_TIMEOUT_MS", "-5", "not a duration between 1 and"},
        {"TP_HANDSHAKE_TIMEOUT_MS", "", "not a duration"},
        {"TP_SHM_RING_SIZE", "3M", "not a power of two between 64K and 1G"},
        {"TP_SHM_SPIN_US", "50us", "not an integer between 0 and 1000000"},
        {"TP_LOOP_SPIN_US", "2000000", "not an integer between 0 and 1000000"},
        {"TP_POOL_THREADS", "many", "not an integer between 1 and 1024"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        clear_env();
        // A valid variable alongside, on the other side of the table.
        bool late = strcmp(cases[i].env, "TP_POOL_THREADS") != 0;
        setenv(late ? "TP_POOL_THREADS" : "TP_LOG_LEVEL", late ? "9" : "info",
               1);
        setenv(cases[i].env, cases[i].value, 1);

        tp_config cfg;
        tp_error *err = NULL;
        TP_CHECKF(tp__config_load(&cfg, &err) == TP_EINVAL, "%s=%s accepted",
                  cases[i].env, cases[i].value);
        TP_CHECK_EQ(tp_error_status(err), TP_EINVAL);
        char expect[256];
        snprintf(expect, sizeof(expect), "%s=%s: %s", cases[i].env,
                 cases[i].value, cases[i].accepted);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), expect);
        tp_error_unref(err);

        // The bad field has its default, the good one its value.
        tp_config def;
        tp__config_defaults(&def);
        if (late) {
            TP_CHECK_EQ(cfg.pool_threads, 9);
            cfg.pool_threads = def.pool_threads;
        } else {
            TP_CHECK_EQ(cfg.log_level, TP_LOG_LEVEL_INFO);
            cfg.log_level = def.log_level;
        }
        TP_CHECKF(memcmp(&cfg, &def, sizeof(cfg)) == 0,
                  "%s: other fields changed", cases[i].env);
    }
}

static void
test_first_error_returned(void)
{
    clear_env();
    // Table order: log_level comes before shm_ring_size.
    setenv("TP_SHM_RING_SIZE", "100K", 1);
    setenv("TP_LOG_LEVEL", "chatty", 1);
    setenv("TP_POOL_THREADS", "2", 1);

    tp_config cfg;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp__config_load(&cfg, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_LOG_LEVEL=chatty");
    tp_error_unref(err);
    TP_CHECK_EQ(cfg.log_level, 0);
    TP_CHECK_EQ(cfg.shm_ring_size, 512 << 10);
    TP_CHECK_EQ(cfg.pool_threads, 2);

    // A NULL err_p is fine.
    TP_CHECK_EQ(tp__config_load(&cfg, NULL), TP_EINVAL);
}

static void
test_set_by_name(void)
{
    tp_config cfg;
    tp_error *err = NULL;
    tp__config_defaults(&cfg);

    TP_CHECK_OK(tp__config_set(&cfg, "shm_ring_size", "8M", &err), err);
    TP_CHECK_EQ(cfg.shm_ring_size, 8 << 20);
    TP_CHECK_OK(tp__config_set(&cfg, "TP_SHM_RING_SIZE", "16M", &err), err);
    TP_CHECK_EQ(cfg.shm_ring_size, 16 << 20);

    TP_CHECK_EQ(tp__config_set(&cfg, "TP_SHM_RING_SIZE", "3M", &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "TP_SHM_RING_SIZE=3M: not a power of two between "
                          "64K and 1G");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(cfg.shm_ring_size, 16 << 20);

    TP_CHECK_EQ(tp__config_set(&cfg, "no_such_thing", "1", &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "no_such_thing");
    tp_error_unref(err);
    err = NULL;
    // Names are exact: neither lower-case env names nor partial names.
    TP_CHECK_EQ(tp__config_set(&cfg, "tp_shm_ring_size", "8M", NULL),
                TP_EINVAL);
    TP_CHECK_EQ(tp__config_set(&cfg, "shm_ring", "8M", NULL), TP_EINVAL);
    TP_CHECK_EQ(cfg.shm_ring_size, 16 << 20);
}

typedef struct seen_item {
    char name[64];
    char env[64];
    char def[64];
    char value[256];
    char source[16];
    char component[32];
    char accepted[256];
    bool has_doc;
} seen_item;

#define VISIT_MAX 256

typedef struct visit_log {
    seen_item items[VISIT_MAX];
    int n;
} visit_log;

static void
record_item(const tp_config_item *item, void *arg)
{
    visit_log *log = arg;
    TP_CHECK(log->n < VISIT_MAX);
    seen_item *s = &log->items[log->n++];
    snprintf(s->name, sizeof(s->name), "%s", item->name);
    snprintf(s->env, sizeof(s->env), "%s", item->env);
    snprintf(s->def, sizeof(s->def), "%s", item->def);
    snprintf(s->value, sizeof(s->value), "%s", item->value);
    snprintf(s->source, sizeof(s->source), "%s", item->source);
    snprintf(s->component, sizeof(s->component), "%s", item->component);
    snprintf(s->accepted, sizeof(s->accepted), "%s", item->accepted);
    s->has_doc = item->doc != NULL && item->doc[0] != '\0';
}

static const seen_item *
find_item(const visit_log *log, const char *name)
{
    for (int i = 0; i < log->n; i++) {
        if (strcmp(log->items[i].name, name) == 0) {
            return &log->items[i];
        }
    }
    tp_test_fail(__FILE__, __LINE__, "item %s not visited", name);
}

static void
test_visit(void)
{
    clear_env();
    setenv("TP_SHM_RING_SIZE", "8388608", 1);
    setenv("TP_IO_BACKEND", "epoll", 1);
    setenv("TP_SOCKET_IFNAME", "eth0", 1);

    static visit_log log;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_config_visit(record_item, &log, &err), err);
    // Every tunable of tp_config, and the ones components read themselves.
    TP_CHECK(log.n > (int)(sizeof(all_env) / sizeof(all_env[0])));
    for (size_t i = 0; i < sizeof(all_env) / sizeof(all_env[0]); i++) {
        int seen = 0;
        for (int j = 0; j < log.n; j++) {
            seen += strcmp(log.items[j].env, all_env[i]) == 0;
        }
        TP_CHECKF(seen == 1, "%s visited %d times", all_env[i], seen);
    }
    for (int i = 0; i < log.n; i++) {
        const seen_item *s = &log.items[i];
        // env is TP_ + the upper-cased name.
        char env[64] = "TP_";
        for (size_t j = 0; s->name[j] != '\0'; j++) {
            env[3 + j] = (char)toupper((unsigned char)s->name[j]);
            env[4 + j] = '\0';
        }
        TP_CHECKF(strcmp(s->env, env) == 0, "%s has env %s", s->name, s->env);
        TP_CHECKF(s->has_doc, "%s has no doc", s->name);
        TP_CHECKF(s->component[0] != '\0', "%s has no component", s->name);
        TP_CHECKF(s->accepted[0] != '\0', "%s says not what it accepts",
                  s->name);
    }
    const seen_item *ring = find_item(&log, "shm_ring_size");
    TP_CHECK(strcmp(ring->source, "env") == 0);
    TP_CHECK(strcmp(ring->value, "8M") == 0);
    TP_CHECK(strcmp(ring->def, "512K") == 0);
    const seen_item *io = find_item(&log, "io_backend");
    TP_CHECK(strcmp(io->source, "env") == 0);
    TP_CHECK(strcmp(io->value, "epoll") == 0);
    TP_CHECK(strcmp(io->def, "auto") == 0);
    const seen_item *ifname = find_item(&log, "socket_ifname");
    TP_CHECK(strcmp(ifname->source, "env") == 0);
    TP_CHECK(strcmp(ifname->value, "eth0") == 0);
    const seen_item *pool = find_item(&log, "pool_threads");
    TP_CHECK(strcmp(pool->source, "default") == 0);
    TP_CHECK(strcmp(pool->value, "4") == 0);
    TP_CHECK(strcmp(pool->def, "4") == 0);
    const seen_item *ct = find_item(&log, "connect_timeout_ms");
    TP_CHECK(strcmp(ct->source, "default") == 0);
    TP_CHECK(strcmp(ct->value, "10000") == 0);
    const seen_item *lvl = find_item(&log, "log_level");
    TP_CHECK(strcmp(lvl->value, "off") == 0);
    TP_CHECK(strcmp(lvl->component, "core") == 0);
    TP_CHECK(strcmp(lvl->accepted, "off|error|warn|info|debug|trace or 0..5") ==
             0);
    TP_CHECK(strcmp(ring->component, "shm") == 0);
    TP_CHECK(strcmp(ring->accepted, "64K..1G bytes, a power of two") == 0);
    TP_CHECK(strcmp(pool->accepted, "1..1024 threads") == 0);
    TP_CHECK(strcmp(ct->accepted, "1..86400000 ms") == 0);
    TP_CHECK(strcmp(ct->component, "transport") == 0);
    TP_CHECK(strcmp(ifname->accepted, "text, up to 63 bytes") == 0);
    TP_CHECK(strcmp(find_item(&log, "tcp_sndbuf")->component, "tcp") == 0);
    TP_CHECK(strcmp(find_item(&log, "mpt_lanes")->component, "mpt") == 0);
    TP_CHECK(strcmp(find_item(&log, "cma_inline_max")->component, "cma") == 0);
    TP_CHECK(strcmp(find_item(&log, "pipe_max_tensors")->component, "pipe") ==
             0);
    TP_CHECK(strcmp(find_item(&log, "store_timeout_ms")->component, "store") ==
             0);
    TP_CHECK(strcmp(find_item(&log, "rpc_timeout_ms")->component, "agent") ==
             0);
    TP_CHECK(strcmp(find_item(&log, "coll_engine")->component, "collectives") ==
             0);
}

// The variables their components read themselves at other times are
// listed too, with their raw value; the job secret's value never is.
static void
test_visit_external(void)
{
    clear_env();
    setenv("TP_INIT_METHOD", "tcp://somehost:29500", 1);
    setenv("TP_TRANSPORTS", "tcp,nope", 1);
    setenv("TP_JOB_TOKEN", "0123456789abcdef-very-secret", 1);
    setenv("TP_RPC_MAX_MESSAGE_BYTES", "lots", 1);
    unsetenv("TP_FAULT");
    unsetenv("TP_CHANNELS");

    static visit_log log;
    tp_error *err = NULL;
    // Not checked here: their components check them when they read them.
    TP_CHECK_OK(tp_config_visit(record_item, &log, &err), err);
    const seen_item *im = find_item(&log, "init_method");
    TP_CHECK(strcmp(im->env, "TP_INIT_METHOD") == 0);
    TP_CHECK(strcmp(im->component, "store") == 0);
    TP_CHECK(strcmp(im->source, "env") == 0);
    TP_CHECK(strcmp(im->value, "tcp://somehost:29500") == 0);
    TP_CHECK(strcmp(im->def, "env://") == 0);
    const seen_item *tr = find_item(&log, "transports");
    TP_CHECK(strcmp(tr->component, "pipe") == 0);
    TP_CHECK(strcmp(tr->value, "tcp,nope") == 0);
    const seen_item *ch = find_item(&log, "channels");
    TP_CHECK(strcmp(ch->source, "default") == 0);
    const seen_item *tok = find_item(&log, "job_token");
    TP_CHECK(strcmp(tok->component, "auth") == 0);
    TP_CHECK(strcmp(tok->source, "env") == 0);
    TP_CHECK(strstr(tok->value, "secret") == NULL);
    TP_CHECK_STR_CONTAINS(tok->value, "not shown");
    const seen_item *fault = find_item(&log, "fault");
    TP_CHECK(strcmp(fault->component, "transport") == 0);
    TP_CHECK(strcmp(fault->source, "default") == 0);
    const seen_item *mm = find_item(&log, "rpc_max_message_bytes");
    TP_CHECK(strcmp(mm->component, "agent") == 0);
    TP_CHECK(strcmp(mm->value, "lots") == 0);
    TP_CHECK(strcmp(mm->def, "8G") == 0);
    (void)find_item(&log, "store_max_conns");
    (void)find_item(&log, "pg_flight_recorder");
    (void)find_item(&log, "auth_warn");

    // tp__config_load leaves them alone; tp__config_set refuses them.
    tp_config cfg;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    TP_CHECK_EQ(tp__config_set(&cfg, "TP_INIT_METHOD", "env://", &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_INIT_METHOD");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "store");
    tp_error_unref(err);
}

// A malformed value: TP_EINVAL, every item still visited, the bad value
// shown next to the default actually used.
static void
test_visit_malformed(void)
{
    clear_env();
    setenv("TP_SHM_RING_SIZE", "3M", 1);
    setenv("TP_POOL_THREADS", "8", 1);

    static visit_log log;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_config_visit(record_item, &log, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "TP_SHM_RING_SIZE=3M");
    tp_error_unref(err);
    TP_CHECK(log.n > (int)(sizeof(all_env) / sizeof(all_env[0])));
    const seen_item *ring = find_item(&log, "shm_ring_size");
    TP_CHECK(strcmp(ring->source, "env") == 0);
    TP_CHECK_STR_CONTAINS(ring->value, "3M");
    TP_CHECK_STR_CONTAINS(ring->value, "invalid");
    TP_CHECK_STR_CONTAINS(ring->value, "512K");
    const seen_item *pool = find_item(&log, "pool_threads");
    TP_CHECK(strcmp(pool->source, "env") == 0);
    TP_CHECK(strcmp(pool->value, "8") == 0);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_defaults),
    TP_TEST_CASE(test_env_override),
    TP_TEST_CASE(test_env_read_each_load),
    TP_TEST_CASE(test_enum_forms),
    TP_TEST_CASE(test_size_suffixes),
    TP_TEST_CASE(test_bounds),
    TP_TEST_CASE(test_malformed_env),
    TP_TEST_CASE(test_first_error_returned),
    TP_TEST_CASE(test_set_by_name),
    TP_TEST_CASE(test_visit),
    TP_TEST_CASE(test_visit_malformed),
    TP_TEST_CASE(test_visit_external),
};

TP_TEST_MAIN(cases)
