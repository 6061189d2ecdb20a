// SPDX-License-Identifier: Apache-2.0
// cuda_ipc_test.c - core/cuda.c's interprocess sharing (cudaIpc* memory
// and event handles), the runtime part of a cuda_ipc channel: a forked
// process opens the other's device allocation from its handle, waits on
// its event, copies device-to-device out of it and writes into it; the
// owner sees the write. Refusals: a handle that names nothing, and a
// process opening its own handle. Against the fake runtime by default
// (device memory in shared memory objects), the real one with
// TP_TEST_CUDA=real (the _gpu twin; 77 without a device).

#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cuda.h"
#include "cuda_env.h"
#include "tp_test.h"

#define WAIT_MS 20000
#define N       ((1u << 20) + 3u)
#define MSG_LEN (2u * TP_CUDA_IPC_HANDLE_LEN)

static void
fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)(i * 7u + seed);
    }
}

static bool
check(const uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != (uint8_t)(i * 7u + seed)) {
            return false;
        }
    }
    return true;
}

// Reads exactly @n bytes from @fd within WAIT_MS; false on EOF, error or
// the deadline.
static bool
read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, tp_test_ms(WAIT_MS)) != 1) {
            return false;
        }
        ssize_t k = read(fd, (uint8_t *)buf + got, n - got);
        if (k <= 0) {
            return false;
        }
        got += (size_t)k;
    }
    return true;
}

// The importer: exit 0 when every step worked, else the failed step.
static int
importer(int fd)
{
    uint8_t msg[MSG_LEN];
    if (!read_full(fd, msg, sizeof(msg))) {
        return 0; // the owner skipped (no device) or failed: it reports
    }
    if (cuda_env_fake() && !tp__cuda_testing_use_runtime(TP_FAKE_CUDART)) {
        return 2;
    }
    int dev = tp__cuda_device_count() > 1 ? 1 : 0;
    tp_error *err = NULL;
    void *base = NULL, *ev = NULL, *mine = NULL;
    uint8_t *host = malloc(N);
    int rc = 0;
    if (host == NULL) {
        rc = 3;
    } else if (tp__cuda_ipc_mem_open(dev, msg, &base, &err) != TP_OK) {
        rc = 4;
    } else if (tp__cuda_event_open(dev, msg + TP_CUDA_IPC_HANDLE_LEN, &ev,
                                   &err) != TP_OK) {
        rc = 5;
    } else if (tp__cuda_event_sync(ev, &err) != TP_OK) {
        rc = 6;
    } else if (tp__cuda_alloc(dev, N, &mine, &err) != TP_OK ||
               tp__cuda_copy(mine, dev, base, dev, N / 2, &err) != TP_OK ||
               tp__cuda_copy(host, -1, mine, dev, N / 2, &err) != TP_OK) {
        rc = 7;
    } else if (!check(host, N / 2, 1)) {
        rc = 8;
    } else {
        fill(host, N - N / 2, 2);
        if (tp__cuda_copy((uint8_t *)base + N / 2, dev, host, -1, N - N / 2,
                          &err) != TP_OK) {
            rc = 9;
        }
    }
    if (err != NULL) {
        fprintf(stderr, "importer (step %d): %s\n", rc, tp_error_message(err));
        tp_error_unref(err);
    }
    tp__cuda_free(dev, mine);
    tp__cuda_event_destroy(ev);
    tp__cuda_ipc_mem_close(dev, base);
    free(host);
    uint8_t done = (uint8_t)rc;
    if (write(fd, &done, 1) != 1) {
        rc = rc ? rc : 10;
    }
    return rc;
}

static void
test_ipc_across_processes(void)
{
    int sv[2];
    TP_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pid_t pid = fork(); // before any CUDA call: the runtime forbids after
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        _exit(importer(sv[1]));
    }
    close(sv[1]);
    cuda_env_setup();
    tp_error *err = NULL;
    void *buf = NULL, *ev = NULL;
    uint8_t *host = malloc(N);
    TP_CHECK(host != NULL);
    fill(host, N, 1);
    TP_CHECK_OK(tp__cuda_alloc(0, N, &buf, &err), err);
    TP_CHECK_OK(tp__cuda_copy(buf, 0, host, -1, N, &err), err);
    TP_CHECK_OK(tp__cuda_event_create_ipc(0, &ev, &err), err);
    TP_CHECK_OK(tp__cuda_event_record(ev, &err), err);
    uint8_t msg[MSG_LEN];
    TP_CHECK_OK(tp__cuda_ipc_mem_export(0, buf, msg, &err), err);
    TP_CHECK_OK(tp__cuda_event_export(ev, msg + TP_CUDA_IPC_HANDLE_LEN, &err),
                err);
    TP_CHECK(write(sv[0], msg, sizeof(msg)) == (ssize_t)sizeof(msg));
    uint8_t done = 0xff;
    TP_CHECKF(read_full(sv[0], &done, 1), "no answer from the importer");
    TP_CHECKF(done == 0, "the importer failed at step %d", done);
    // The importer's write into our allocation is here.
    TP_CHECK_OK(tp__cuda_copy(host, -1, buf, 0, N, &err), err);
    TP_CHECK(check(host, N / 2, 1));
    TP_CHECK(check(host + N / 2, N - N / 2, 2));
    int status = 0;
    TP_CHECK(waitpid(pid, &status, 0) == pid);
    TP_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the importer process failed (status 0x%x)", status);
    tp__cuda_event_destroy(ev);
    tp__cuda_free(0, buf);
    free(host);
    close(sv[0]);
    long c[7];
    if (cuda_env_counters(c)) {
        TP_CHECK_EQ(c[0], 0); // no device allocation left
    }
}

static void
test_ipc_refusals(void)
{
    cuda_env_setup();
    tp_error *err = NULL;
    uint8_t h[TP_CUDA_IPC_HANDLE_LEN] = {0};
    void *base = NULL;
    TP_CHECK_EQ(tp__cuda_ipc_mem_open(0, h, &base, &err), TP_EDEVICE);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "cudaIpcOpenMemHandle on device 0");
    tp_error_unref(err);
    err = NULL;
    // Our own allocation's handle cannot be opened here.
    void *buf = NULL;
    TP_CHECK_OK(tp__cuda_alloc(0, 4096, &buf, &err), err);
    TP_CHECK_OK(tp__cuda_ipc_mem_export(0, buf, h, &err), err);
    TP_CHECK_EQ(tp__cuda_ipc_mem_open(0, h, &base, &err), TP_EDEVICE);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__cuda_ipc_mem_export(7, buf, h, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "device 7 does not exist");
    tp_error_unref(err);
    tp__cuda_free(0, buf);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_ipc_across_processes),
    TP_TEST_CASE(test_ipc_refusals),
};

TP_TEST_MAIN(cases)
