// SPDX-License-Identifier: Apache-2.0
// info.c - `tpipe info`: version, features, loop backends and transports
// (viability, domain descriptor, default listen address); `--config`: the
// table of every tunable with its effective value.

#include <stdlib.h>
#include <string.h>
#include <tpipe/tpipe.h>

#include "collectives/nccl.h"
#include "collectives/shm.h"
#include "core/config.h"
#include "core/loop.h"
#include "tool.h"
#include "transport/transport.h"

static void
info_usage(FILE *f)
{
    fputs("usage: tpipe info [--config] [--json]\n"
          "       tpipe info --connect URL [--timeout MS] [--transports L] "
          "[--channels L]\n"
          "       tpipe info --listen [URL] [--count N] [--timeout MS] "
          "[--transports L]\n"
          "                  [--channels L]\n"
          "\n"
          "  (no option)  version, features compiled in, loop backends "
          "(epoll, uring:\n"
          "               viable or why not) and, for each transport: viable "
          "or why\n"
          "               not, its domain descriptor and the address it "
          "listens on\n"
          "               by default\n"
          "  --config     every tunable: name, environment variable, default,"
          "\n"
          "               effective value, source (default|env), doc\n"
          "  --json       one JSON object instead of text\n"
          "  --connect URL  open a pipe to a listener (another `tpipe info "
          "--listen`,\n"
          "               or any tpipe application) and print what the "
          "handshake\n"
          "               chose and why each other transport and channel was"
          "\n"
          "               refused\n"
          "  --listen [URL] listen (tcp on URL, default: every transport's "
          "default\n"
          "               address), print the report of each pipe accepted\n"
          "  --count N    --listen: stop after N pipes (default 1; 0 = "
          "forever)\n"
          "  --timeout MS deadline of the connect / of each accept "
          "(default 10000)\n"
          "  --transports L, --channels L  allow lists, as the context "
          "options\n"
          "\n"
          "Exit status 2 if a TP_* environment variable is malformed (the "
          "message\n"
          "names it); everything is still printed.\n",
          f);
}

// ---- info --config ---------------------------------------------------------

typedef struct info_item {
    char *ii_name, *ii_env, *ii_def, *ii_value, *ii_source, *ii_doc;
} info_item;

typedef struct info_items {
    info_item *is_v;
    size_t is_n, is_cap;
} info_items;

static char *
info_dup(const char *s)
{
    return strdup(s ? s : "");
}

static void
info_collect_cb(const tp_config_item *item, void *arg)
{
    info_items *is = arg;
    if (is->is_n == is->is_cap) {
        size_t cap = is->is_cap ? 2 * is->is_cap : 32;
        info_item *nv = realloc(is->is_v, cap * sizeof(*nv));
        if (nv == NULL) {
            return;
        }
        is->is_v = nv;
        is->is_cap = cap;
    }
    info_item *ii = &is->is_v[is->is_n++];
    ii->ii_name = info_dup(item->name);
    ii->ii_env = info_dup(item->env);
    ii->ii_def = info_dup(item->def);
    ii->ii_value = info_dup(item->value);
    ii->ii_source = info_dup(item->source);
    ii->ii_doc = info_dup(item->doc);
}

static int
info_config(bool json)
{
    info_items is = {0};
    tp_error *err = NULL;
    tp_status st = tp_config_visit(info_collect_cb, &is, &err);

    if (json) {
        fputs("{\"config\":[", stdout);
        for (size_t i = 0; i < is.is_n; i++) {
            info_item *ii = &is.is_v[i];
            fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
            tool_json_str(stdout, ii->ii_name);
            fputs(",\"env\":", stdout);
            tool_json_str(stdout, ii->ii_env);
            fputs(",\"default\":", stdout);
            tool_json_str(stdout, ii->ii_def);
            fputs(",\"value\":", stdout);
            tool_json_str(stdout, ii->ii_value);
            fputs(",\"source\":", stdout);
            tool_json_str(stdout, ii->ii_source);
            fputs(",\"doc\":", stdout);
            tool_json_str(stdout, ii->ii_doc);
            fputc('}', stdout);
        }
        fputs("],\"error\":", stdout);
        if (st != TP_OK) {
            tool_json_str(stdout,
                          err ? tp_error_message(err) : tp_status_name(st));
        } else {
            fputs("null", stdout);
        }
        fputs("}\n", stdout);
    } else {
        tool_table t;
        tool_table_init(&t, 6);
        const char *hdr[] = {"NAME",  "ENV",    "DEFAULT",
                             "VALUE", "SOURCE", "DOC"};
        tool_table_add(&t, hdr);
        for (size_t i = 0; i < is.is_n; i++) {
            info_item *ii = &is.is_v[i];
            // Empty strings show as "-" so the columns stay readable.
            const char *row[] = {ii->ii_name,
                                 ii->ii_env,
                                 ii->ii_def[0] ? ii->ii_def : "-",
                                 ii->ii_value[0] ? ii->ii_value : "-",
                                 ii->ii_source,
                                 ii->ii_doc};
            tool_table_add(&t, row);
        }
        tool_table_print(&t, stdout);
        tool_table_fini(&t);
    }
    fflush(stdout);
    if (st != TP_OK) {
        tool_err("%s", err ? tp_error_message(err) : tp_status_name(st));
    }
    tp_error_unref(err);
    for (size_t i = 0; i < is.is_n; i++) {
        info_item *ii = &is.is_v[i];
        free(ii->ii_name);
        free(ii->ii_env);
        free(ii->ii_def);
        free(ii->ii_value);
        free(ii->ii_source);
        free(ii->ii_doc);
    }
    free(is.is_v);
    return st == TP_OK ? TOOL_EXIT_OK : TOOL_EXIT_USAGE;
}

// ---- info ------------------------------------------------------------------

typedef struct info_transport {
    const char *it_name;
    bool it_viable;
    char it_why[256];
    char it_domain[256];
    char it_addr[256];
    char it_error[512]; // creating or listening failed although viable
} info_transport;

static void
info_probe_transport(const tp_transport_ops *ops, tp_loop *loop,
                     const tp_config *cfg, info_transport *it)
{
    memset(it, 0, sizeof(*it));
    it->it_name = ops->name;
    it->it_viable = ops->is_viable(cfg, it->it_why, sizeof(it->it_why));
    if (!it->it_viable) {
        return;
    }
    if (loop == NULL) {
        snprintf(it->it_error, sizeof(it->it_error), "no loop");
        return;
    }
    tp_transport *t = NULL;
    tp_error *err = NULL;
    if (tp__transport_create(ops->name, loop, cfg, &t, &err) != TP_OK) {
        snprintf(it->it_error, sizeof(it->it_error), "%s",
                 tp_error_message(err));
        tp_error_unref(err);
        return;
    }
    snprintf(it->it_domain, sizeof(it->it_domain), "%s",
             tp__transport_domain(t));
    tp_listener *l = NULL;
    if (tp__transport_listen(t, NULL, &l, &err) != TP_OK) {
        snprintf(it->it_error, sizeof(it->it_error), "%s",
                 tp_error_message(err));
        tp_error_unref(err);
    } else {
        snprintf(it->it_addr, sizeof(it->it_addr), "%s", tp__listener_addr(l));
        tp__listener_destroy(l);
    }
    tp__transport_destroy(t);
}

static void
info_json_opt(const char *key, const char *s)
{
    printf(",\"%s\":", key);
    if (s != NULL && s[0] != '\0') {
        tool_json_str(stdout, s);
    } else {
        fputs("null", stdout);
    }
}

static int
info_main(bool json)
{
    int rc = TOOL_EXIT_OK;
    tp_config cfg;
    tp_error *err = NULL;
    char cfg_error[512] = "";
    if (tp__config_load(&cfg, &err) != TP_OK) {
        // Keep going with the defaults for the bad field: the rest of the
        // report is still useful to diagnose the host.
        snprintf(cfg_error, sizeof(cfg_error), "%s", tp_error_message(err));
        tp_error_unref(err);
        err = NULL;
        rc = TOOL_EXIT_USAGE;
    }

    char uring_why[256] = "";
    bool uring_ok = tp__loop_uring_viable(uring_why, sizeof(uring_why));
    char shm_why[384] = "", nccl_why[256] = "";
    bool shm_ok = tp__shm_viable(shm_why, sizeof(shm_why));
    bool nccl_ok = tp__nccl_available(nccl_why, sizeof(nccl_why));

    // One loop with the configured backend (auto by default), on which
    // each viable transport is created to read its domain and address.
    tp_loop *loop = NULL;
    char loop_error[512] = "";
    if (tp__loop_create(&cfg, "info", &loop, &err) != TP_OK) {
        snprintf(loop_error, sizeof(loop_error), "%s", tp_error_message(err));
        tp_error_unref(err);
        err = NULL;
        rc = TOOL_EXIT_FAIL;
    }
    const char *loop_backend = loop ? tp__loop_backend_name(loop) : "";

    size_t n = 0;
    const tp_transport_ops *const *ops = tp__transport_registry(&n);
    info_transport *its = calloc(n ? n : 1, sizeof(*its));
    if (its == NULL) {
        tool_err("out of memory");
        return TOOL_EXIT_FAIL;
    }
    for (size_t i = 0; i < n; i++) {
        info_probe_transport(ops[i], loop, &cfg, &its[i]);
    }
    if (loop != NULL) {
        tp__loop_destroy(loop);
    }

    const char *feat = tp_build_features();
    if (json) {
        fputs("{\"version\":", stdout);
        tool_json_str(stdout, tp_version_string());
        fputs(",\"features\":[", stdout);
        char fbuf[256];
        snprintf(fbuf, sizeof(fbuf), "%s", feat);
        bool first = true;
        for (char *save = NULL, *tok = strtok_r(fbuf, " ", &save); tok != NULL;
             tok = strtok_r(NULL, " ", &save)) {
            if (!first) {
                fputc(',', stdout);
            }
            tool_json_str(stdout, tok);
            first = false;
        }
        fputs("],\"io_backend\":", stdout);
        tool_json_str(stdout, tp__io_backend_name(cfg.io_backend));
        info_json_opt("loop_backend", loop_backend);
        info_json_opt("loop_error", loop_error);
        fputs(",\"backends\":[{\"name\":\"epoll\",\"viable\":true,"
              "\"why\":null},{\"name\":\"uring\",\"viable\":",
              stdout);
        fputs(uring_ok ? "true" : "false", stdout);
        info_json_opt("why", uring_ok ? NULL : uring_why);
        fputs("}],\"transports\":[", stdout);
        for (size_t i = 0; i < n; i++) {
            info_transport *it = &its[i];
            fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
            tool_json_str(stdout, it->it_name);
            printf(",\"viable\":%s", it->it_viable ? "true" : "false");
            info_json_opt("why", it->it_viable ? NULL : it->it_why);
            info_json_opt("domain", it->it_domain);
            info_json_opt("listen_addr", it->it_addr);
            info_json_opt("error", it->it_error);
            fputc('}', stdout);
        }
        fputs("],\"collectives\":{\"engine\":", stdout);
        tool_json_str(stdout, cfg.coll_engine == TP_COLL_ENGINE_SHM ? "shm"
                              : cfg.coll_engine == TP_COLL_ENGINE_PIPE
                                  ? "pipe"
                                  : "auto");
        printf(",\"shm_viable\":%s", shm_ok ? "true" : "false");
        info_json_opt("shm_why", shm_ok ? NULL : shm_why);
        printf(",\"nccl_viable\":%s", nccl_ok ? "true" : "false");
        info_json_opt("nccl_why", nccl_ok ? NULL : nccl_why);
        fputc('}', stdout);
        info_json_opt("config_error", cfg_error);
        fputs("}\n", stdout);
    } else {
        printf("tpipe %s\n", tp_version_string());
        printf("features: %s\n", feat[0] ? feat : "(none)");
        printf("\nloop backends (TP_IO_BACKEND=%s",
               tp__io_backend_name(cfg.io_backend));
        if (loop_backend[0]) {
            printf(" -> %s", loop_backend);
        }
        printf("):\n");
        tool_table t;
        tool_table_init(&t, 2);
        const char *r1[] = {"  epoll", "viable"};
        tool_table_add(&t, r1);
        char why[300];
        snprintf(why, sizeof(why), "not viable: %s", uring_why);
        const char *r2[] = {"  uring", uring_ok ? "viable" : why};
        tool_table_add(&t, r2);
        tool_table_print(&t, stdout);
        tool_table_fini(&t);
        if (loop_error[0]) {
            printf("  (could not start a loop: %s)\n", loop_error);
        }

        printf("\ntransports (best first):\n");
        tool_table_init(&t, 4);
        const char *hdr[] = {"  NAME", "VIABLE", "DOMAIN",
                             "DEFAULT LISTEN ADDRESS"};
        tool_table_add(&t, hdr);
        for (size_t i = 0; i < n; i++) {
            info_transport *it = &its[i];
            char name[64], viable[300];
            snprintf(name, sizeof(name), "  %s", it->it_name);
            if (it->it_viable) {
                snprintf(viable, sizeof(viable), "yes");
            } else {
                snprintf(viable, sizeof(viable), "no: %s", it->it_why);
            }
            const char *row[] = {name, viable,
                                 it->it_domain[0] ? it->it_domain : "-",
                                 it->it_addr[0] ? it->it_addr : "-"};
            tool_table_add(&t, row);
        }
        tool_table_print(&t, stdout);
        tool_table_fini(&t);
        for (size_t i = 0; i < n; i++) {
            if (its[i].it_error[0]) {
                printf("  %s: %s\n", its[i].it_name, its[i].it_error);
            }
        }
        printf("\ncollectives (TP_COLL_ENGINE=%s):\n",
               cfg.coll_engine == TP_COLL_ENGINE_SHM    ? "shm"
               : cfg.coll_engine == TP_COLL_ENGINE_PIPE ? "pipe"
                                                        : "auto");
        printf("  shm engine   %s%s\n",
               shm_ok ? "viable here (used when every member of a group is "
                        "on this host)"
                      : "not viable: ",
               shm_ok ? "" : shm_why);
        printf("  pipe engine  viable (every group; over the transports "
               "above)\n");
        printf("  nccl         %s%s\n",
               nccl_ok ? "viable (CUDA tensors)" : "not viable: ",
               nccl_ok ? "" : nccl_why);
    }
    fflush(stdout);
    if (cfg_error[0]) {
        tool_err("%s", cfg_error);
    }
    for (size_t i = 0; i < n; i++) {
        if (its[i].it_error[0] && rc == TOOL_EXIT_OK) {
            rc = TOOL_EXIT_FAIL;
        }
    }
    free(its);
    return rc;
}

int
tool_info_main(int argc, char **argv)
{
    bool config = false, json = false, listen = false, bad = false;
    const char *connect = NULL, *listen_url = NULL, *v = NULL;
    const char *transports = NULL, *channels = NULL;
    uint64_t timeout_ms = 10000, count = 1;
    for (int i = 1; i < argc; i++) {
        if (tool_opt_value(argc, argv, &i, "--connect", &connect, &bad) ||
            tool_opt_value(argc, argv, &i, "--transports", &transports, &bad) ||
            tool_opt_value(argc, argv, &i, "--channels", &channels, &bad)) {
            continue;
        }
        if (tool_opt_value(argc, argv, &i, "--timeout", &v, &bad)) {
            if (!tool_parse_u64(v, &timeout_ms)) {
                tool_err("info: --timeout \"%s\": expected milliseconds", v);
                return TOOL_EXIT_USAGE;
            }
            continue;
        }
        if (tool_opt_value(argc, argv, &i, "--count", &v, &bad)) {
            if (!tool_parse_u64(v, &count)) {
                tool_err("info: --count \"%s\": expected a number", v);
                return TOOL_EXIT_USAGE;
            }
            continue;
        }
        if (bad) {
            return TOOL_EXIT_USAGE;
        }
        if (strcmp(argv[i], "--listen") == 0) {
            listen = true;
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                listen_url = argv[++i];
            }
        } else if (strcmp(argv[i], "--config") == 0) {
            config = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "-h") == 0 ||
                   strcmp(argv[i], "--help") == 0) {
            info_usage(stdout);
            return TOOL_EXIT_OK;
        } else {
            tool_err("info: unknown option \"%s\"", argv[i]);
            info_usage(stderr);
            return TOOL_EXIT_USAGE;
        }
    }
    if (bad) {
        return TOOL_EXIT_USAGE;
    }
    if (connect != NULL) {
        return tool_info_connect(connect, (int64_t)timeout_ms, transports,
                                 channels);
    }
    if (listen) {
        return tool_info_listen(listen_url, (int64_t)timeout_ms, (long)count,
                                transports, channels);
    }
    return config ? info_config(json) : info_main(json);
}
