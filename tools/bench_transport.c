// SPDX-License-Identifier: Apache-2.0
// bench_transport.c - `tpipe bench transport`: round-trip latency and
// one-way streaming bandwidth between two processes, per transport and
// loop backend.
//
// For each (transport, backend) and each repetition, a server child is
// forked before this process creates any loop or thread (fork with threads
// is unsafe); the child creates its loop, transport and listener and sends
// the listener address back through a pipe(2); this process connects and
// measures (bench_peer.c). Every wait has a stall deadline, and the child
// is always reaped (killed on error).
//
// Across hosts there is no fork: --listen serves one client of another
// host and --connect measures against it; as ranks of a launched job
// (RANK, WORLD_SIZE = 2; --launched) rank 1 serves and publishes its
// address in the job's store (TP_INIT_METHOD, default env://), rank 0
// reads it and measures.

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/store.h>

#include "bench_common.h"
#include "bench_out.h"
#include "bench_peer.h"
#include "core/config.h"
#include "core/platform.h"
#include "tool.h"

#define BT_MAX_TRANSPORTS 8
#define BT_STORE_KEY      "tpipe/bench_transport/addr"

typedef struct bt_opts {
    bench_opts bo_com; // the options bench pipe has too
    const char *bo_transports[BT_MAX_TRANSPORTS];
    size_t bo_ntransports;
    int64_t bo_backends[2];
    size_t bo_nbackends;
    bool bo_idle;
    double bo_idle_s;
    const char *bo_addr;
    bool bo_listen;         // serve one client of another host
    const char *bo_connect; // measure against a --listen server
    bench_launch bo_launch; // a rank of a launched job (0 measures)
    tp_config bo_cfg;       // from the environment
} bt_opts;

static const bench_usage bt_usage = {
    .bu_head =
        "usage: tpipe bench transport [options]\n"
        "\n"
        "Two processes (a forked server and this client) on this host. "
        "pingpong:\n"
        "the client writes SIZE bytes, the server reads them and writes them "
        "back;\n"
        "round trip per iteration, p50/p90/p99 in microseconds. stream: the "
        "client\n"
        "keeps W writes of SIZE in flight; GB/s = bytes / time until the "
        "server's\n"
        "ack (1 GB = 1e9 B).\n",
    .bu_tail =
        "JSON line: {\"bench\":\"transport\",\"transport\":\"tcp\","
        "\"backend\":\"epoll\",\n"
        "  \"test\":\"pingpong\",\"size\":64,\"p50_us\":..,\"p90_us\":..,"
        "\"p99_us\":..,\"gbps\":null}\n"
        "(latency fields null for stream, gbps null for pingpong).\n",
};

// ---- options ---------------------------------------------------------------

static bool
bt_parse_transports(const char *list, bt_opts *o)
{
    size_t n = 0;
    const tp_transport_ops *const *all = tp__transport_registry(&n);
    o->bo_ntransports = 0;
    bool best = strcmp(list, "best") == 0;
    if (best || strcmp(list, "all") == 0) {
        // Every viable transport, best first (the registry's order), or
        // only the first viable one.
        for (size_t i = 0; i < n && i < BT_MAX_TRANSPORTS; i++) {
            char why[256] = "";
            if (all[i]->is_viable(&o->bo_cfg, why, sizeof(why))) {
                o->bo_transports[o->bo_ntransports++] = all[i]->name;
                if (best) {
                    break;
                }
            } else if (o->bo_com.bo_verbose || !o->bo_com.bo_json) {
                char label[64];
                snprintf(label, sizeof(label), "transport %s", all[i]->name);
                bench_skip("bench transport", label, "%s", why);
            }
        }
        return o->bo_ntransports > 0;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        const tp_transport_ops *ops = tp__transport_find(tok);
        if (ops == NULL) {
            tool_backend_unknown("bench transport", TOOL_TRANSPORT, tok,
                                 "all, best");
            return false;
        }
        char why[256] = "";
        if (!ops->is_viable(&o->bo_cfg, why, sizeof(why))) {
            tool_err("bench transport: transport %s is not viable here: %s",
                     tok, why);
            return false;
        }
        if (o->bo_ntransports < BT_MAX_TRANSPORTS) {
            o->bo_transports[o->bo_ntransports++] = ops->name;
        }
    }
    return o->bo_ntransports > 0;
}

static bool
bt_parse_backends(const char *list, bt_opts *o)
{
    char why[256] = "";
    bool uring = tp__loop_uring_viable(why, sizeof(why));
    o->bo_nbackends = 0;
    if (strcmp(list, "all") == 0) {
        o->bo_backends[o->bo_nbackends++] = TP_IO_BACKEND_EPOLL;
        if (uring) {
            o->bo_backends[o->bo_nbackends++] = TP_IO_BACKEND_URING;
        } else if (o->bo_com.bo_verbose || !o->bo_com.bo_json) {
            bench_skip("bench transport", "loop backend uring", "%s", why);
        }
        return true;
    }
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (o->bo_nbackends == 2) {
            tool_err("bench transport: too many backends");
            return false;
        }
        if (strcmp(tok, "epoll") == 0) {
            o->bo_backends[o->bo_nbackends++] = TP_IO_BACKEND_EPOLL;
        } else if (strcmp(tok, "uring") == 0) {
            if (!uring) {
                tool_err("bench transport: loop backend uring is not viable "
                         "here: %s",
                         why);
                return false;
            }
            o->bo_backends[o->bo_nbackends++] = TP_IO_BACKEND_URING;
        } else {
            static const char *const names[] = {"epoll", "uring", "all"};
            return bench_name_check("bench transport", "backend", tok, names,
                                    TP_ARRAY_LEN(names));
        }
    }
    return o->bo_nbackends > 0;
}

// Returns -1 to continue, else the exit status.
static int
bt_parse_args(int argc, char **argv, bt_opts *o)
{
    const char *transports = "all", *backends = "all";
    bool launched = false;
    memset(o, 0, sizeof(*o));
    bench_opts_init(&o->bo_com, "bench transport", NULL);
    o->bo_idle_s = 2.0;
    bench_opt opts[8 + BENCH_OPTS_N] = {
        {"--transport", NULL, BENCH_OPT_STR, &transports, 0, 0,
         "tcp|shm|all|best",
         "transports (comma list, all, or the best viable\none; default all "
         "viable)"},
        {"--backend", NULL, BENCH_OPT_STR, &backends, 0, 0, "epoll|uring|all",
         "loop backends (comma list; default all viable)"},
        {"--idle-cpu", NULL, BENCH_OPT_FLAG, &o->bo_idle, 0, 0, NULL,
         "instead: post a read on each side, send nothing,\nsleep, report "
         "each process's CPU %"},
        {"--idle-seconds", NULL, BENCH_OPT_DOUBLE, &o->bo_idle_s, 0, 86400, "S",
         "length of the idle measurement (default 2)"},
        {"--addr", NULL, BENCH_OPT_STR, &o->bo_addr, 0, 0, "ADDR",
         "server listen address (default: tcp://127.0.0.1:0\nfor tcp, the "
         "transport's own otherwise)"},
        {"--listen", NULL, BENCH_OPT_FLAG, &o->bo_listen, 0, 0, NULL,
         "serve one client of another host: print the\naddress (default: "
         "the transport's own), serve, exit"},
        {"--connect", NULL, BENCH_OPT_STR, &o->bo_connect, 0, 0, "ADDR",
         "measure against a --listen server (same --sizes,\n--window, "
         "--transport, --backend)"},
        {"--launched", NULL, BENCH_OPT_FLAG, &launched, 0, 0, NULL,
         "run as rank 0 or 1 of a launched job (automatic\nwhen RANK and "
         "WORLD_SIZE are set): rank 1 serves\nand publishes its address "
         "in the job's store\n(TP_INIT_METHOD, default env://), rank 0 "
         "measures"},
    };
    size_t n = 8 + bench_opts_table(&o->bo_com, opts + 8);
    bench_opt_set_help(opts, n, "--reps",
                       "repeat each measurement R times on separate\n"
                       "connections; report the median of the medians");
    int rc =
        bench_parse_args("bench transport", opts, n, &bt_usage, argc, argv);
    if (rc >= 0) {
        return rc;
    }
    // Launched unless --listen or --connect says otherwise.
    if (!o->bo_listen && o->bo_connect == NULL &&
        !bench_launch_get("bench transport", launched, 2, 2, &o->bo_launch)) {
        return TOOL_EXIT_USAGE;
    }
    bool remote = o->bo_listen || o->bo_connect != NULL || o->bo_launch.bl_on;
    if (remote) {
        // Across hosts: one transport (default tcp) and one backend.
        transports = strcmp(transports, "all") == 0 ? "tcp" : transports;
        if (o->bo_listen + (o->bo_connect != NULL) + launched > 1) {
            tool_err("bench transport: --listen, --connect and --launched "
                     "exclude each other");
            return TOOL_EXIT_USAGE;
        }
        if (o->bo_com.bo_reps64 != 1 || strchr(transports, ',') != NULL ||
            strcmp(transports, "best") == 0 || strchr(backends, ',') != NULL) {
            tool_err("bench transport: across hosts, name one --transport "
                     "and at most one --backend, without --reps");
            return TOOL_EXIT_USAGE;
        }
    }
    if (!bench_opts_test(&o->bo_com) || !bench_opts_finish(&o->bo_com) ||
        tp__config_load(&o->bo_cfg, NULL) != TP_OK ||
        !bt_parse_transports(transports, o) ||
        !bt_parse_backends(backends, o)) {
        return TOOL_EXIT_USAGE;
    }
    if (o->bo_ntransports == 0) {
        tool_err("bench transport: no viable transport");
        return TOOL_EXIT_FAIL;
    }
    if (o->bo_idle) {
        o->bo_com.bo_max_size = BT_MIN_SIZE;
    }
    if (remote) {
        o->bo_nbackends = 1; // the best viable one unless named
    }
    return -1;
}

// ---- one (transport, backend, repetition) ----------------------------------

typedef struct bt_run {
    const bt_opts *br_opts;
    const char *br_transport;
    int64_t br_backend;
    const char *br_backend_name;
    char br_label[48]; // "transport/backend"
    char br_err[1200];
    tp_store *br_store; // launched: the job's store
} bt_run;

// How long a launched rank waits for the other's address (or for its
// store): twice the stall timeout, as the server waits for its client.
static int64_t
bt_wait_ms(const bt_opts *o)
{
    return (int64_t)(o->bo_com.bo_stall_s * 2000);
}

// A launched rank's store, or NULL with the error printed.
static tp_store *
bt_store_open(const bt_opts *o)
{
    const bench_launch *l = &o->bo_launch;
    tp_store *st = NULL;
    tp_error *err = NULL;
    if (tp_store_open(l->bl_url, l->bl_rank, 2, bt_wait_ms(o), &st, &err) !=
        TP_OK) {
        tool_err("bench transport: rank %d: store %s: %s", l->bl_rank,
                 l->bl_url, tp_error_message(err));
        tp_error_unref(err);
        return NULL;
    }
    return st;
}

// Reports the server's address (@ok) or failure to the parent through
// @wfd, or (launched) the address into the job's store, or (--listen,
// @wfd < 0) the address to stdout; a failure not for the parent goes to
// stderr.
static bool
bt_server_say(const bt_run *r, int wfd, bool ok, const char *msg)
{
    if (wfd >= 0) {
        return bench_server_report(wfd, ok ? BENCH_OK : BENCH_FAIL, msg);
    }
    if (ok && r->br_store != NULL) {
        tp_error *err = NULL;
        if (tp_store_set(r->br_store, BT_STORE_KEY, msg, strlen(msg),
                         bt_wait_ms(r->br_opts), &err) != TP_OK) {
            tool_err("bench transport: rank 1: publishing %s: %s", msg,
                     tp_error_message(err));
            tp_error_unref(err);
            return false;
        }
        tool_verbose(r->br_opts->bo_com.bo_verbose, NULL,
                     "rank 1: serving on %s", msg);
        return true;
    }
    if (ok) {
        printf("%s\n", msg);
        fflush(stdout);
    } else {
        tool_err("bench transport: server: %s", msg);
    }
    return true;
}

// The server: serves one client. Returns the exit status (0 ok).
static int
bt_serve(const bt_run *r, int wfd)
{
    const bt_opts *o = r->br_opts;
    char msg[1200];
    tp_config cfg = o->bo_cfg;
    cfg.io_backend = r->br_backend;
    tp_loop *loop = NULL;
    tp_transport *t = NULL;
    tp_listener *l = NULL;
    tp_error *err = NULL;
    // Both processes are on this host: by default tcp goes over loopback,
    // like the peers it is compared with (iperf3, sock_pingpong on
    // 127.0.0.1), never through an interface chosen for other hosts.
    const char *addr = o->bo_addr;
    if (addr == NULL && strcmp(r->br_transport, "tcp") == 0 && !o->bo_listen &&
        !o->bo_launch.bl_on) {
        addr = "tcp://127.0.0.1:0";
    }
    if (tp__loop_create(&cfg, "bench-srv", &loop, &err) != TP_OK ||
        tp__transport_create(r->br_transport, loop, &cfg, &t, &err) != TP_OK ||
        tp__transport_listen(t, addr, &l, &err) != TP_OK) {
        // The parent reports a missing address anyway.
        (void)bt_server_say(r, wfd, false, tp_error_message(err));
        return 1;
    }
    // Buffers first (touching them takes a while for large sizes), so
    // that the client's first measurement does not wait for them.
    static bt_server srv; // large: keep it off the stack
    unsigned nbufs = o->bo_com.bo_window + 1;
    if (bt_server_init(&srv, loop, l, o->bo_com.bo_max_size, nbufs) != 0) {
        snprintf(msg, sizeof(msg), "out of memory for %u buffers of %llu bytes",
                 nbufs, (unsigned long long)o->bo_com.bo_max_size);
        (void)bt_server_say(r, wfd, false, msg);
        return 1;
    }
    bt_server_start(&srv);
    if (!bt_server_say(r, wfd, true, tp__listener_addr(l))) {
        return 1;
    }
    if (wfd >= 0) {
        close(wfd);
    }
    // The client drives; the server only needs to notice a dead client
    // (the transport reports it) or a client that stopped talking.
    uint64_t stall =
        bench_stall_ns(&o->bo_com) * 2 + (uint64_t)(o->bo_idle_s * 1e9);
    int rc = bt_sync_wait(&srv.sv_sync, stall);
    if (rc != 0) {
        fprintf(stderr, "tpipe: bench server (%s/%s): %s\n", r->br_transport,
                r->br_backend_name,
                rc == -2 ? "no progress, giving up" : srv.sv_sync.bs_msg);
        return 1;
    }
    // Orderly teardown: it exercises close paths too.
    tp__conn_close(srv.sv_conn);
    bt_server_fini(&srv);
    tp__listener_destroy(l);
    tp__transport_destroy(t);
    tp__loop_destroy(loop);
    return 0;
}

// The forked server of the bt_run @arg: never returns.
static void
bt_server_child(void *arg, int wfd)
{
    _exit(bt_serve(arg, wfd));
}

// Waits for the measurement; on failure writes "<what>: <why>" to br_err.
static bool
bt_wait(bt_run *r, bt_client *c, const char *what, uint64_t size)
{
    return bench_wait(&c->cl_sync, &r->br_opts->bo_com, what, size, r->br_err,
                      sizeof(r->br_err));
}

static bool
bt_pingpong(bt_run *r, bt_client *c, uint64_t size, bench_cell *cell)
{
    const bt_opts *o = r->br_opts;
    c->cl_size = size;
    c->cl_warm = size >= (16u << 20) ? 2 : 20;
    c->cl_min_iters = 10;
    c->cl_max_iters = o->bo_com.bo_iters;
    c->cl_budget_ns = (uint64_t)(o->bo_com.bo_budget * 1e9);
    bt_client_start_pingpong(c);
    if (!bt_wait(r, c, "pingpong", size)) {
        return false;
    }
    bench_cell_pingpong(&o->bo_com, r->br_label, size, c->cl_lat,
                        (size_t)c->cl_nlat, cell);
    return true;
}

// A stream run of tool_stream_measure.
typedef struct bt_stream_ctx {
    bt_run *ss_run;
    bt_client *ss_client;
    uint64_t ss_size;
} bt_stream_ctx;

static bool
bt_stream_once(void *arg, uint64_t count, double *secs_p)
{
    bt_stream_ctx *s = arg;
    bt_client *c = s->ss_client;
    c->cl_size = s->ss_size;
    c->cl_count = count;
    c->cl_window = s->ss_run->br_opts->bo_com.bo_window;
    bt_client_start_stream(c);
    if (!bt_wait(s->ss_run, c, "stream", s->ss_size)) {
        return false;
    }
    *secs_p = (double)(c->cl_s_t1 - c->cl_s_t0) / 1e9;
    return true;
}

static bool
bt_stream(bt_run *r, bt_client *c, uint64_t size, bench_cell *cell)
{
    const bt_opts *o = r->br_opts;
    bt_stream_ctx s = {.ss_run = r, .ss_client = c, .ss_size = size};
    return bench_stream(&o->bo_com, r->br_label, size, (double)size,
                        bt_stream_once, &s, cell);
}

typedef struct bt_idle_result {
    double bi_client_pct;
    double bi_server_pct;
    double bi_secs;
} bt_idle_result;

static bool
bt_idle(bt_run *r, bt_client *c, bt_idle_result *res)
{
    const bt_opts *o = r->br_opts;
    // IDLE: the server posts a read and sends nothing; our ack read stays
    // pending too.
    bt_client_start_ctrl(c, BT_OP_IDLE, false);
    if (!bt_wait(r, c, "idle", 0)) {
        return false;
    }
    uint64_t cpu0 = tool_cpu_ns(), t0 = tp__now_ns();
    struct timespec ts = {
        .tv_sec = (time_t)o->bo_idle_s,
        .tv_nsec = (long)((o->bo_idle_s - floor(o->bo_idle_s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    uint64_t cpu1 = tool_cpu_ns(), t1 = tp__now_ns();
    bt_client_start_ctrl(c, BT_OP_IDLE_END, true);
    if (!bt_wait(r, c, "idle", 0)) {
        return false;
    }
    res->bi_secs = (double)(t1 - t0) / 1e9;
    res->bi_client_pct = 100.0 * (double)(cpu1 - cpu0) / (double)(t1 - t0);
    res->bi_server_pct =
        c->cl_ack_b ? 100.0 * (double)c->cl_ack_a / (double)c->cl_ack_b : NAN;
    return true;
}

// Runs every measurement of one repetition on one connection. Cells are
// [test][size]: test 0 pingpong, 1 stream.
static bool
bt_run_rep(bt_run *r, bench_cell *cells, bt_idle_result *idle)
{
    const bt_opts *o = r->br_opts;
    char addr[512];
    pid_t pid = -1;
    if (o->bo_connect != NULL) {
        snprintf(addr, sizeof(addr), "%s", o->bo_connect);
    } else if (bench_server_start(&o->bo_com, bt_server_child, r, addr,
                                  sizeof(addr), &pid, r->br_err,
                                  sizeof(r->br_err)) != BENCH_OK) {
        return false;
    }
    bool ok;
    tool_verbose(o->bo_com.bo_verbose, NULL, "%s: server %d listens on %s",
                 r->br_label, (int)pid, addr);

    tp_config cfg = o->bo_cfg;
    cfg.io_backend = r->br_backend;
    tp_loop *loop = NULL;
    tp_transport *t = NULL;
    tp_error *err = NULL;
    tp_conn *conn = NULL;
    static bt_client cl; // large: keep it off the stack
    bool cl_inited = false;
    ok = false;
    if (tp__loop_create(&cfg, "bench-cli", &loop, &err) != TP_OK ||
        tp__transport_create(r->br_transport, loop, &cfg, &t, &err) != TP_OK) {
        snprintf(r->br_err, sizeof(r->br_err), "%s", tp_error_message(err));
        tp_error_unref(err);
        goto out;
    }
    {
        tp_aio con;
        tp__aio_init(&con, NULL, NULL);
        tp_aio_set_timeout(&con, (int64_t)(o->bo_com.bo_stall_s * 1000));
        tp__transport_connect(t, addr, &con);
        tp_aio_wait(&con);
        if (tp_aio_error(&con) != NULL) {
            snprintf(r->br_err, sizeof(r->br_err), "connect to %s: %s", addr,
                     tp_error_message(tp_aio_error(&con)));
        } else {
            conn = tp_aio_get_output(&con, 0);
        }
        tp__aio_fini(&con);
        if (conn == NULL) {
            goto out;
        }
    }
    if (bt_client_init(&cl, loop, conn, o->bo_com.bo_max_size,
                       o->bo_com.bo_iters) != 0) {
        cl_inited = true;
        snprintf(r->br_err, sizeof(r->br_err), "out of memory");
        goto out;
    }
    cl_inited = true;

    if (o->bo_idle) {
        if (!bt_idle(r, &cl, idle)) {
            goto out;
        }
    } else {
        for (size_t i = 0; i < o->bo_com.bo_nsizes; i++) {
            uint64_t size = o->bo_com.bo_sizes[i];
            if (o->bo_com.bo_pingpong &&
                !bt_pingpong(r, &cl, size, &cells[i])) {
                goto out;
            }
            if (o->bo_com.bo_stream &&
                !bt_stream(r, &cl, size, &cells[o->bo_com.bo_nsizes + i])) {
                goto out;
            }
        }
    }
    bt_client_start_ctrl(&cl, BT_OP_QUIT, true);
    if (!bt_wait(r, &cl, "quit", 0)) {
        goto out;
    }
    ok = true;

out:
    if (!ok) {
        // Kill the server first: pending operations then fail fast on
        // both sides, and a hung teardown is cut short by the alarm.
        if (pid > 0) {
            kill(pid, SIGKILL);
        }
        tool_install_teardown_alarm("bench transport",
                                    (unsigned)o->bo_com.bo_stall_s + 10);
    }
    if (conn != NULL) {
        if (!ok && cl_inited) {
            bt_sync_fail(&cl.cl_sync, "aborted");
        }
        tp__conn_close(conn);
    }
    if (cl_inited) {
        bt_client_fini(&cl);
    }
    tp__conn_unref(conn);
    tp__transport_destroy(t);
    if (loop != NULL) {
        tp__loop_destroy(loop);
    }
    if (pid > 0) {
        ok = bench_reap_server(pid, ok, r->br_err, sizeof(r->br_err));
    }
    if (!ok) {
        alarm(0);
    }
    return ok;
}

// ---- output ----------------------------------------------------------------

static const bench_col bt_cols[] = {
    {"transport", -9, "transport", BENCH_COL_STR, 0},
    {"backend", -7, "backend", BENCH_COL_STR, 0},
    {"test", -8, "test", BENCH_COL_STR, 0},
    BENCH_OUT_STATS_COLS,
    {"iters", 8, NULL, BENCH_COL_U64, 0},
};

static const bench_col bt_idle_cols[] = {
    {"transport", -9, "transport", BENCH_COL_STR, 0},
    {"backend", -7, "backend", BENCH_COL_STR, 0},
    {"test", -5, "test", BENCH_COL_STR, 0},
    {"seconds", 8, "seconds", BENCH_COL_NUM, 2},
    {"client_cpu%", 11, "client_cpu_pct", BENCH_COL_NUM, 2},
    {"server_cpu%", 11, "server_cpu_pct", BENCH_COL_NUM, 2},
};

// One (transport, backend)'s rows, printed as each cell's last
// repetition is recorded (bench_opts.bo_done_fn).
typedef struct bt_done {
    bench_out *bd_out;
    const bt_run *bd_run;
} bt_done;

static void
bt_done_cb(void *arg, bench_cell *cell)
{
    bt_done *d = arg;
    bench_medians m;
    if (!bench_cell_medians(cell, &m)) {
        return;
    }
    const bench_val v[TP_ARRAY_LEN(bt_cols)] = {
        {.v_str = d->bd_run->br_transport},
        {.v_str = d->bd_run->br_backend_name},
        {.v_str = cell->bc_stream ? "stream" : "pingpong"},
        {.v_u64 = cell->bc_size},
        {.v_num = m.bm_p50},
        {.v_num = m.bm_p90},
        {.v_num = m.bm_p99},
        {.v_num = m.bm_gbps},
        {.v_u64 = cell->bc_iters},
    };
    bench_out_row(d->bd_out, v);
}

static void
bt_print_idle(const bt_opts *o, bench_out *out, const bt_run *r, double *client,
              double *server, double secs)
{
    const bench_val v[TP_ARRAY_LEN(bt_idle_cols)] = {
        {.v_str = r->br_transport},
        {.v_str = r->br_backend_name},
        {.v_str = "idle"},
        {.v_num = secs},
        {.v_num = tool_median(client, o->bo_com.bo_reps)},
        {.v_num = tool_median(server, o->bo_com.bo_reps)},
    };
    bench_out_row(out, v);
}

// ---- main ------------------------------------------------------------------

int
tool_bench_transport_main(int argc, char **argv)
{
    bt_opts o;
    int rc = bt_parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    // A write to a dead peer must be an error, not a signal.
    signal(SIGPIPE, SIG_IGN);
    const bench_launch *l = &o.bo_launch;
    if (o.bo_listen || (l->bl_on && l->bl_rank == 1)) {
        bt_run r = {
            .br_opts = &o,
            .br_transport = o.bo_transports[0],
            .br_backend = o.bo_backends[0],
            .br_backend_name = tp__io_backend_name(o.bo_backends[0]),
        };
        if (l->bl_on && (r.br_store = bt_store_open(&o)) == NULL) {
            return TOOL_EXIT_FAIL;
        }
        rc = bt_serve(&r, -1);
        tp_store_close(r.br_store);
        return rc == 0 ? TOOL_EXIT_OK : TOOL_EXIT_FAIL;
    }
    // Rank 0 of a launched job: rank 1's address from the store, then as
    // --connect. The store (hosted here with env://) stays open until the
    // end.
    static char addr[512];
    tp_store *store = NULL;
    if (l->bl_on) {
        void *val = NULL;
        size_t len = 0;
        tp_error *err = NULL;
        if ((store = bt_store_open(&o)) == NULL) {
            return TOOL_EXIT_FAIL;
        }
        if (tp_store_get(store, BT_STORE_KEY, bt_wait_ms(&o), &val, &len,
                         &err) != TP_OK) {
            tool_err("bench transport: rank 0: waiting for rank 1's address "
                     "(%s): %s",
                     l->bl_url, tp_error_message(err));
            tp_error_unref(err);
            tp_store_close(store);
            return TOOL_EXIT_FAIL;
        }
        snprintf(addr, sizeof(addr), "%.*s", (int)len, (const char *)val);
        tp_free(val);
        o.bo_connect = addr;
        tool_verbose(o.bo_com.bo_verbose, NULL, "rank 0: server at %s", addr);
    }

    size_t ncells = 2 * o.bo_com.bo_nsizes;
    bench_cell *cells = calloc(ncells, sizeof(*cells));
    double *vals = calloc(ncells * 4 * o.bo_com.bo_reps + 2 * o.bo_com.bo_reps,
                          sizeof(double));
    if (cells == NULL || vals == NULL) {
        tool_err("out of memory");
        free(cells);
        free(vals);
        return TOOL_EXIT_FAIL;
    }
    double *idle_client = vals + ncells * 4 * o.bo_com.bo_reps;
    double *idle_server = idle_client + o.bo_com.bo_reps;

    bench_out out;
    if (o.bo_idle) {
        bench_out_init(&out, "transport", bt_idle_cols,
                       TP_ARRAY_LEN(bt_idle_cols), o.bo_com.bo_json);
    } else {
        bench_out_init(&out, "transport", bt_cols, TP_ARRAY_LEN(bt_cols),
                       o.bo_com.bo_json);
    }
    int status = TOOL_EXIT_OK;
    for (size_t ti = 0; ti < o.bo_ntransports; ti++) {
        for (size_t bi = 0; bi < o.bo_nbackends; bi++) {
            bt_run r = {
                .br_opts = &o,
                .br_transport = o.bo_transports[ti],
                .br_backend = o.bo_backends[bi],
                .br_backend_name = tp__io_backend_name(o.bo_backends[bi]),
            };
            snprintf(r.br_label, sizeof(r.br_label), "%s/%s", r.br_transport,
                     r.br_backend_name);
            bench_cells_reset(&o.bo_com, cells, vals);
            bt_done done = {&out, &r};
            o.bo_com.bo_done_fn = bt_done_cb;
            o.bo_com.bo_done_arg = &done;
            bool ok = true;
            double idle_secs = 0;
            for (unsigned rep = 0; rep < o.bo_com.bo_reps && ok; rep++) {
                bt_idle_result idle = {0};
                tool_verbose(o.bo_com.bo_verbose, NULL,
                             "%s: repetition %u of %u", r.br_label, rep + 1,
                             o.bo_com.bo_reps);
                ok = bt_run_rep(&r, cells, &idle);
                idle_client[rep] = idle.bi_client_pct;
                idle_server[rep] = idle.bi_server_pct;
                idle_secs = idle.bi_secs;
            }
            if (!ok) {
                fflush(stdout);
                tool_err("bench transport: %s: %s", r.br_label, r.br_err);
                status = TOOL_EXIT_FAIL;
                continue;
            }
            if (o.bo_idle) {
                bt_print_idle(&o, &out, &r, idle_client, idle_server,
                              idle_secs);
            }
        }
    }
    o.bo_com.bo_done_fn = NULL;
    free(cells);
    free(vals);
    tp_store_close(store);
    return status;
}
