// SPDX-License-Identifier: Apache-2.0
// info.c - `tpipe info`: version, features, loop backends, transports
// (viability, domain descriptor, default listen address) and channels
// (viability) through the public lists of tpipe/info.h, the collective
// engines, the checked TP_TRANSPORTS / TP_CHANNELS / TP_INIT_METHOD and the
// launcher variables set; `--config` is info_config.c.

#include <stdlib.h>
#include <string.h>
#include <tpipe/tpipe.h>

#include "tool.h"

static void
info_usage(FILE *f)
{
    fputs("usage: tpipe info [--config[=COMPONENT]] [--json]\n"
          "       tpipe info --connect URL [--timeout MS] [--transports L] "
          "[--channels L]\n"
          "       tpipe info --listen [URL] [--count N] [--timeout MS] "
          "[--transports L]\n"
          "                  [--channels L]\n"
          "\n"
          "  (no option)  version, features compiled in, loop backends "
          "(uring, epoll:\n"
          "               viable or why not); for each transport: viable "
          "or why\n"
          "               not, its domain descriptor and the address it "
          "listens on\n"
          "               by default; for each channel: viable or why not; "
          "the\n"
          "               collective engines; TP_TRANSPORTS, TP_CHANNELS and"
          "\n"
          "               TP_INIT_METHOD checked; the launcher variables set"
          "\n"
          "               (RANK, WORLD_SIZE, MASTER_*, SLURM_*, OMPI_*, "
          "PMIX_*)\n"
          "  --config     every component's tunables: component, variable,"
          "\n"
          "               effective value, source (default|env), default,"
          "\n"
          "               what it accepts, doc (docs/configuration.md)\n"
          "  --config=COMPONENT  only that component's (core, tcp, pipe, "
          "agent, ...)\n"
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
          "Exit status 2 if a TP_* environment variable is malformed or "
          "names an\n"
          "unknown transport, channel or init method (the message names it "
          "and the\n"
          "valid values); everything is still printed.\n",
          f);
}

// ---- info ------------------------------------------------------------------

// The effective io_backend and coll_engine, from the tunables' table.
typedef struct info_cfg {
    char ic_io_backend[32];
    char ic_coll_engine[32];
} info_cfg;

static void
info_cfg_cb(const tp_config_item *item, void *arg)
{
    info_cfg *ic = arg;
    if (strcmp(item->name, "io_backend") == 0) {
        snprintf(ic->ic_io_backend, sizeof(ic->ic_io_backend), "%s",
                 item->value);
    } else if (strcmp(item->name, "coll_engine") == 0) {
        snprintf(ic->ic_coll_engine, sizeof(ic->ic_coll_engine), "%s",
                 item->value);
    }
}

// The environment variables that choose what a job uses: each is checked,
// and a bad one makes the exit status 2.
typedef struct info_env {
    const char *ie_name;
    const char *ie_value; // NULL when unset
    char ie_note[512];    // what unset means, or what is wrong
    bool ie_bad;
} info_env;

enum {
    INFO_ENV_TRANSPORTS,
    INFO_ENV_CHANNELS,
    INFO_ENV_INIT_METHOD,
    INFO_NENV
};

// The first unknown name of the comma-separated @list, with the valid ones.
static bool
info_check_names(tool_backend_kind kind, const char *list, char *note,
                 size_t len)
{
    const char *p = list;
    while (*p != '\0') {
        size_t n = strcspn(p, ",");
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)n, p);
        if (n > 0 && !tool_backend_known(kind, name)) {
            char known[256];
            tool_backend_names(kind, known, sizeof(known));
            snprintf(note, len, "unknown %s \"%s\" (valid: %s)",
                     tool_backend_kind_name(kind), name, known);
            return false;
        }
        p += n + (p[n] == ',');
    }
    return true;
}

static bool
info_check_init_method(const char *im, char *note, size_t len)
{
    static const char valid[] = "(valid: env://, tcp://HOST:PORT, "
                                "file:///PATH)";
    if (strcmp(im, "env://") == 0) {
        const char *a = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
        if (a == NULL || p == NULL) {
            snprintf(note, len,
                     "env:// reads MASTER_ADDR and MASTER_PORT "
                     "(%s not set here)",
                     a == NULL && p == NULL ? "both"
                     : a == NULL            ? "MASTER_ADDR"
                                            : "MASTER_PORT");
        }
        return true;
    }
    if (strncmp(im, "tcp://", 6) == 0) {
        const char *colon = strrchr(im + 6, ':');
        uint64_t port = 0;
        if (colon == NULL || colon == im + 6 ||
            !tool_parse_u64(colon + 1, &port) || port == 0 || port > 65535) {
            snprintf(note, len, "expected tcp://HOST:PORT %s", valid);
            return false;
        }
        return true;
    }
    if (strncmp(im, "file://", 7) == 0) {
        if (im[7] != '/') {
            snprintf(note, len, "expected file:///ABSOLUTE/PATH %s", valid);
            return false;
        }
        return true;
    }
    snprintf(note, len, "unknown init method %s", valid);
    return false;
}

static bool
info_check_env(info_env *env)
{
    static const char *const names[INFO_NENV] = {"TP_TRANSPORTS", "TP_CHANNELS",
                                                 "TP_INIT_METHOD"};
    bool ok = true;
    for (int i = 0; i < INFO_NENV; i++) {
        info_env *e = &env[i];
        memset(e, 0, sizeof(*e));
        e->ie_name = names[i];
        e->ie_value = getenv(names[i]);
        const char *v = e->ie_value;
        if (i == INFO_ENV_INIT_METHOD) {
            e->ie_bad = !info_check_init_method(v ? v : "env://", e->ie_note,
                                                sizeof(e->ie_note));
        } else if (v != NULL && v[0] != '\0') {
            e->ie_bad = !info_check_names(
                i == INFO_ENV_TRANSPORTS ? TOOL_TRANSPORT : TOOL_CHANNEL, v,
                e->ie_note, sizeof(e->ie_note));
        } else {
            snprintf(e->ie_note, sizeof(e->ie_note), "every viable %s",
                     i == INFO_ENV_TRANSPORTS ? "transport" : "channel");
        }
        ok = ok && !e->ie_bad;
    }
    return ok;
}

// The launcher variables a job's workers may read (torchrun, Slurm, Open
// MPI, PMIx), shown when set.
static const char *const info_launcher_vars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_STEP_NODELIST",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "PMI_RANK",
    "PMI_SIZE",
};
#define INFO_NLAUNCHER                                                         \
    (sizeof(info_launcher_vars) / sizeof(info_launcher_vars[0]))

typedef struct info_report {
    const char *ir_features;
    info_cfg ir_cfg;
    char ir_cfg_error[512];
    tp_backend_info ir_io[TP_INFO_MAX];
    size_t ir_nio;
    const char *ir_loop_backend; // the selected io backend, "" if none
    char ir_loop_error[320];
    tp_backend_info ir_tr[TP_INFO_MAX];
    size_t ir_ntr;
    tp_backend_info ir_ch[TP_INFO_MAX];
    size_t ir_nch;
    bool ir_shm_ok, ir_nccl_ok;
    char ir_shm_why[384], ir_nccl_why[256];
    info_env ir_env[INFO_NENV];
} info_report;

static void
info_nop_cb(const tp_config_item *item, void *arg)
{
    (void)item;
    (void)arg;
}

static size_t
info_clamp(size_t n)
{
    return n > TP_INFO_MAX ? TP_INFO_MAX : n;
}

static int
info_collect(info_report *r)
{
    int rc = TOOL_EXIT_OK;
    tp_error *err = NULL;
    snprintf(r->ir_cfg.ic_io_backend, sizeof(r->ir_cfg.ic_io_backend), "auto");
    snprintf(r->ir_cfg.ic_coll_engine, sizeof(r->ir_cfg.ic_coll_engine),
             "auto");
    if (tp_config_visit(info_nop_cb, NULL, &err) != TP_OK) {
        // Keep going with the defaults for the bad field: the rest of the
        // report is still useful to diagnose the host.
        snprintf(r->ir_cfg_error, sizeof(r->ir_cfg_error), "%s",
                 tp_error_message(err));
        tp_error_unref(err);
        err = NULL;
        rc = TOOL_EXIT_USAGE;
        // A malformed value shows as itself in the table; the library
        // runs on the default, which is what the lists below use.
    } else {
        (void)tp_config_visit(info_cfg_cb, &r->ir_cfg, NULL);
    }
    r->ir_features = tp_build_features();
    r->ir_loop_backend = "";
    if (tp_info_io_backends(0, r->ir_io, TP_INFO_MAX, &r->ir_nio, &err) !=
            TP_OK ||
        tp_info_transports(TP_INFO_PROBE, r->ir_tr, TP_INFO_MAX, &r->ir_ntr,
                           &err) != TP_OK ||
        tp_info_channels(0, r->ir_ch, TP_INFO_MAX, &r->ir_nch, &err) != TP_OK) {
        tool_err("info: %s", tp_error_message(err));
        tp_error_unref(err);
        return TOOL_EXIT_FAIL;
    }
    r->ir_nio = info_clamp(r->ir_nio);
    r->ir_ntr = info_clamp(r->ir_ntr);
    r->ir_nch = info_clamp(r->ir_nch);
    for (size_t i = 0; i < r->ir_nio; i++) {
        if (r->ir_io[i].selected) {
            r->ir_loop_backend = r->ir_io[i].name;
        }
        // TP_IO_BACKEND names a backend that cannot work here: a loop
        // (every context's) fails to start.
        if (strcmp(r->ir_io[i].name, r->ir_cfg.ic_io_backend) == 0 &&
            !r->ir_io[i].viable) {
            snprintf(r->ir_loop_error, sizeof(r->ir_loop_error),
                     "TP_IO_BACKEND=%s: %s", r->ir_io[i].name,
                     r->ir_io[i].reason);
            rc = TOOL_EXIT_FAIL;
        }
    }
    for (size_t i = 0; i < r->ir_ntr; i++) {
        if (r->ir_tr[i].error[0] && rc == TOOL_EXIT_OK) {
            rc = TOOL_EXIT_FAIL;
        }
    }
    tp_backend_info eng[TP_INFO_MAX];
    size_t neng = 0;
    if (tp_info_collective_engines(0, eng, TP_INFO_MAX, &neng, NULL) == TP_OK) {
        for (size_t i = 0; i < neng && i < TP_INFO_MAX; i++) {
            if (strcmp(eng[i].name, "shm") == 0) {
                r->ir_shm_ok = eng[i].viable;
                snprintf(r->ir_shm_why, sizeof(r->ir_shm_why), "%s",
                         eng[i].reason);
            } else if (strcmp(eng[i].name, "nccl") == 0) {
                r->ir_nccl_ok = eng[i].viable;
                snprintf(r->ir_nccl_why, sizeof(r->ir_nccl_why), "%s",
                         eng[i].reason);
            }
        }
    }
    if (!info_check_env(r->ir_env)) {
        rc = TOOL_EXIT_USAGE;
    }
    return rc;
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

// [{"name":..,"viable":..,"why":..[,"domain":..,"listen_addr":..,
// "error":..]},...]
static void
info_json_list(const tp_backend_info *v, size_t n, bool probe)
{
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
        tool_json_str(stdout, v[i].name);
        printf(",\"viable\":%s", v[i].viable ? "true" : "false");
        info_json_opt("why", v[i].viable ? NULL : v[i].reason);
        if (probe) {
            info_json_opt("domain", v[i].domain);
            info_json_opt("listen_addr", v[i].listen_addr);
            info_json_opt("error", v[i].error);
        }
        fputc('}', stdout);
    }
    fputc(']', stdout);
}

static void
info_print_json(const info_report *r)
{
    fputs("{\"version\":", stdout);
    tool_json_str(stdout, tp_version_string());
    fputs(",\"features\":[", stdout);
    char fbuf[256];
    snprintf(fbuf, sizeof(fbuf), "%s", r->ir_features);
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
    tool_json_str(stdout, r->ir_cfg.ic_io_backend);
    info_json_opt("loop_backend", r->ir_loop_backend);
    info_json_opt("loop_error", r->ir_loop_error);
    fputs(",\"backends\":", stdout);
    info_json_list(r->ir_io, r->ir_nio, false);
    fputs(",\"transports\":", stdout);
    info_json_list(r->ir_tr, r->ir_ntr, true);
    fputs(",\"channels\":", stdout);
    info_json_list(r->ir_ch, r->ir_nch, false);
    fputs(",\"collectives\":{\"engine\":", stdout);
    tool_json_str(stdout, r->ir_cfg.ic_coll_engine);
    printf(",\"shm_viable\":%s", r->ir_shm_ok ? "true" : "false");
    info_json_opt("shm_why", r->ir_shm_ok ? NULL : r->ir_shm_why);
    printf(",\"nccl_viable\":%s", r->ir_nccl_ok ? "true" : "false");
    info_json_opt("nccl_why", r->ir_nccl_ok ? NULL : r->ir_nccl_why);
    fputs("},\"environment\":[", stdout);
    for (int i = 0; i < INFO_NENV; i++) {
        const info_env *e = &r->ir_env[i];
        fputs(i ? ",{\"name\":" : "{\"name\":", stdout);
        tool_json_str(stdout, e->ie_name);
        info_json_opt("value", e->ie_value);
        printf(",\"valid\":%s", e->ie_bad ? "false" : "true");
        info_json_opt("note", e->ie_note);
        fputc('}', stdout);
    }
    fputs("],\"launcher\":{", stdout);
    first = true;
    for (size_t i = 0; i < INFO_NLAUNCHER; i++) {
        const char *v = getenv(info_launcher_vars[i]);
        if (v != NULL) {
            printf("%s\"%s\":", first ? "" : ",", info_launcher_vars[i]);
            tool_json_str(stdout, v);
            first = false;
        }
    }
    fputc('}', stdout);
    info_json_opt("config_error", r->ir_cfg_error);
    fputs("}\n", stdout);
}

// Rows "  <name>  yes|no: <why>  <domain>  <address>" (a table of two
// columns shows the first two).
static void
info_table_backends(tool_table *t, const tp_backend_info *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char name[64], viable[300];
        snprintf(name, sizeof(name), "  %s", v[i].name);
        if (v[i].viable) {
            snprintf(viable, sizeof(viable), "yes");
        } else {
            snprintf(viable, sizeof(viable), "no: %s", v[i].reason);
        }
        const char *row[] = {name, viable, v[i].domain[0] ? v[i].domain : "-",
                             v[i].listen_addr[0] ? v[i].listen_addr : "-"};
        tool_table_add(t, row);
    }
}

static void
info_print_text(const info_report *r)
{
    printf("tpipe %s\n", tp_version_string());
    printf("features: %s\n", r->ir_features[0] ? r->ir_features : "(none)");

    printf("\nloop backends (TP_IO_BACKEND=%s", r->ir_cfg.ic_io_backend);
    if (r->ir_loop_backend[0]) {
        printf(" -> %s", r->ir_loop_backend);
    }
    printf("):\n");
    tool_table t;
    tool_table_init(&t, 2);
    for (size_t i = 0; i < r->ir_nio; i++) {
        char name[64], why[300];
        snprintf(name, sizeof(name), "  %s", r->ir_io[i].name);
        snprintf(why, sizeof(why), "not viable: %s", r->ir_io[i].reason);
        const char *row[] = {name, r->ir_io[i].viable ? "viable" : why};
        tool_table_add(&t, row);
    }
    tool_table_print(&t, stdout);
    tool_table_fini(&t);
    if (r->ir_loop_error[0]) {
        printf("  (could not start a loop: %s)\n", r->ir_loop_error);
    }

    printf("\ntransports (best first):\n");
    tool_table_init(&t, 4);
    const char *hdr[] = {"  NAME", "VIABLE", "DOMAIN",
                         "DEFAULT LISTEN ADDRESS"};
    tool_table_add(&t, hdr);
    info_table_backends(&t, r->ir_tr, r->ir_ntr);
    tool_table_print(&t, stdout);
    tool_table_fini(&t);
    for (size_t i = 0; i < r->ir_ntr; i++) {
        if (r->ir_tr[i].error[0]) {
            printf("  %s: %s\n", r->ir_tr[i].name, r->ir_tr[i].error);
        }
    }

    printf("\nchannels (best first):\n");
    tool_table_init(&t, 2);
    const char *chdr[] = {"  NAME", "VIABLE"};
    tool_table_add(&t, chdr);
    info_table_backends(&t, r->ir_ch, r->ir_nch);
    tool_table_print(&t, stdout);
    tool_table_fini(&t);

    printf("\ncollectives (TP_COLL_ENGINE=%s):\n", r->ir_cfg.ic_coll_engine);
    printf("  shm engine   %s%s\n",
           r->ir_shm_ok ? "viable here (used when every member of a group "
                          "is on this host)"
                        : "not viable: ",
           r->ir_shm_ok ? "" : r->ir_shm_why);
    printf("  pipe engine  viable (every group; over the transports above)\n");
    printf("  nccl         %s%s\n",
           r->ir_nccl_ok ? "viable (CUDA tensors)" : "not viable: ",
           r->ir_nccl_ok ? "" : r->ir_nccl_why);

    printf("\nenvironment:\n");
    tool_table_init(&t, 3);
    for (int i = 0; i < INFO_NENV; i++) {
        const info_env *e = &r->ir_env[i];
        char name[64], note[540];
        snprintf(name, sizeof(name), "  %s", e->ie_name);
        snprintf(note, sizeof(note), "%s%s", e->ie_bad ? "INVALID: " : "",
                 e->ie_note);
        const char *row[] = {name, e->ie_value ? e->ie_value : "(unset)", note};
        tool_table_add(&t, row);
    }
    tool_table_print(&t, stdout);
    tool_table_fini(&t);

    printf("\nlauncher variables:");
    bool any = false;
    for (size_t i = 0; i < INFO_NLAUNCHER; i++) {
        const char *v = getenv(info_launcher_vars[i]);
        if (v != NULL) {
            printf("%s%s=%s", any ? " " : "\n  ", info_launcher_vars[i], v);
            any = true;
        }
    }
    printf("%s\n", any ? "" : " (none)");
}

static int
info_main(bool json)
{
    info_report *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        tool_err("out of memory");
        return TOOL_EXIT_FAIL;
    }
    int rc = info_collect(r);
    if (r->ir_nio + r->ir_ntr == 0) {
        free(r);
        return rc;
    }
    if (json) {
        info_print_json(r);
    } else {
        info_print_text(r);
    }
    fflush(stdout);
    if (r->ir_cfg_error[0]) {
        tool_err("%s", r->ir_cfg_error);
    }
    for (int i = 0; i < INFO_NENV; i++) {
        if (r->ir_env[i].ie_bad) {
            tool_err("%s=\"%s\": %s", r->ir_env[i].ie_name,
                     r->ir_env[i].ie_value, r->ir_env[i].ie_note);
        }
    }
    free(r);
    return rc;
}

int
tool_info_main(int argc, char **argv)
{
    bool config = false, json = false, listen = false, bad = false;
    const char *connect = NULL, *listen_url = NULL, *v = NULL;
    const char *transports = NULL, *channels = NULL, *config_only = NULL;
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
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            config = true;
            config_only = argv[i] + 9;
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
    if (config) {
        // Before the setenv below: the listing shows the caller's
        // environment.
        return tool_info_config(json, config_only);
    }
    // Probing opens listeners: not a job, so no "without a job secret"
    // warning (docs/security.md).
    setenv("TP_AUTH_WARN", "0", 0);
    if (connect != NULL) {
        return tool_info_connect(connect, (int64_t)timeout_ms, transports,
                                 channels);
    }
    if (listen) {
        return tool_info_listen(listen_url, (int64_t)timeout_ms, (long)count,
                                transports, channels);
    }
    return info_main(json);
}
