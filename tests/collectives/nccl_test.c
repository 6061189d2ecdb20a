// SPDX-License-Identifier: Apache-2.0
// nccl_test.c - the NCCL layer (collectives/nccl.h). The mapping cases and
// the unique-id exchange need no device and run wherever libnccl.so.2
// loads; the communicator cases skip (77) with the reason when no CUDA
// device is present.

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/store.h>

#include "collectives/nccl.h"
#include "core/cuda.h"
#include "core/platform.h"

#include "tp_test.h"

#define WAIT_MS 20000

static void
need_loadable(void)
{
    char why[256] = "";
    if (!tp__nccl_loadable(why, sizeof(why))) {
        tp_test_skip("NCCL not loadable: %s", why);
    }
}

static void
need_devices(int n)
{
    char why[256] = "";
    if (!tp__nccl_available(why, sizeof(why))) {
        bool dev = strncmp(why, "no CUDA device", 14) == 0;
        tp_test_skip("%s%s", dev ? "" : "NCCL unavailable: ", why);
    }
    if (tp__cuda_device_count() < n) {
        tp_test_skip("no CUDA device: needs %d devices, %d present", n,
                     tp__cuda_device_count());
    }
}

// Every dtype maps to NCCL's (ABI-stable) value; bool and bad values are
// refused with a message naming them.
static void
dtype_mapping(void)
{
    need_loadable();
    static const struct {
        tp_dtype dt;
        int nccl;
    } want[] = {{TP_F32, 7}, {TP_F64, 8}, {TP_F16, 6}, {TP_BF16, 9},
                {TP_I8, 0},  {TP_U8, 1},  {TP_I32, 2}, {TP_I64, 4}};
    tp_error *err = NULL;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        int v = -1;
        TP_CHECK_OK(tp__nccl_dtype(want[i].dt, &v, &err), err);
        TP_CHECKF(v == want[i].nccl, "%s maps to %d, want %d",
                  tp_dtype_name(want[i].dt), v, want[i].nccl);
    }
    int v = -1;
    TP_CHECK_EQ(tp__nccl_dtype(TP_BOOL, &v, &err), TP_ENOTSUP);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bool");
    TP_CHECK_EQ(v, -1);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__nccl_dtype((tp_dtype)99, &v, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "99");
    tp_error_unref(err);
}

// sum/product/min/max/avg map; band/bor/bxor are TP_ENOTSUP naming the op.
static void
op_mapping(void)
{
    need_loadable();
    static const struct {
        tp_reduce_op op;
        int nccl;
    } want[] = {{TP_REDUCE_SUM, 0},
                {TP_REDUCE_PRODUCT, 1},
                {TP_REDUCE_MAX, 2},
                {TP_REDUCE_MIN, 3},
                {TP_REDUCE_AVG, 4}};
    tp_error *err = NULL;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        int v = -1;
        TP_CHECK_OK(tp__nccl_op(want[i].op, &v, &err), err);
        TP_CHECKF(v == want[i].nccl, "%s maps to %d, want %d",
                  tp__reduce_op_name(want[i].op), v, want[i].nccl);
    }
    static const tp_reduce_op bad[] = {TP_REDUCE_BAND, TP_REDUCE_BOR,
                                       TP_REDUCE_BXOR};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int v = -1;
        TP_CHECK_EQ(tp__nccl_op(bad[i], &v, &err), TP_ENOTSUP);
        TP_CHECK_STR_CONTAINS(tp_error_message(err),
                              tp__reduce_op_name(bad[i]));
        TP_CHECK_EQ(v, -1);
        tp_error_unref(err);
        err = NULL;
    }
    int v = -1;
    TP_CHECK_EQ(tp__nccl_op((tp_reduce_op)42, &v, &err), TP_EINVAL);
    tp_error_unref(err);
}

// Without a device, availability is false with a reason, and making a
// communicator fails with TP_ENOTSUP carrying that reason.
static void
unavailable_is_explained(void)
{
    char why[256] = "";
    if (tp__nccl_available(why, sizeof(why))) {
        tp_test_skip("a CUDA device is present: this case is for machines "
                     "without one");
    }
    TP_CHECK(strlen(why) > 0);
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open("mem://nccl-unavail", 0, 1, 1000, &s, &err), err);
    tp__nccl_comm *c = NULL;
    TP_CHECK_EQ(tp__nccl_comm_create(s, "pg0/", 0, 1, 0, 1000, &c, &err),
                TP_ENOTSUP);
    TP_CHECK(c == NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), why);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 0");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "device 0");
    tp_error_unref(err);
    tp_store_close(s);
}

static void
version_is_known(void)
{
    need_loadable();
    TP_CHECKF(tp__nccl_version() >= 2000, "version %d", tp__nccl_version());
}

// Child of id_exchange_two_processes: exchange as @rank, write the id to
// @fd, exit 0 (1 and the message on stderr on failure).
static void
exchange_child(const char *url, int rank, int fd)
{
    tp_store *s = NULL;
    tp_error *err = NULL;
    unsigned char id[TP_NCCL_ID_BYTES];
    tp_status st = tp_store_open(url, rank, 2, tp_test_ms(WAIT_MS), &s, &err);
    if (st == TP_OK) {
        st = tp__nccl_id_exchange(s, "pg0/", rank, 2, TP_TIMEOUT_DEFAULT, id,
                                  &err);
    }
    if (st != TP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, tp_error_message(err));
        _exit(1);
    }
    _exit(write(fd, id, sizeof(id)) == (ssize_t)sizeof(id) ? 0 : 1);
}

static void
reap_ok(pid_t pid)
{
    uint64_t dl = tp__now_ns() + (uint64_t)tp_test_ms(WAIT_MS) * 1000000u;
    int status = 0;
    for (;;) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            break;
        }
        if (tp__now_ns() > dl) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            TP_CHECKF(false, "child %d did not exit in time", (int)pid);
        }
        usleep(2000);
    }
    TP_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child %d failed (status 0x%x)", (int)pid, status);
}

static void
read_all(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        TP_CHECKF(r > 0, "short read from a child (%zu of %zu bytes)", got, n);
        got += (size_t)r;
    }
}

// Two processes get the same 128-byte id through a file:// store.
// ncclGetUniqueId needs no device (it opens the bootstrap root socket).
static void
id_exchange_two_processes(void)
{
    need_loadable();
    char dir[] = "/tmp/tp_nccl_XXXXXX";
    TP_CHECK(mkdtemp(dir) != NULL);
    char url[128];
    snprintf(url, sizeof(url), "file://%s/store", dir);
    int fds[2][2];
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        TP_CHECK(pipe(fds[r]) == 0);
        pids[r] = fork();
        TP_CHECK(pids[r] >= 0);
        if (pids[r] == 0) {
            close(fds[r][0]);
            exchange_child(url, 1 - r, fds[r][1]); // rank 1 starts first
        }
        close(fds[r][1]);
    }
    unsigned char ids[2][TP_NCCL_ID_BYTES];
    for (int r = 0; r < 2; r++) {
        read_all(fds[r][0], ids[r], TP_NCCL_ID_BYTES);
        close(fds[r][0]);
        reap_ok(pids[r]);
    }
    TP_CHECK(memcmp(ids[0], ids[1], TP_NCCL_ID_BYTES) == 0);
    unsigned char zero[TP_NCCL_ID_BYTES] = {0};
    TP_CHECK(memcmp(ids[0], zero, TP_NCCL_ID_BYTES) != 0);
    char path[160];
    snprintf(path, sizeof(path), "%s/store", dir);
    unlink(path);
    rmdir(dir);
}

// A rank whose rank 0 never publishes times out, naming itself; a value
// of the wrong size is a protocol error.
static void
id_exchange_errors(void)
{
    need_loadable();
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open("mem://nccl-errs", 1, 2, 1000, &s, &err), err);
    unsigned char id[TP_NCCL_ID_BYTES];
    uint64_t t0 = tp__now_ns();
    TP_CHECK_EQ(tp__nccl_id_exchange(s, "a/", 1, 2, 200, id, &err),
                TP_ETIMEDOUT);
    TP_CHECK(tp__now_ns() - t0 >= 150000000u);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 1 of 2");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_OK(tp_store_set(s, "b/nccl_id", "short", 5, 1000, &err), err);
    TP_CHECK_EQ(tp__nccl_id_exchange(s, "b/", 1, 2, 200, id, &err), TP_EPROTO);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "5 bytes");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__nccl_id_exchange(s, "c/", 2, 2, 200, id, &err), TP_EINVAL);
    tp_error_unref(err);
    tp_store_close(s);
}

// One rank, one device: all_reduce (sum, avg) of a small f32 buffer, and
// the refusals (band, bool) leave the communicator usable.
static void
all_reduce_one_rank(void)
{
    need_devices(1);
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open("mem://nccl-one", 0, 1, 10000, &s, &err), err);
    tp__nccl_comm *c = NULL;
    TP_CHECK_OK(
        tp__nccl_comm_create(s, "pg0/", 0, 1, 0, tp_test_ms(WAIT_MS), &c, &err),
        err);
    float h[16];
    for (int i = 0; i < 16; i++) {
        h[i] = (float)i;
    }
    void *d = NULL;
    TP_CHECK_OK(tp__cuda_alloc(0, sizeof(h), &d, &err), err);
    TP_CHECK_OK(tp__cuda_copy(d, 0, h, -1, sizeof(h), &err), err);
    TP_CHECK_OK(tp__nccl_all_reduce(c, d, d, 16, TP_F32, TP_REDUCE_SUM,
                                    TP_TIMEOUT_DEFAULT, &err),
                err);
    TP_CHECK_OK(tp__nccl_all_reduce(c, d, d, 16, TP_F32, TP_REDUCE_AVG,
                                    TP_TIMEOUT_DEFAULT, &err),
                err);
    TP_CHECK_EQ(tp__nccl_all_reduce(c, d, d, 16, TP_I32, TP_REDUCE_BAND,
                                    TP_TIMEOUT_DEFAULT, &err),
                TP_ENOTSUP);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "band");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(
        tp__nccl_broadcast(c, d, d, 16, TP_BOOL, 0, TP_TIMEOUT_DEFAULT, &err),
        TP_ENOTSUP);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_OK(
        tp__nccl_broadcast(c, d, d, 16, TP_F32, 0, TP_TIMEOUT_DEFAULT, &err),
        err);
    memset(h, 0, sizeof(h));
    TP_CHECK_OK(tp__cuda_copy(h, -1, d, 0, sizeof(h), &err), err);
    for (int i = 0; i < 16; i++) {
        TP_CHECKF(h[i] == (float)i, "h[%d] = %g", i, (double)h[i]);
    }
    tp__cuda_free(0, d);
    tp__nccl_comm_destroy(c);
    tp_store_close(s);
}

// Child of all_reduce_two_processes: rank @rank on device @rank sums
// rank + 1 over 2 ranks (3 everywhere).
static void
all_reduce_child(const char *url, int rank)
{
    tp_store *s = NULL;
    tp_error *err = NULL;
    tp__nccl_comm *c = NULL;
    float h[8];
    void *d = NULL;
    for (int i = 0; i < 8; i++) {
        h[i] = (float)(rank + 1);
    }
    tp_status st = tp_store_open(url, rank, 2, tp_test_ms(WAIT_MS), &s, &err);
    if (st == TP_OK) {
        st = tp__nccl_comm_create(s, "pg0/", rank, 2, rank, tp_test_ms(WAIT_MS),
                                  &c, &err);
    }
    if (st == TP_OK) {
        st = tp__cuda_alloc(rank, sizeof(h), &d, &err);
    }
    if (st == TP_OK) {
        st = tp__cuda_copy(d, rank, h, -1, sizeof(h), &err);
    }
    if (st == TP_OK) {
        st = tp__nccl_all_reduce(c, d, d, 8, TP_F32, TP_REDUCE_SUM,
                                 TP_TIMEOUT_DEFAULT, &err);
    }
    if (st == TP_OK) {
        st = tp__cuda_copy(h, -1, d, rank, sizeof(h), &err);
    }
    if (st != TP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, tp_error_message(err));
        _exit(1);
    }
    for (int i = 0; i < 8; i++) {
        if (h[i] != 3.0f) {
            fprintf(stderr, "rank %d: h[%d] = %g\n", rank, i, (double)h[i]);
            _exit(1);
        }
    }
    tp__cuda_free(rank, d);
    tp__nccl_comm_destroy(c);
    tp_store_close(s);
    _exit(0);
}

// Two processes, one device each. The device count is probed in a child:
// CUDA must not be initialised in a process that forks ranks afterwards.
static void
all_reduce_two_processes(void)
{
    pid_t probe = fork();
    TP_CHECK(probe >= 0);
    if (probe == 0) {
        _exit(tp__nccl_available(NULL, 0) ? tp__cuda_device_count() & 0x7f : 0);
    }
    int status = 0;
    TP_CHECK(waitpid(probe, &status, 0) == probe);
    int ndev = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    if (ndev < 2) {
        char why[256] = "";
        tp__nccl_available(why, sizeof(why));
        tp_test_skip("needs 2 CUDA devices, %d usable%s%s%s", ndev,
                     why[0] != '\0' ? " (" : "", why,
                     why[0] != '\0' ? ")" : "");
    }
    char dir[] = "/tmp/tp_nccl_XXXXXX";
    TP_CHECK(mkdtemp(dir) != NULL);
    char url[128];
    snprintf(url, sizeof(url), "file://%s/store", dir);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        TP_CHECK(pids[r] >= 0);
        if (pids[r] == 0) {
            all_reduce_child(url, r);
        }
    }
    for (int r = 0; r < 2; r++) {
        reap_ok(pids[r]);
    }
    char path[160];
    snprintf(path, sizeof(path), "%s/store", dir);
    unlink(path);
    rmdir(dir);
}

// A process group routes CUDA tensors to NCCL: all_reduce and broadcast
// on one rank (values unchanged), gather refused with the reason.
static void
pg_cuda_one_rank(void)
{
    need_devices(1);
    char dir[] = "/tmp/tp_nccl_pg_XXXXXX";
    TP_CHECK(mkdtemp(dir) != NULL);
    char url[128];
    snprintf(url, sizeof(url), "file://%s/store", dir);
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_pg_init(url, 0, 1, NULL, &pg, &err), err);
    int64_t shape[1] = {8};
    tp_tensor *h = NULL, *d = NULL, *back = NULL;
    TP_CHECK_OK(tp_tensor_full(TP_F32, 1, shape, 2.0, &h, &err), err);
    tp_device dev = {.type = TP_DEVICE_CUDA, .index = 0};
    TP_CHECK_OK(tp_tensor_to_device(h, dev, &d, &err), err);
    TP_CHECK_OK(tp_pg_all_reduce(pg, d, TP_REDUCE_SUM, NULL, &err), err);
    TP_CHECK_OK(tp_pg_broadcast(pg, d, 0, NULL, &err), err);
    tp_device cpu = {.type = TP_DEVICE_CPU, .index = 0};
    TP_CHECK_OK(tp_tensor_to_device(d, cpu, &back, &err), err);
    double v = 0;
    TP_CHECK(tp_tensor_item(back, 7, &v) == TP_OK && v == 2.0);
    tp_status st = tp_pg_gather(pg, d, d, 0, NULL, &err);
    TP_CHECK(st != TP_OK);
    tp_error_unref(err);
    tp_tensor_unref(back);
    tp_tensor_unref(d);
    tp_tensor_unref(h);
    tp_pg_destroy(pg);
    char path[160];
    snprintf(path, sizeof(path), "%s/store", dir);
    unlink(path);
    rmdir(dir);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(dtype_mapping),
    TP_TEST_CASE(op_mapping),
    TP_TEST_CASE(unavailable_is_explained),
    TP_TEST_CASE(version_is_known),
    TP_TEST_CASE_T(id_exchange_two_processes, 60),
    TP_TEST_CASE(id_exchange_errors),
    TP_TEST_CASE_T(all_reduce_one_rank, 60),
    TP_TEST_CASE_T(all_reduce_two_processes, 90),
    TP_TEST_CASE_T(pg_cuda_one_rank, 60),
};

TP_TEST_MAIN(cases)
