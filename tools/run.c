// SPDX-License-Identifier: Apache-2.0
// run.c - `tpipe run -n N [--] PROGRAM ARGS...`: the launcher of one node.
// Starts N processes with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// NODE_RANK, MASTER_ADDR, MASTER_PORT and TP_JOB_ID set (RANK = node rank x N +
// local rank with --nnodes), re-emits their output line by line with a "[rank]
// " prefix (and into --log-dir), and when one fails says which and how, stops
// the others (SIGTERM, then SIGKILL after a grace period) and exits with the
// failing status.
//
// Signals and fork: every signal is blocked across fork(), so a child can
// never run the launcher's handler (a SIGTERM sent before the child reset
// its dispositions would otherwise be swallowed by that handler and the
// rank would live on until SIGKILL). The child restores the default
// dispositions, then unblocks: a signal that arrived in between is
// delivered then, with its default action.

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "run_impl.h"
#include "tool.h"

static volatile sig_atomic_t run_got_signal;
static int run_wake_fd = -1; // write end of the self-pipe

static void
run_on_signal(int sig)
{
    int saved = errno;
    if (sig != SIGCHLD) {
        run_got_signal = sig;
    }
    char c = 0;
    if (write(run_wake_fd, &c, 1) < 0) {
        // Full pipe: a wake-up is pending anyway.
    }
    errno = saved;
}

static uint64_t
run_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void
run_usage(FILE *f)
{
    fputs("usage: tpipe run -n N [options] [--] PROGRAM [ARGS...]\n"
          "  Starts N local processes of PROGRAM with RANK, WORLD_SIZE, "
          "LOCAL_RANK,\n"
          "  LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT set; "
          "prefixes\n"
          "  each line of their stdout/stderr with \"[rank] \". When one "
          "exits non-zero\n"
          "  or is killed, it says which and how, the others get SIGTERM, "
          "then SIGKILL\n"
          "  after the grace period; the exit status is the first failing "
          "rank's\n"
          "  (128+signal for a signal).\n"
          "  -n N, --nproc N     processes on this node, 1..1024\n"
          "  --nnodes M          nodes of the job (default 1); each runs its "
          "own\n"
          "                      tpipe run; WORLD_SIZE = M x N\n"
          "  --node-rank R       this node, 0..M-1 (required with --nnodes);\n"
          "                      RANK = R x N + LOCAL_RANK\n"
          "  --master-addr A     MASTER_ADDR (default 127.0.0.1; required "
          "with\n"
          "                      --nnodes)\n"
          "  --master-port P     MASTER_PORT (default: a free port on A; "
          "required\n"
          "                      with --nnodes)\n"
          "  --rdzv-endpoint A:P both of the above at once\n"
          "  --rdzv-id ID        TP_JOB_ID, the job's id (keeps jobs sharing "
          "a store\n"
          "                      apart; default: TP_JOB_ID if set, else "
          "random, or\n"
          "                      with --nnodes derived from the endpoint, "
          "-n and\n"
          "                      --nnodes)\n"
          "  --log-dir DIR       also write each rank's output to "
          "DIR/rank-RANK.log\n"
          "  --output-ranks L    re-emit only these ranks' output (\"0,2-3\", "
          "\"none\";\n"
          "                      default all)\n"
          "  --grace SECONDS     SIGTERM-to-SIGKILL delay (default 5)\n"
          "  --timeout SECONDS   stop the whole job after this long, exit "
          "124\n"
          "                      (default: no limit)\n"
          "  --no-job-token      do not give the ranks a job secret (by "
          "default a\n"
          "                      fresh random TP_JOB_TOKEN authenticates "
          "their\n"
          "                      connections, unless TP_JOB_TOKEN or\n"
          "                      TP_JOB_TOKEN_FILE is already set: "
          "docs/security.md;\n"
          "                      with --nnodes set one yourself, the same "
          "on every\n"
          "                      node)\n",
          f);
}

static bool
run_parse_seconds(const char *opt, const char *v, double *out)
{
    if (!tool_parse_double(v, out) || *out > 1e7) {
        tool_err("run: %s needs a number of seconds, not \"%s\"", opt, v);
        return false;
    }
    return true;
}

// Parses --output-ranks: "all", "none", or a comma list of ranks and
// ranges ("0,2-3") of the job's global ranks (< @world). Marks this node's
// ranks (@first .. @first+@n-1) in @show. False after reporting.
static bool
run_parse_output_ranks(const char *v, uint64_t world, uint64_t first, int n,
                       bool *show)
{
    bool all = strcmp(v, "all") == 0;
    for (int k = 0; k < n; k++) {
        show[k] = all;
    }
    if (all || strcmp(v, "none") == 0) {
        return true;
    }
    const char *p = v;
    for (;;) {
        char *end = NULL;
        if (*p < '0' || *p > '9') {
            goto bad;
        }
        errno = 0;
        unsigned long long lo = strtoull(p, &end, 10), hi = lo;
        if (errno != 0) {
            goto bad;
        }
        p = end;
        if (*p == '-') {
            p++;
            if (*p < '0' || *p > '9') {
                goto bad;
            }
            hi = strtoull(p, &end, 10);
            if (errno != 0 || hi < lo) {
                goto bad;
            }
            p = end;
        }
        if (hi >= world) {
            tool_err("run: --output-ranks \"%s\": rank %llu is not below the "
                     "world size %llu",
                     v, hi, (unsigned long long)world);
            return false;
        }
        for (unsigned long long r = lo; r <= hi; r++) {
            if (r >= first && r < first + (uint64_t)n) {
                show[r - first] = true;
            }
        }
        if (*p == '\0') {
            return true;
        }
        if (*p != ',') {
            goto bad;
        }
        p++;
    }
bad:
    tool_err("run: --output-ranks needs \"all\", \"none\" or a list of ranks "
             "and ranges such as \"0,2-3\", not \"%s\"",
             v);
    return false;
}

// Splits --rdzv-endpoint "HOST:PORT" or "[V6]:PORT" into @host (storage
// in @buf) and @port_p. False after reporting.
static bool
run_parse_endpoint(const char *v, char *buf, size_t len, const char **host_p,
                   const char **port_p)
{
    const char *colon = NULL;
    if (v[0] == '[') {
        const char *rb = strchr(v, ']');
        if (rb != NULL && rb[1] == ':') {
            colon = rb + 1;
        }
    } else {
        colon = strchr(v, ':');
        if (colon != NULL && strchr(colon + 1, ':') != NULL) {
            colon = NULL; // a bare IPv6 address: needs brackets
        }
    }
    if (colon == NULL || colon == v || colon[1] == '\0' ||
        (size_t)(colon - v) >= len) {
        tool_err("run: --rdzv-endpoint needs HOST:PORT (or [IPV6]:PORT), not "
                 "\"%s\"",
                 v);
        return false;
    }
    size_t hl = (size_t)(colon - v);
    if (v[0] == '[') {
        memcpy(buf, v + 1, hl - 2); // without the brackets
        buf[hl - 2] = '\0';
    } else {
        memcpy(buf, v, hl);
        buf[hl] = '\0';
    }
    *host_p = buf;
    *port_p = colon + 1;
    return true;
}

int
tool_run_main(int argc, char **argv)
{
    const char *n_s = NULL, *addr = NULL, *port_s = NULL;
    const char *grace_s = NULL, *timeout_s = NULL, *nnodes_s = NULL;
    const char *node_rank_s = NULL, *rdzv_s = NULL, *log_dir = NULL;
    const char *out_ranks_s = NULL, *rdzv_id = NULL;
    bool bad = false, no_token = false;
    int i = 1;
    for (; i < argc && !bad; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            run_usage(stdout);
            return TOOL_EXIT_OK;
        }
        if (strncmp(a, "-n", 2) == 0 && a[2] != '\0' && a[2] != '=') {
            n_s = a + 2; // -n4
            continue;
        }
        if (strcmp(a, "--no-job-token") == 0) {
            no_token = true;
            continue;
        }
        if (tool_opt_value(argc, argv, &i, "-n", &n_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--nproc", &n_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--nproc-per-node", &n_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--nnodes", &nnodes_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--node-rank", &node_rank_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--master-addr", &addr, &bad) ||
            tool_opt_value(argc, argv, &i, "--master-port", &port_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--rdzv-endpoint", &rdzv_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--rdzv-id", &rdzv_id, &bad) ||
            tool_opt_value(argc, argv, &i, "--log-dir", &log_dir, &bad) ||
            tool_opt_value(argc, argv, &i, "--output-ranks", &out_ranks_s,
                           &bad) ||
            tool_opt_value(argc, argv, &i, "--grace", &grace_s, &bad) ||
            tool_opt_value(argc, argv, &i, "--timeout", &timeout_s, &bad)) {
            continue;
        }
        if (a[0] == '-') {
            tool_err("run: unknown option \"%s\" (try tpipe run --help)", a);
            return TOOL_EXIT_USAGE;
        }
        break; // PROGRAM
    }
    if (bad) {
        return TOOL_EXIT_USAGE;
    }
    uint64_t n64 = 0;
    if (n_s == NULL) {
        tool_err("run: -n N is required (try tpipe run --help)");
        return TOOL_EXIT_USAGE;
    }
    if (!tool_parse_u64(n_s, &n64) || n64 < 1 || n64 > RUN_MAX_RANKS) {
        tool_err("run: -n must be between 1 and %d, not \"%s\"", RUN_MAX_RANKS,
                 n_s);
        return TOOL_EXIT_USAGE;
    }
    if (i >= argc) {
        tool_err("run: no program to run (try tpipe run --help)");
        return TOOL_EXIT_USAGE;
    }
    uint64_t nnodes = 1, node_rank = 0;
    if (nnodes_s != NULL && (!tool_parse_u64(nnodes_s, &nnodes) || nnodes < 1 ||
                             nnodes > RUN_MAX_NODES)) {
        tool_err("run: --nnodes must be between 1 and %d, not \"%s\"",
                 RUN_MAX_NODES, nnodes_s);
        return TOOL_EXIT_USAGE;
    }
    if (node_rank_s != NULL &&
        (!tool_parse_u64(node_rank_s, &node_rank) || node_rank >= nnodes)) {
        tool_err("run: --node-rank must be between 0 and %llu (--nnodes "
                 "%llu), not \"%s\"",
                 (unsigned long long)(nnodes - 1), (unsigned long long)nnodes,
                 node_rank_s);
        return TOOL_EXIT_USAGE;
    }
    char rdzv_host[256];
    if (rdzv_s != NULL) {
        if (addr != NULL || port_s != NULL) {
            tool_err("run: --rdzv-endpoint names the master address and "
                     "port: give it or --master-addr/--master-port, not both");
            return TOOL_EXIT_USAGE;
        }
        if (!run_parse_endpoint(rdzv_s, rdzv_host, sizeof(rdzv_host), &addr,
                                &port_s)) {
            return TOOL_EXIT_USAGE;
        }
    }
    if (nnodes > 1 && (node_rank_s == NULL || addr == NULL || port_s == NULL)) {
        tool_err("run: --nnodes %llu needs --node-rank and the address every "
                 "node can reach rank 0's store at: --master-addr and "
                 "--master-port (or --rdzv-endpoint HOST:PORT)",
                 (unsigned long long)nnodes);
        return TOOL_EXIT_USAGE;
    }
    if (addr == NULL) {
        addr = "127.0.0.1";
    }
    if (addr[0] == '\0') {
        tool_err("run: --master-addr needs an address");
        return TOOL_EXIT_USAGE;
    }
    uint64_t port = 0;
    if (port_s != NULL &&
        (!tool_parse_u64(port_s, &port) || port < 1 || port > 65535)) {
        tool_err("run: --master-port must be 1..65535, not \"%s\"", port_s);
        return TOOL_EXIT_USAGE;
    }
    double grace = 5, timeout = 0;
    if ((grace_s != NULL && !run_parse_seconds("--grace", grace_s, &grace)) ||
        (timeout_s != NULL &&
         !run_parse_seconds("--timeout", timeout_s, &timeout))) {
        return TOOL_EXIT_USAGE;
    }
    if (timeout_s != NULL && timeout <= 0) {
        tool_err("run: --timeout must be positive");
        return TOOL_EXIT_USAGE;
    }
    int n = (int)n64;
    uint64_t world = nnodes * n64;
    uint64_t first = node_rank * n64; // RANK of local rank 0
    bool show[RUN_MAX_RANKS];
    if (!run_parse_output_ranks(out_ranks_s ? out_ranks_s : "all", world, first,
                                n, show)) {
        return TOOL_EXIT_USAGE;
    }
    int trc = run_job_token(no_token, nnodes);
    if (trc == TOOL_EXIT_OK) {
        trc = run_job_id(rdzv_id, nnodes, n64, addr, (unsigned)port);
    }
    if (trc != TOOL_EXIT_OK) {
        return trc;
    }
    char **prog = argv + i;
    uint64_t grace_ms = (uint64_t)(grace * 1000);

    // Two pipes per rank, and a log file: make room for them.
    struct rlimit nofile_orig, nofile;
    getrlimit(RLIMIT_NOFILE, &nofile_orig);
    nofile = nofile_orig;
    rlim_t need = (rlim_t)(5 * n + 64);
    if (nofile.rlim_cur != RLIM_INFINITY && nofile.rlim_cur < need) {
        nofile.rlim_cur =
            nofile.rlim_max == RLIM_INFINITY || nofile.rlim_max > need
                ? need
                : nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }

    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        tool_err("run: pipe: %s", strerror(errno));
        return TOOL_EXIT_FAIL;
    }
    run_wake_fd = wake[1];
    struct sigaction sa = {.sa_handler = run_on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    run_rank *ranks = calloc((size_t)n, sizeof(*ranks));
    char(*prefix)[24] = calloc((size_t)n, sizeof(*prefix));
    struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof(*pfd));
    run_stream **pfd_s = calloc((size_t)(2 * n + 1), sizeof(*pfd_s));
    int *pfd_rank = calloc((size_t)(2 * n + 1), sizeof(*pfd_rank));
    int rc = TOOL_EXIT_FAIL;
    int started = 0;
    if (ranks == NULL || prefix == NULL || pfd == NULL || pfd_s == NULL ||
        pfd_rank == NULL) {
        tool_err("run: out of memory");
        goto out;
    }
    for (int k = 0; k < n; k++) {
        ranks[k].rr_log = -1;
        snprintf(prefix[k], sizeof(prefix[k]), "[%llu] ",
                 (unsigned long long)(first + (uint64_t)k));
    }
    if (log_dir != NULL && !run_open_logs(log_dir, ranks, n, first)) {
        goto out;
    }

    if (port == 0) {
        port = run_free_port(addr);
        if (port == 0) {
            goto out;
        }
    }
    char buf[32];
    setenv("MASTER_ADDR", addr, 1);
    snprintf(buf, sizeof(buf), "%u", (unsigned)port);
    setenv("MASTER_PORT", buf, 1);
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)world);
    setenv("WORLD_SIZE", buf, 1);
    snprintf(buf, sizeof(buf), "%d", n);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)node_rank);
    setenv("NODE_RANK", buf, 1);
    setenv("GROUP_RANK", buf, 1); // torchrun's name for it
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)nnodes);
    setenv("NNODES", buf, 1);
    fflush(stdout);
    fflush(stderr);
    pid_t self = getpid();
    sigset_t all, old_mask;
    sigfillset(&all);
    for (; started < n; started++) {
        run_rank *r = &ranks[started];
        snprintf(buf, sizeof(buf), "%llu",
                 (unsigned long long)(first + (uint64_t)started));
        setenv("RANK", buf, 1);
        snprintf(buf, sizeof(buf), "%d", started);
        setenv("LOCAL_RANK", buf, 1);
        int po[2], pe[2];
        if (pipe2(po, O_CLOEXEC) != 0) {
            tool_err("run: pipe: %s", strerror(errno));
            break;
        }
        if (pipe2(pe, O_CLOEXEC) != 0) {
            tool_err("run: pipe: %s", strerror(errno));
            close(po[0]);
            close(po[1]);
            break;
        }
        // No handler of ours may run in the child: block everything
        // across the fork (the child unblocks after resetting them).
        sigprocmask(SIG_BLOCK, &all, &old_mask);
        pid_t pid = fork();
        if (pid == 0) {
            run_child(self, po[1], pe[1], prog, &nofile_orig);
        }
        int fork_errno = errno;
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        close(po[1]);
        close(pe[1]);
        if (pid < 0) {
            tool_err("run: fork: %s", strerror(fork_errno));
            close(po[0]);
            close(pe[0]);
            break;
        }
        r->rr_pid = pid;
        r->rr_s[0] = (run_stream){.rs_fd = po[0],
                                  .rs_out = 1,
                                  .rs_show = show[started],
                                  .rs_log = r->rr_log};
        r->rr_s[1] = (run_stream){.rs_fd = pe[0],
                                  .rs_out = 2,
                                  .rs_show = show[started],
                                  .rs_log = r->rr_log};
    }

    // -1 until the first failure (or launcher signal / timeout) decides it.
    int code = -1;
    uint64_t now = run_now_ms();
    uint64_t job_deadline = timeout_s ? now + (uint64_t)(timeout * 1000) : 0;
    uint64_t kill_at = 0;  // when to SIGKILL the remaining children
    uint64_t give_up = 0;  // when to stop waiting altogether
    bool stopping = false; // SIGTERM sent (or about to be)
    bool killed = false;   // SIGKILL sent
    bool drained = false;  // every rank reaped: give_up is near
    int handled_signals = 0;
    int launcher_sig = 0;
    int alive = started;
    // Signals this launcher sent to the ranks (bit per signal number), and
    // how the ranks it stopped ended, for the closing summary.
    uint64_t sent = 0;
    int stopped_by[65] = {0};
    int stopped_exited = 0;
    char nm[32], how[160];
    if (started < n) {
        code = TOOL_EXIT_FAIL;
        stopping = true;
        tool_err("run: could not start rank %llu; stopping the %d started "
                 "rank(s)",
                 (unsigned long long)(first + (uint64_t)started), started);
        run_signal_all(ranks, started, SIGTERM);
        sent |= UINT64_C(1) << SIGTERM;
        kill_at = now + grace_ms;
    }
    for (;;) {
        now = run_now_ms();
        // Signals to the launcher: forward them; a second one kills.
        int sig = run_got_signal;
        if (sig != 0) {
            run_got_signal = 0;
            handled_signals++;
            if (launcher_sig == 0) {
                launcher_sig = sig;
            }
            if (handled_signals == 1) {
                tool_err("run: got %s: passing it to the %d running rank(s) "
                         "(SIGKILL after %s s; %s again kills them now)",
                         run_sig_name(sig, nm, sizeof(nm)), alive,
                         grace_s ? grace_s : "5", nm);
                run_signal_all(ranks, started, sig);
                sent |= UINT64_C(1) << sig;
                if (!stopping) {
                    stopping = true;
                    kill_at = now + grace_ms;
                }
            } else if (!killed) {
                tool_err("run: got %s again: killing the %d running rank(s)",
                         run_sig_name(sig, nm, sizeof(nm)), alive);
                kill_at = now;
            }
        }
        // Reap.
        for (int k = 0; k < started; k++) {
            run_rank *r = &ranks[k];
            int st;
            if (r->rr_pid <= 0 || waitpid(r->rr_pid, &st, WNOHANG) <= 0) {
                continue;
            }
            r->rr_pid = 0;
            alive--;
            int c = run_exit_code(st);
            unsigned long long gr = (unsigned long long)(first + (uint64_t)k);
            if (c != 0 && code == -1) {
                code = c;
            }
            if (c != 0 && !stopping) {
                // The first failure: say which rank and how, and whom it
                // stops.
                run_describe(st, how, sizeof(how));
                if (alive > 0) {
                    tool_err("run: rank %llu %s; stopping the %d other "
                             "running rank(s) (SIGTERM, SIGKILL after %s s)",
                             gr, how, alive, grace_s ? grace_s : "5");
                } else {
                    tool_err("run: rank %llu %s", gr, how);
                }
                stopping = true;
                run_signal_all(ranks, started, SIGTERM);
                sent |= UINT64_C(1) << SIGTERM;
                kill_at = now + grace_ms;
            } else if (stopping) {
                int ts = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
                if (ts > 0 && ts < 64 && (sent & (UINT64_C(1) << ts))) {
                    stopped_by[ts]++; // as asked: in the summary
                } else if (ts > 0) {
                    // A signal of its own while stopping: never silent.
                    run_describe(st, how, sizeof(how));
                    tool_err("run: rank %llu %s", gr, how);
                } else {
                    stopped_exited++;
                }
            } else if (WIFSIGNALED(st)) {
                // Only reachable for a signal death that did not fail the
                // job (none today); kept so that no signal death is silent.
                run_describe(st, how, sizeof(how));
                tool_err("run: rank %llu %s", gr, how);
            }
        }
        if (job_deadline != 0 && now >= job_deadline && !stopping &&
            alive > 0) {
            tool_err("run: timed out after %s s; stopping the %d running "
                     "rank(s)",
                     timeout_s, alive);
            if (code == -1) {
                code = RUN_EXIT_TIMEOUT;
            }
            stopping = true;
            run_signal_all(ranks, started, SIGTERM);
            sent |= UINT64_C(1) << SIGTERM;
            kill_at = now + grace_ms;
        }
        if (stopping && !killed && alive > 0 && now >= kill_at) {
            killed = true;
            if (handled_signals < 2) {
                tool_err("run: %d rank(s) still running after the %s s "
                         "grace: sending SIGKILL",
                         alive, grace_s ? grace_s : "5");
            }
            run_signal_all(ranks, started, SIGKILL);
            sent |= UINT64_C(1) << SIGKILL;
            give_up = now + RUN_FINAL_MS;
        }
        if (alive == 0 && !drained) {
            // Every rank is gone, its last output already in the pipes;
            // pipes still held open by grandchildren must not hang the
            // launcher.
            drained = true;
            if (give_up == 0 || give_up > now + RUN_DRAIN_MS) {
                give_up = now + RUN_DRAIN_MS;
            }
        }
        // Build the poll set.
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = wake[0], .events = POLLIN};
        for (int k = 0; k < started; k++) {
            for (int j = 0; j < 2; j++) {
                run_stream *s = &ranks[k].rr_s[j];
                if (s->rs_fd >= 0) {
                    pfd_s[np] = s;
                    pfd_rank[np] = k;
                    pfd[np++] =
                        (struct pollfd){.fd = s->rs_fd, .events = POLLIN};
                }
            }
        }
        if (alive == 0 && np == 1) {
            break; // all reaped, all output emitted
        }
        if (give_up != 0 && now >= give_up) {
            if (alive > 0) {
                tool_err("run: %d process(es) did not exit after SIGKILL; "
                         "giving up",
                         alive);
            }
            break;
        }
        uint64_t next = 0;
        uint64_t cand[3] = {stopping && !killed && alive > 0 ? kill_at : 0,
                            !stopping ? job_deadline : 0, give_up};
        for (int k = 0; k < 3; k++) {
            if (cand[k] != 0 && (next == 0 || cand[k] < next)) {
                next = cand[k];
            }
        }
        int wait_ms = next == 0 ? -1
                      : next <= now
                          ? 0
                          : (int)(next - now < 60000 ? next - now : 60000);
        int pr = poll(pfd, (nfds_t)np, wait_ms);
        if (pr < 0) {
            if (errno == EINTR) {
                continue;
            }
            tool_err("run: poll: %s", strerror(errno));
            run_signal_all(ranks, started, SIGKILL);
            code = TOOL_EXIT_FAIL;
            break;
        }
        if (pfd[0].revents != 0) {
            char drain[64];
            while (read(wake[0], drain, sizeof(drain)) > 0) {
            }
        }
        for (int k = 1; k < np; k++) {
            if (pfd[k].revents != 0) {
                run_read_stream(pfd_s[k], prefix[pfd_rank[k]]);
            }
        }
    }
    // How the ranks this launcher stopped ended: one line.
    int nstopped = stopped_exited;
    char sum[512];
    size_t sl = 0;
    for (int sg = 1; sg < 65; sg++) {
        if (stopped_by[sg] > 0 && sl < sizeof(sum)) {
            nstopped += stopped_by[sg];
            sl += (size_t)snprintf(sum + sl, sizeof(sum) - sl, "%s%d by %s",
                                   sl ? ", " : "", stopped_by[sg],
                                   run_sig_name(sg, nm, sizeof(nm)));
        }
    }
    if (stopped_exited > 0 && sl < sizeof(sum)) {
        snprintf(sum + sl, sizeof(sum) - sl, "%s%d exited on their own",
                 sl ? ", " : "", stopped_exited);
    }
    if (nstopped > 0) {
        tool_err("run: %d rank(s) stopped: %s", nstopped, sum);
    }
    if (code == -1) {
        code = launcher_sig != 0 ? 128 + launcher_sig : TOOL_EXIT_OK;
    }
    rc = code;

out:
    if (ranks != NULL) {
        for (int k = 0; k < started; k++) {
            for (int j = 0; j < 2; j++) {
                run_close_stream(&ranks[k].rr_s[j], prefix[k]);
                free(ranks[k].rr_s[j].rs_buf);
            }
        }
        for (int k = 0; k < n; k++) {
            if (ranks[k].rr_log >= 0) {
                close(ranks[k].rr_log);
            }
        }
    }
    free(ranks);
    free(prefix);
    free(pfd);
    free(pfd_s);
    free(pfd_rank);
    close(wake[0]);
    close(wake[1]);
    return rc;
}
