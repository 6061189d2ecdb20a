/* SPDX-License-Identifier: Apache-2.0 */
/* tp_test_job.h - jobs of forked worker processes for the multi-process
 * tests of the agent and the layers above it. Every worker is a child of
 * the case process, forked before any thread exists (TSan); the parent
 * waits for all of them with a deadline, and a child that fails (or one
 * that must die by a signal and does not) makes it kill the others and
 * fail the case, naming the rank. */
#ifndef TP_TEST_JOB_H
#define TP_TEST_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include <tpipe/rpc.h>

#define TP_JOB_MAX_WORLD 64
#define TP_JOB_MAX_ENV   8

typedef void (*tp_job_fn)(int rank, int world, const char *url, void *arg);

typedef struct tp_job {
    int world;     // world size the workers are told
    int nstart;    // ranks 0..nstart-1 are started (default: world)
    char url[512]; // init method
    tp_job_fn fn;
    void *arg;
    // "NAME=value" put in each child's environment, in order, before setup.
    const char *env[TP_JOB_MAX_ENV];
    // Runs in each child before fn (registering functions); may be NULL.
    void (*setup)(int rank);
    const char *const *names;         // worker names, for messages
    int expect_sig[TP_JOB_MAX_WORLD]; // a rank that must end by this signal
    bool kill_last[TP_JOB_MAX_WORLD]; // killed once the others exited
    int64_t limit_ms;                 // for the whole job (default 40 s)
} tp_job;

// A job of @world workers meeting at a fresh tcp://127.0.0.1 store.
void tp_job_tcp(tp_job *j, int world, tp_job_fn fn, void *arg);
// Runs @j; fails the case if a worker fails or the job overruns.
void tp_job_run(tp_job *j);
// A worker of an RPC job: tp_rpc_init as @name (rank @rank of @world) at
// @url with init and shutdown deadlines of tp_test_ms(@wait_ms), 4 pool
// threads and, unless 0, tp_test_ms(@rpc_timeout_ms) as the default call
// deadline. Fails the case on error.
tp_agent *tp_job_rpc_join(const char *name, int rank, int world,
                          const char *url, int64_t wait_ms,
                          int64_t rpc_timeout_ms);
// A graceful tp_rpc_shutdown; fails the case on error.
void tp_job_rpc_leave(tp_agent *a, int rank);
// A latch between the processes of a job: a pipe made in the case process
// before tp_job_run forks, so every worker inherits both ends. post writes
// one byte (any thread of any worker; never blocks: a full pipe is a
// failure); wait reads @n bytes within tp_test_ms(@ms) and returns how many
// it got (fewer: the deadline passed). Tests use it where a sleep would
// only hope that the other side got somewhere ("the handler is running").
typedef struct tp_job_latch {
    int l_fd[2]; // -1 until tp_job_latch_init
} tp_job_latch;
void tp_job_latch_init(tp_job_latch *l);
void tp_job_latch_post(tp_job_latch *l);
int tp_job_latch_wait(tp_job_latch *l, int n, int64_t ms);
void tp_job_latch_fini(tp_job_latch *l);
// Milliseconds of a monotonic clock, and a sleep that resumes after EINTR.
int64_t tp_job_now_ms(void);
void tp_job_sleep_ms(int64_t ms);

#endif
