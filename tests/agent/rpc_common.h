/* SPDX-License-Identifier: Apache-2.0 */
/* rpc_common.h - what the RPC agent's multi-process tests (rpc_*_test.c)
 * share: the test functions every worker registers ("t.sleep", "t.info",
 * "t.fail", "t.async", ...), args and tensor helpers, joining and leaving,
 * calls that must succeed or fail, and the job of forked workers.
 *
 * Every worker is a forked child of the case process, forked before any
 * thread exists (TSan); each child registers the test functions
 * (job_setup), then calls tp_rpc_init. Loopback only; every wait has a
 * deadline; a child that fails makes the parent kill the others and fail
 * the case. */
#ifndef RPC_COMMON_H
#define RPC_COMMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/future.h>
#include <tpipe/rpc.h>
#include <tpipe/tensor.h>

#include "tp_test.h"
#include "tp_test_job.h"

#define WAIT_MS   20000
#define MAX_WORLD 4

// "t.async" resolves its futures only once ASYNC_N calls reached it, with
// ASYNC_THREADS pool threads (see async_completer).
#define ASYNC_N       32
#define ASYNC_THREADS 4

extern const char *const k_names[MAX_WORLD]; // alpha, bravo, charlie, delta

// ---- per-process state of a worker
extern int g_rank;
extern pthread_t g_main_thread;
extern atomic_int g_release;       // set by "t.release"
extern atomic_int g_sleep_started; // "t.sleep" handlers entered
extern atomic_int g_sleep_done;    // ... and returned
extern atomic_int g_block_done;    // "t.block" handlers returned
// Made by job_tcp in the case process, shared by the job's workers:
// "t.sleep" and "t.block" post g_entered when they start; "t.block" waits
// for g_unblock.
extern tp_job_latch g_entered;
extern tp_job_latch g_unblock;
extern pthread_mutex_t g_async_mtx;
extern int g_async_arrived;
extern tp_future *g_async_f[ASYNC_N];
extern int64_t g_async_v[ASYNC_N];

// ---- small helpers
int64_t now_ms(void);
void sleep_ms(int64_t ms);
void tcp_url(char *url, size_t n);
// True if @msg holds the decimal number @n as a whole token.
bool has_number(const char *msg, int n);
void thread_name(char *buf, size_t n);
// True for the library's loop and I/O threads: handlers run elsewhere.
bool is_io_thread_name(const char *n);

// ---- args and tensors
tp_args *args_bytes(const void *p, size_t n);
tp_args *args_str(const char *s);
tp_args *args_i64(int64_t v);
bool args_get_i64(const tp_args *x, int64_t *v_p);
int64_t want_i64(const tp_args *x);
void check_str(const tp_args *x, const char *want);
void args_push(tp_args *x, tp_tensor *t); // takes @t
void args_free(void *p);
uint8_t pattern(size_t i, uint32_t seed);
tp_tensor *u8_tensor(int64_t n, uint32_t seed);
tp_tensor *f32_tensor(int64_t r, int64_t c, float base);
void check_tensor(const tp_tensor *got, const tp_tensor *want,
                  const char *what);
void check_args(const tp_args *got, const tp_args *want, const char *what);

// ---- the test functions
tp_status fn_fail(const tp_rpc_call_info *call, const tp_args *in, void *arg,
                  tp_args **out_p, tp_error **err_p);
tp_future *fn_async(const tp_rpc_call_info *call, const tp_args *in, void *arg);
void *async_completer(void *arg);
void register_fns(void);
// Splits a "t.info" result "fn|caller|rank|id|thread|main" into its fields.
void info_fields(const tp_args *r, char f[6][160]);

// ---- workers
void opts_init(tp_agent_options *o, const char *url);
tp_agent *join_opts(int rank, int world, const tp_agent_options *o);
tp_agent *join(int rank, int world, const char *url);
void leave(tp_agent *a);
void wait_release(int64_t ms);
void release(tp_agent *a, int to);
tp_args *call_ok(tp_agent *a, const char *to, const char *fn, const tp_args *in,
                 int64_t timeout_ms);
tp_args *call_rank_ok(tp_agent *a, int to, const char *fn, const tp_args *in,
                      int64_t timeout_ms);
// A call that must fail with @want: returns its error (caller unrefs).
tp_error *call_fails(tp_agent *a, const char *to, const char *fn,
                     const tp_args *in, int64_t timeout_ms, tp_status want);
tp_args *wait_ok(tp_future *f, const char *what);

// ---- running a job of forked workers
typedef tp_job job;
void job_setup(int rank);
void job_tcp(job *j, int world, tp_job_fn fn, void *arg);
void job_run(job *j);
void run_tcp(int world, tp_job_fn fn, void *arg);

#endif
