/* SPDX-License-Identifier: Apache-2.0 */
/* rref_util.h - what the RRef tests (rref_test.c, rref_object_test.c)
 * share: each worker of a job registers the functions "t.make", "t.fail",
 * "t.sleep", "t.keep", "t.drop", "t.here", "t.pass", "t.mkref", "t.sum",
 * "t.scale", "t.stats", "t.pid", "t.release" and (ranks 0..2 only) the
 * remote type "t.linear" (methods forward and parameters). */
#ifndef TP_TESTS_RREF_UTIL_H
#define TP_TESTS_RREF_UTIL_H

#include <stdatomic.h>
#include <stdint.h>

#include <tpipe/rpc.h>
#include <tpipe/rref.h>
#include <tpipe/tensor.h>

#include "tp_test_job.h"

#define WAIT_MS 20000
#define NVALS   16

extern const char *const k_names[4];
extern int g_rank;
extern tp_rref *_Atomic g_kept[8]; // RRefs kept by "t.keep"
extern atomic_int g_objects;       // live "t.linear" objects here
extern atomic_int g_leak_reports;  // TP-RREF-LEAK log lines here

// NVALS f32: v, v + 1, ...; and a check of that.
tp_tensor *f32_tensor(float v);
void check_tensor(const tp_tensor *t, float v);
// Args holding an int64 (and an RRef: a handle is taken).
tp_args *args_i64(int64_t v);
int64_t get_i64(const tp_args *x);
tp_args *args_rref(tp_rref *r, int64_t v);
// Waits until "t.release" was called here.
void wait_release(void);
// The job's setup of each worker (registrations, the log sink).
void setup(int rank);
tp_agent *join(int rank, int world, const char *url);
// Drops the kept RRefs and shuts down gracefully.
void leave(tp_agent *a);
// The RRef counters of rank @r (owners, users, forks, pending forks,
// pending users, queued, live objects, created).
void stats_of(tp_agent *a, int r, int64_t v[8]);
// Waits until every worker has no RRef state and @objects live objects.
void wait_settled(tp_agent *a, int world, int objects);
tp_rref *remote_ok(tp_agent *a, const char *to, const char *fn, int64_t v);
tp_args *here_ok(tp_rref *r);
int64_t call_i64(tp_agent *a, int to, const char *fn, const tp_args *in);
// Runs a job of @world workers (tcp store on loopback).
void run(int world, tp_job_fn fn, void *arg);

#endif
