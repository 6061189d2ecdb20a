/* SPDX-License-Identifier: Apache-2.0 */
/* run_impl.h (private to `tpipe run`) - what run.c (options, the launcher's
 * loop, signals, the failure summary), run_spawn.c (job secret, job id, master
 * port, starting and stopping ranks, how they ended) and run_output.c
 * (output forwarding, --log-dir) share.
 */
#ifndef TP_TOOLS_RUN_IMPL_H
#define TP_TOOLS_RUN_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#define RUN_MAX_RANKS    1024
#define RUN_MAX_NODES    65536
#define RUN_EXIT_NOEXEC  127
#define RUN_EXIT_TIMEOUT 124
// A line longer than this is emitted in pieces (only the first prefixed).
#define RUN_LINE_MAX (1u << 20)
// After SIGKILL, how long the launcher waits at most for the ranks to go.
#define RUN_FINAL_MS 5000
// Once every rank is reaped, how long pipes still held open by their
// descendants are read before the launcher exits.
#define RUN_DRAIN_MS 200

typedef struct run_stream {
    int rs_fd;       // read end, -1 once closed
    int rs_out;      // 1 or 2
    char *rs_buf;    // pending bytes (no newline among them)
    size_t rs_len;   // bytes pending
    size_t rs_cap;   // capacity of rs_buf
    bool rs_midline; // a piece of an over-long line was already emitted
    bool rs_show;    // re-emitted on the launcher's stdout/stderr
    int rs_log;      // the rank's --log-dir file (shared by both), or -1
} run_stream;

typedef struct run_rank {
    pid_t rr_pid; // 0 once reaped
    run_stream rr_s[2];
    int rr_log; // --log-dir file, -1 if none
} run_rank;

// ---- run_spawn.c ----
int run_job_token(bool none, uint64_t nnodes);
int run_job_id(const char *rdzv_id, uint64_t nnodes, uint64_t nproc,
               const char *addr, unsigned port);
unsigned run_free_port(const char *addr);
int run_exit_code(int status);
const char *run_sig_name(int sig, char *buf, size_t len);
void run_describe(int status, char *buf, size_t len);
int run_signal_all(run_rank *r, int n, int sig);
void run_child(pid_t parent, int out_w, int err_w, char **prog,
               const struct rlimit *nofile);

// ---- run_output.c ----
void run_close_stream(run_stream *s, const char *prefix);
void run_read_stream(run_stream *s, const char *prefix);
bool run_open_logs(const char *dir, run_rank *ranks, int n, uint64_t first);

#endif
