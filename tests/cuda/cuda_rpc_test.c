// SPDX-License-Identifier: Apache-2.0
// cuda_rpc_test.c - RPC with CUDA tensors and PyTorch's device maps
// (tp_agent_options.device_maps): arguments arrive on the mapped device,
// results come back through the inverse, a CUDA tensor to a worker with
// no map is refused naming it, and tp_rpc_init checks the maps. Jobs of
// forked workers; against the fake CUDA runtime by default (cuda_env.h),
// the real one with TP_TEST_CUDA=real (skips without a device).

#include <sys/wait.h>
#include <tpipe/rpc.h>
#include <tpipe/tensor.h>
#include <unistd.h>

#include "cuda_env.h"
#include "tp_test.h"
#include "tp_test_job.h"
#include "tp_test_pipe.h"

#define WAIT_MS 20000

static const char *const names[] = {"w0", "w1"};

// The probe: whether the runtime works, and if not why (one line up).
static void
probe_cuda(tp_test_peer *self, void *arg)
{
    (void)arg;
    if (cuda_env_fake()) {
        tp__cuda_testing_use_runtime(TP_FAKE_CUDART);
    }
    char why[256] = "";
    bool ok = tp__cuda_available(why, sizeof(why));
    for (char *c = why; *c != '\0'; c++) {
        *c = *c == '\n' ? ' ' : *c; // one line
    }
    tp_test_peer_send(self, why);
    _exit(ok ? 0 : 1);
}

// Whether the runtime works, checked in a child (a process that touched
// the real runtime must not fork workers that use it).
static void
need_cuda(void)
{
    tp_test_peer probe;
    tp_test_peer_fork(&probe, "cuda probe", TP_TEST_PEER_UP, probe_cuda, NULL);
    char why[256];
    (void)tp_test_peer_recv(&probe, why, sizeof(why), WAIT_MS);
    int status = tp_test_peer_wait_status(&probe, WAIT_MS);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        tp_test_skip("no CUDA device (%s runtime): %s",
                     cuda_env_fake() ? "fake" : "real", why);
    }
}

// Rank @rank's runtime: the fake one with @ndev devices (0: default).
static void
worker_runtime(int ndev)
{
    if (cuda_env_fake()) {
        if (ndev > 0) {
            char v[16];
            snprintf(v, sizeof(v), "%d", ndev);
            setenv("FAKE_CUDA_DEVICES", v, 1);
        }
        TP_CHECK(tp__cuda_testing_use_runtime(TP_FAKE_CUDART));
    }
}

static tp_status
join(int rank, const char *url, const char *maps, tp_agent **a_p,
     tp_error **err_p)
{
    tp_agent_options o;
    tp_agent_options_init(&o);
    o.init_method = url;
    o.init_timeout_ms = tp_test_ms(WAIT_MS);
    o.shutdown_timeout_ms = tp_test_ms(WAIT_MS);
    o.rpc_timeout_ms = tp_test_ms(WAIT_MS);
    o.num_worker_threads = 2;
    o.device_maps = maps;
    return tp_rpc_init(names[rank], rank, 2, &o, a_p, err_p);
}

// A float tensor of @n elements 0..n-1 (+ @add) on @dev.
static tp_tensor *
ramp(tp_device dev, int64_t n, float add)
{
    tp_tensor *h = NULL, *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_empty(TP_F32, 1, &n, &h, &err), err);
    float *p = tp_tensor_data(h);
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)i + add;
    }
    TP_CHECK_OK(tp_tensor_to_device(h, dev, &t, &err), err);
    tp_tensor_unref(h);
    return t;
}

// @t (on any device) holds ramp(n, add).
static bool
is_ramp(tp_tensor *t, int64_t n, float add)
{
    tp_tensor *h = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_to_device(t, cpu, &h, &err), err);
    const float *p = tp_tensor_data(h);
    bool ok = tp_tensor_numel(h) == n;
    for (int64_t i = 0; ok && i < n; i++) {
        ok = p[i] == (float)i + add;
    }
    tp_tensor_unref(h);
    return ok;
}

// w1's function: its arguments must be on cuda:1 (from w0's cuda:0) and
// cuda:0 (from w0's cuda:1) and a CPU one on the CPU; returns each + 1 on
// the device it came to.
static tp_status
plus_one(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    static const int64_t lens[3] = {1000, 300000, 7};
    const tp_device want[3] = {gpu(1), gpu(0), cpu};
    if (tp_args_ntensors(in) != 3) {
        return tp__error_set(err_p, TP_EINVAL, "%zu tensors",
                             tp_args_ntensors(in));
    }
    tp_args *out = NULL;
    TP_CHECK_EQ(tp_args_create(NULL, 0, &out), TP_OK);
    for (size_t i = 0; i < 3; i++) {
        tp_tensor *t = tp_args_tensor(in, i);
        tp_device d = tp_tensor_device(t);
        if (d.type != want[i].type || d.index != want[i].index ||
            !is_ramp(t, lens[i], (float)i)) {
            tp_args_unref(out);
            return tp__error_set(err_p, TP_EINVAL,
                                 "argument %zu on device %d:%d, expected "
                                 "%d:%d, or wrong contents",
                                 i, (int)d.type, d.index, (int)want[i].type,
                                 want[i].index);
        }
        tp_tensor *r = ramp(d, lens[i], (float)i + 1);
        TP_CHECK_EQ(tp_args_add_tensor(out, r), TP_OK);
        tp_tensor_unref(r);
    }
    *out_p = out;
    return TP_OK;
}

static void
map_worker(int rank, int world, const char *url, void *arg)
{
    (void)world;
    (void)arg;
    worker_runtime(0);
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_register("plus_one", plus_one, NULL, &err), err);
    tp_agent *a = NULL;
    // w1 has no map: its results go back through the inverse of w0's.
    TP_CHECK_OK(join(rank, url, rank == 0 ? "w1=0:1,1:0" : NULL, &a, &err),
                err);
    if (rank == 0) {
        static const int64_t lens[3] = {1000, 300000, 7};
        const tp_device src[3] = {gpu(0), gpu(1), cpu};
        tp_args *in = NULL;
        TP_CHECK_EQ(tp_args_create("x", 1, &in), TP_OK);
        for (int i = 0; i < 3; i++) {
            tp_tensor *t = ramp(src[i], lens[i], (float)i);
            TP_CHECK_EQ(tp_args_add_tensor(in, t), TP_OK);
            tp_tensor_unref(t);
        }
        tp_args *out = NULL;
        TP_CHECK_OK(tp_rpc_sync(a, "w1", "plus_one", in, 0, &out, &err), err);
        TP_CHECK_EQ(tp_args_ntensors(out), 3);
        for (size_t i = 0; i < 3; i++) {
            tp_tensor *t = tp_args_tensor(out, i);
            tp_device d = tp_tensor_device(t);
            TP_CHECK_EQ(d.type, src[i].type);
            TP_CHECK_EQ(d.index, src[i].index);
            TP_CHECK(is_ramp(t, lens[i], (float)i + 1));
        }
        tp_args_unref(out);
        tp_args_unref(in);
    }
    tp_job_rpc_leave(a, rank);
}

static void
device_map_moves_args_and_results(void)
{
    need_cuda();
    tp_job j;
    tp_job_tcp(&j, 2, map_worker, NULL);
    j.names = names;
    tp_job_run(&j);
}

static void
unmapped_worker(int rank, int world, const char *url, void *arg)
{
    (void)world;
    (void)arg;
    worker_runtime(0);
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_register("plus_one", plus_one, NULL, &err), err);
    tp_agent *a = NULL;
    // A map to w1 that does not cover cuda:1.
    TP_CHECK_OK(join(rank, url, rank == 0 ? "w1=0:0" : NULL, &a, &err), err);
    if (rank == 0) {
        tp_args *in = NULL;
        TP_CHECK_EQ(tp_args_create(NULL, 0, &in), TP_OK);
        tp_tensor *t = ramp(gpu(1), 16, 0);
        TP_CHECK_EQ(tp_args_add_tensor(in, t), TP_OK);
        tp_tensor_unref(t);
        tp_args *out = NULL;
        TP_CHECK_EQ(tp_rpc_sync(a, "w1", "plus_one", in, 0, &out, &err),
                    TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err),
                              "tensor 0 is on cuda:1, and no device map to "
                              "worker w1 covers that device");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "move the tensor to the "
                                                     "CPU, or set a device "
                                                     "map for w1");
        tp_error_unref(err);
        err = NULL;
        // A call to self copies its arguments on the host: a CUDA tensor
        // there is refused with the reason, nothing crashes.
        TP_CHECK_EQ(tp_rpc_sync(a, "w0", "plus_one", in, 0, &out, &err),
                    TP_ENOTSUP);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "cuda");
        tp_error_unref(err);
        err = NULL;
        // The agent goes on: a CPU call works.
        tp_args_unref(in);
        TP_CHECK_EQ(tp_args_create(NULL, 0, &in), TP_OK);
        TP_CHECK_EQ(tp_rpc_sync(a, "w1", "plus_one", in, 0, &out, &err),
                    TP_EINVAL); // plus_one wants 3 tensors
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "0 tensors");
        tp_error_unref(err);
        tp_args_unref(in);
    }
    tp_job_rpc_leave(a, rank);
}

static void
cuda_tensor_without_map_refused(void)
{
    need_cuda();
    tp_job j;
    tp_job_tcp(&j, 2, unmapped_worker, NULL);
    j.names = names;
    tp_job_run(&j);
}

// Maps tp_rpc_init refuses before it meets anyone.
static void
bad_maps_refused_at_init(void)
{
    need_cuda();
    worker_runtime(0);
    static const struct {
        const char *maps;
        const char *needle;
    } bad[] = {
        {"w1=0:0,1:0", "device map to w1: cuda:0 and cuda:1 both map to its "
                       "cuda:0 (a device map must be one-to-one)"},
        {"w1=0:0,0:1", "device map to w1: local device cuda:0 is mapped "
                       "twice"},
        {"w1=7:0", "device map to w1: local device cuda:7 does not exist "
                   "here"},
        {"w1=0-1", "device map to w1: \"0-1\": expected LOCAL:REMOTE"},
        {"w1", "device_maps: \"w1\": expected WORKER=LOCAL:REMOTE"},
        {"w1=0:0;w1=1:1", "device_maps: worker w1 has two maps"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(bad); i++) {
        tp_agent *a = NULL;
        tp_error *err = NULL;
        TP_CHECK_EQ(join(0, "tcp://127.0.0.1:1", bad[i].maps, &a, &err),
                    TP_EINVAL);
        TP_CHECK(a == NULL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "rpc init");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), bad[i].needle);
        tp_error_unref(err);
    }
}

typedef struct peer_case {
    const char *maps;
    const char *needle;
} peer_case;

// Both workers have one device and a map the job cannot honour: each
// init fails after the rendezvous, naming the worker.
static void
bad_peer_worker(int rank, int world, const char *url, void *arg)
{
    (void)world;
    const peer_case *pc = arg;
    worker_runtime(1);
    char maps[64];
    snprintf(maps, sizeof(maps), pc->maps, names[1 - rank]);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    TP_CHECK_EQ(join(rank, url, maps, &a, &err), TP_EINVAL);
    char needle[160];
    snprintf(needle, sizeof(needle), pc->needle, names[1 - rank],
             names[1 - rank]);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), needle);
    tp_error_unref(err);
}

static void
maps_checked_against_the_job(void)
{
    need_cuda();
    static const peer_case cases[] = {
        {"%s=0:1", "device map to %s: cuda:0 maps to its cuda:1, but %s has "
                   "1 CUDA devices"},
        {"w9=0:0", "device_maps: worker w9 is not in the job"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        tp_job j;
        tp_job_tcp(&j, 2, bad_peer_worker, (void *)&cases[i]);
        j.names = names;
        tp_job_run(&j);
    }
}

// w1 has one device and no CUDA options (it never loads the runtime at
// init): w0's map to its cuda:1 passes init, and the call fails when the
// tensor arrives, without hanging either worker.
static void
unconfigured_peer_worker(int rank, int world, const char *url, void *arg)
{
    (void)world;
    (void)arg;
    worker_runtime(rank == 0 ? 2 : 1);
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_register("plus_one", plus_one, NULL, &err), err);
    tp_agent *a = NULL;
    TP_CHECK_OK(join(rank, url, rank == 0 ? "w1=0:1" : NULL, &a, &err), err);
    if (rank == 0) {
        tp_args *in = NULL;
        TP_CHECK_EQ(tp_args_create(NULL, 0, &in), TP_OK);
        tp_tensor *t = ramp(gpu(0), 16, 0);
        TP_CHECK_EQ(tp_args_add_tensor(in, t), TP_OK);
        tp_tensor_unref(t);
        tp_args *out = NULL;
        tp_status st = tp_rpc_sync(a, "w1", "plus_one", in, 0, &out, &err);
        TP_CHECK(st != TP_OK);
        fprintf(stderr, "w0 sees: %s\n", tp_error_message(err));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "w1");
        tp_error_unref(err);
        tp_args_unref(in);
    }
    tp_job_rpc_leave(a, rank);
}

static void
map_to_unconfigured_peer_fails_on_arrival(void)
{
    need_cuda();
    tp_job j;
    tp_job_tcp(&j, 2, unconfigured_peer_worker, NULL);
    j.names = names;
    tp_job_run(&j);
}

static const tp_test_case test_cases[] = {
    TP_TEST_CASE_T(device_map_moves_args_and_results, 60),
    TP_TEST_CASE_T(cuda_tensor_without_map_refused, 60),
    TP_TEST_CASE(bad_maps_refused_at_init),
    TP_TEST_CASE_T(maps_checked_against_the_job, 90),
    TP_TEST_CASE_T(map_to_unconfigured_peer_fails_on_arrival, 60),
};

TP_TEST_MAIN(test_cases)
