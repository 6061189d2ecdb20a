// SPDX-License-Identifier: Apache-2.0
// tunables_test.c - the components' tables themselves (core/tunables.h):
// one per component, reached through the backends' ops, names and bounds,
// the components' own structs inside tp_config, and the declared defaults
// and bounds of the variables that components read themselves agreeing
// with those readers (the agent's options, the store server's bounds, the
// process groups' flight recorder, the init method).

#include "tp_test.h"

#include <stdlib.h>

#include <tpipe/rpc.h>

#include "agent/ag_impl.h"
#include "channel/channel.h"
#include "collectives/pg_impl.h"
#include "config.h"
#include "config_rows.h"
#include "store/tcp_server_int.h"
#include "transport/transport.h"

// The external row of @env.
static const tp_tunable *
external_row(const char *env)
{
    const tp_tunables *ts;
    for (size_t i = 0; (ts = tp__tunables_at(i)) != NULL; i++) {
        for (size_t j = 0; j < ts->ts_nrows; j++) {
            const tp_tunable *t = &ts->ts_rows[j];
            if (strcmp(t->tu_env, env) == 0) {
                TP_CHECK((t->tu_flags & TP_TUNABLE_EXTERNAL) != 0);
                return t;
            }
        }
    }
    tp_test_fail(__FILE__, __LINE__, "%s is declared nowhere", env);
}

// @text ("8G", "300000") as a number, by core's size parser.
static int64_t
parse_size(const char *text)
{
    static const tp_tunable any_size = {
        .tu_name = "any",
        .tu_env = "TP_ANY",
        .tu_type = TP_TUNABLE_SIZE,
        .tu_size = sizeof(int64_t),
        .tu_min = 0,
        .tu_max = INT64_MAX,
    };
    int64_t v = -1;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__tunable_apply(&any_size, &v, "default", text, &err), err);
    return v;
}

static int64_t
declared_default(const char *env)
{
    return parse_size(external_row(env)->tu_def);
}

// "A..B ..." of an external row's accepted text: its bounds.
static void
declared_bounds(const char *env, int64_t *lo_p, int64_t *hi_p)
{
    const char *acc = external_row(env)->tu_accepted;
    char lo[32], hi[32];
    TP_CHECKF(sscanf(acc, "%31[0-9KMGT]..%31[0-9KMGT]", lo, hi) == 2,
              "%s: accepted \"%s\" is not A..B", env, acc);
    *lo_p = parse_size(lo);
    *hi_p = parse_size(hi);
}

static void
clear_tp_env(void)
{
    static const char *const vars[] = {
        "TP_RPC_MAX_MESSAGE_BYTES",
        "TP_RPC_MAX_PEER_INFLIGHT_BYTES",
        "TP_RPC_FAULTY",
        "TP_RPC_FLIGHT_RECORDER",
        "TP_INIT_METHOD",
        "TP_TRANSPORTS",
        "TP_CHANNELS",
        "TP_STORE_MAX_CONNS",
        "TP_STORE_IDLE_TIMEOUT_MS",
        "TP_STORE_REQUEST_TIMEOUT_MS",
        "TP_STORE_MAX_BYTES",
    };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        unsetenv(vars[i]);
    }
}

// The agent's options: tp_agent_options_init's defaults are the declared
// ones, and the declared bounds are those tp_rpc_init's check applies.
static void
test_agent_rows_agree(void)
{
    clear_tp_env();
    tp_agent_options o;
    tp_agent_options_init(&o);
    TP_CHECK_EQ((int64_t)o.max_message_bytes,
                declared_default("TP_RPC_MAX_MESSAGE_BYTES"));
    TP_CHECK_EQ((int64_t)o.max_peer_inflight_bytes,
                declared_default("TP_RPC_MAX_PEER_INFLIGHT_BYTES"));
    TP_CHECK_EQ((int64_t)o.flight_recorder,
                declared_default("TP_RPC_FLIGHT_RECORDER"));
    TP_CHECK(o.faulty == NULL);
    TP_CHECK(strcmp(external_row("TP_RPC_FAULTY")->tu_def, "") == 0);
    TP_CHECK(strcmp(o.init_method, external_row("TP_INIT_METHOD")->tu_def) ==
             0);
    TP_CHECK(o.transports == NULL && o.channels == NULL);
    TP_CHECK(strcmp(external_row("TP_TRANSPORTS")->tu_def, "") == 0);

    int64_t lo, hi;
    declared_bounds("TP_RPC_FLIGHT_RECORDER", &lo, &hi);
    const int64_t vals[] = {lo, hi, hi + 1};
    const bool oks[] = {true, true, false};
    for (size_t i = 0; i < 3; i++) {
        char text[32];
        snprintf(text, sizeof(text), "%lld", (long long)vals[i]);
        setenv("TP_RPC_FLIGHT_RECORDER", text, 1);
        tp_agent_options_init(&o);
        tp_error *err = NULL;
        tp_status st = tp__ag_options_check(&o, &err);
        TP_CHECKF((st == TP_OK) == oks[i], "TP_RPC_FLIGHT_RECORDER=%s: %s",
                  text, err ? tp_error_message(err) : "accepted");
        tp_error_unref(err);
    }
    unsetenv("TP_RPC_FLIGHT_RECORDER");
    declared_bounds("TP_RPC_MAX_MESSAGE_BYTES", &lo, &hi);
    char text[32];
    snprintf(text, sizeof(text), "%lld", (long long)(lo - 1));
    setenv("TP_RPC_MAX_MESSAGE_BYTES", text, 1);
    tp_agent_options_init(&o);
    TP_CHECK_EQ(tp__ag_options_check(&o, NULL), TP_EINVAL);
    snprintf(text, sizeof(text), "%lld", (long long)lo);
    setenv("TP_RPC_MAX_MESSAGE_BYTES", text, 1);
    tp_agent_options_init(&o);
    TP_CHECK_EQ(tp__ag_options_check(&o, NULL), TP_OK);
}

// The store server's bounds: defaults and ranges as declared.
static void
test_store_server_rows_agree(void)
{
    clear_tp_env();
    srv_limits l;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__srv_limits_load(NULL, 1 << 20, &l, &err), err);
    TP_CHECK_EQ(l.sl_max_conns, declared_default("TP_STORE_MAX_CONNS"));
    TP_CHECK_EQ(l.sl_idle_ms, declared_default("TP_STORE_IDLE_TIMEOUT_MS"));
    TP_CHECK_EQ(l.sl_request_ms,
                declared_default("TP_STORE_REQUEST_TIMEOUT_MS"));
    TP_CHECK_EQ(l.sl_max_bytes, declared_default("TP_STORE_MAX_BYTES"));

    static const char *const vars[] = {
        "TP_STORE_MAX_CONNS",
        "TP_STORE_IDLE_TIMEOUT_MS",
        "TP_STORE_REQUEST_TIMEOUT_MS",
        "TP_STORE_MAX_BYTES",
    };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        int64_t lo, hi;
        declared_bounds(vars[i], &lo, &hi);
        const int64_t vals[] = {lo, hi, hi + 1};
        const bool oks[] = {true, true, false};
        for (size_t k = 0; k < 3; k++) {
            char text[32];
            snprintf(text, sizeof(text), "%lld", (long long)vals[k]);
            setenv(vars[i], text, 1);
            tp_status st = tp__srv_limits_load(NULL, 1 << 20, &l, &err);
            TP_CHECKF((st == TP_OK) == oks[k], "%s=%s: %s", vars[i], text,
                      err ? tp_error_message(err) : "accepted");
            tp_error_unref(err);
            err = NULL;
        }
        unsetenv(vars[i]);
    }
}

static void
test_pg_flight_recorder_row_agrees(void)
{
    TP_CHECK_EQ(declared_default("TP_PG_FLIGHT_RECORDER"), PG_FR_DEFAULT);
    int64_t lo, hi;
    declared_bounds("TP_PG_FLIGHT_RECORDER", &lo, &hi);
    TP_CHECK_EQ(lo, 0);
    TP_CHECK_EQ(hi, PG_FR_MAX);
}

// The tables themselves: one per component, names unique over all of
// them, TP_ + upper-cased name, bounds that hold the default, each
// backend's table reached through its ops in the registries, and the own
// structs within cfg_own without overlapping.
static void
test_tables(void)
{
    static const char *const components[] = {
        "core", "auth", "transport", "tcp",         "shm",      "mpt",
        "cma",  "pipe", "store",     "collectives", "autograd", "agent",
    };
    bool found[sizeof(components) / sizeof(components[0])] = {false};
    const tp_tunables *ts;
    size_t own_bytes = 0;
    tp_config def;
    tp__config_defaults(&def);
    for (size_t i = 0; (ts = tp__tunables_at(i)) != NULL; i++) {
        for (size_t k = 0; k < i; k++) {
            TP_CHECKF(
                strcmp(tp__tunables_at(k)->ts_component, ts->ts_component) != 0,
                "two tables of %s", ts->ts_component);
        }
        for (size_t c = 0; c < sizeof(components) / sizeof(components[0]);
             c++) {
            found[c] = found[c] || strcmp(components[c], ts->ts_component) == 0;
        }
        if (ts->ts_store == TP_TUNABLES_OWN) {
            TP_CHECK(ts->ts_size > 0);
            const unsigned char *p = tp__config_own_const(&def, ts);
            TP_CHECK(p >= def.cfg_own &&
                     p + ts->ts_size <= def.cfg_own + TP_CONFIG_OWN_BYTES);
            TP_CHECK(p >= def.cfg_own + own_bytes); // after the previous
            own_bytes = (size_t)(p - def.cfg_own) + ts->ts_size;
        }
        for (size_t j = 0; j < ts->ts_nrows; j++) {
            const tp_tunable *t = &ts->ts_rows[j];
            TP_CHECKF(strncmp(t->tu_env, "TP_", 3) == 0, "%s", t->tu_env);
            TP_CHECKF(t->tu_doc != NULL && t->tu_def != NULL, "%s", t->tu_env);
            if ((t->tu_flags & TP_TUNABLE_EXTERNAL) != 0) {
                TP_CHECKF(t->tu_accepted != NULL, "%s", t->tu_env);
                continue;
            }
            TP_CHECKF(t->tu_min <= t->tu_max, "%s", t->tu_env);
            if (t->tu_type != TP_TUNABLE_STR) {
                // The default renders back to text the parser accepts
                // with the same value.
                const void *base;
                (void)find_row(&def, t->tu_name, &base);
                char text[64];
                tp__tunable_format(t, base, text, sizeof(text));
                tp_config again = def;
                TP_CHECK_OK(tp__config_set(&again, t->tu_env, text, NULL),
                            NULL);
                TP_CHECKF(memcmp(&again, &def, sizeof(def)) == 0, "%s=%s",
                          t->tu_env, text);
            }
        }
    }
    for (size_t c = 0; c < sizeof(components) / sizeof(components[0]); c++) {
        TP_CHECKF(found[c], "no table of %s", components[c]);
    }
    // Backends' tables come through their ops.
    size_t n;
    const tp_transport_ops *const *tr = tp__transport_registry(&n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(tr[i]->name, "tcp") == 0 ||
            strcmp(tr[i]->name, "shm") == 0) {
            TP_CHECK(tr[i]->tunables != NULL);
            TP_CHECK(strcmp(tr[i]->tunables->ts_component, tr[i]->name) == 0);
        }
    }
    const tp_channel_ops *const *ch = tp__channel_registry(&n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ch[i]->name, "mpt") == 0 ||
            strcmp(ch[i]->name, "cma") == 0) {
            TP_CHECK(ch[i]->tunables != NULL);
            TP_CHECK(strcmp(ch[i]->tunables->ts_component, ch[i]->name) == 0);
        }
    }
}

// A component's own struct (tcp's, cma's) lives in tp_config: set, loaded
// from the environment and copied with it, apart from every other field.
static void
test_own_storage(void)
{
    unsetenv("TP_TCP_SNDBUF");
    unsetenv("TP_TCP_USER_TIMEOUT_MS");
    setenv("TP_CMA_INLINE_MAX", "4K", 1);
    tp_config cfg;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__config_load(&cfg, &err), err);
    TP_CHECK_EQ(int_of(&cfg, "cma_inline_max"), 4096);
    TP_CHECK_EQ(int_of(&cfg, "tcp_sndbuf"), 1 << 20);

    tp_config before = cfg;
    TP_CHECK_OK(tp__config_set(&cfg, "tcp_user_timeout_ms", "2s", &err), err);
    TP_CHECK_EQ(int_of(&cfg, "tcp_user_timeout_ms"), 2000);
    TP_CHECK_EQ(int_of(&cfg, "cma_inline_max"), 4096);
    TP_CHECK_EQ(int_of(&cfg, "tcp_sndbuf"), 1 << 20);
    // Only those 8 bytes changed.
    size_t diff = 0;
    for (size_t i = 0; i < sizeof(cfg); i++) {
        diff += ((unsigned char *)&cfg)[i] != ((unsigned char *)&before)[i];
    }
    TP_CHECK(diff >= 1 && diff <= sizeof(int64_t));
    tp_config copy = cfg;
    TP_CHECK_EQ(int_of(&copy, "tcp_user_timeout_ms"), 2000);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_tables),
    TP_TEST_CASE(test_own_storage),
    TP_TEST_CASE(test_agent_rows_agree),
    TP_TEST_CASE(test_store_server_rows_agree),
    TP_TEST_CASE(test_pg_flight_recorder_row_agrees),
};

TP_TEST_MAIN(cases)
