// SPDX-License-Identifier: Apache-2.0
// cma_test.c - the low-level cma code (channel/cma_probe.c): viability and
// its reason, the domain descriptor (stable, equal in a forked child), a
// forked child reading its parent's memory at several sizes, chunking,
// short reads at a hole, bad addresses, dead and zombie pids, and (slow,
// with TP_CMA_HUGE=1) one read above 2 GiB.
//
// Every wait has a deadline: pipe reads poll with a timeout and children
// are reaped with a WNOHANG loop. Cases that need process_vm_readv skip
// with tp__cma_viable's reason when it is not viable here.

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "channel/cma/cma_probe.h"
#include "core/platform.h"
#include "tp_test.h"
#include "tp_test_pipe.h"

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

// ---- helpers ---------------------------------------------------------------

static void
sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000,
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void
need_cma(void)
{
    char why[512];
    if (!tp__cma_viable(why, sizeof(why))) {
        tp_test_skip("cma not viable: %s", why);
    }
}

// A pattern that depends on the position and a seed, cheap enough for
// 2 GiB.
static inline uint8_t
pat(uint64_t i, uint64_t seed)
{
    return (uint8_t)((i ^ (i >> 9) ^ (i >> 17)) + seed * 29u);
}

static void
fill(uint8_t *p, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n; i++) {
        p[i] = pat(i, seed);
    }
}

// Returns the first differing index, or @n if all match.
static uint64_t
first_bad(const uint8_t *p, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] != pat(i, seed)) {
            return i;
        }
    }
    return n;
}

// Reads exactly @n bytes from @fd within @ms; false on EOF, error or
// timeout.
static bool
read_full(int fd, void *buf, size_t n, int64_t ms)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    uint8_t *p = buf;
    while (n > 0) {
        uint64_t now = tp__now_ns();
        if (now >= deadline) {
            return false;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = (int)((deadline - now) / 1000000u) + 1;
        int r = poll(&pfd, 1, left);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return false; // timeout or poll error
        }
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return false;
        }
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static bool
write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            return false;
        }
        p += k;
        n -= (size_t)k;
    }
    return true;
}

// Reaps @pid within @ms; kills it and fails the case on timeout. Returns
// its exit status (128 + signal if killed).
static int
wait_child(pid_t pid, int64_t ms)
{
    tp_test_peer child = {"child", pid, -1};
    int st = tp_test_peer_wait_status(&child, ms);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Waits until @pid has exited but is not reaped (a zombie).
static void
wait_zombie(pid_t pid, int64_t ms)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == pid) {
            return;
        }
        if (tp__now_ns() > deadline) {
            kill(pid, SIGKILL);
            TP_CHECKF(false, "child %d did not exit within %lld ms", (int)pid,
                      (long long)ms);
        }
        sleep_ms(2);
    }
}

// ---- viability and domain --------------------------------------------------

static void
viable_or_reason(void)
{
    char why[512];
    strcpy(why, "");
    bool ok = tp__cma_viable(why, sizeof(why));
    if (ok) {
        printf("cma is viable here\n");
    } else {
        printf("cma is not viable here: %s\n", why);
        TP_CHECKF(why[0] != '\0', "tp__cma_viable false with an empty reason");
    }
    // A second call agrees (and tp__cma_allow_peers is idempotent).
    tp__cma_allow_peers();
    tp__cma_allow_peers();
    char why2[512] = "";
    TP_CHECK_EQ(tp__cma_viable(why2, sizeof(why2)), ok);
    if (!ok) {
        TP_CHECK(strcmp(why, why2) == 0);
    }
    // A short or empty reason buffer is fine.
    char tiny[4];
    TP_CHECK_EQ(tp__cma_viable(tiny, sizeof(tiny)), ok);
    TP_CHECK_EQ(tp__cma_viable(NULL, 0), ok);
    int scope = tp__host_ptrace_scope(why, sizeof(why));
    printf("yama ptrace scope: %d\n", scope);
    TP_CHECK(scope >= -1 && scope <= 3);
}

static void
domain_stable(void)
{
    tp_error *err = NULL;
    char a[TP_CMA_DOMAIN_MAX], b[TP_CMA_DOMAIN_MAX];
    TP_CHECK_OK(tp__cma_domain(a, sizeof(a), &err), err);
    TP_CHECK_OK(tp__cma_domain(b, sizeof(b), &err), err);
    printf("domain: %s\n", a);
    TP_CHECK(strcmp(a, b) == 0);
    TP_CHECK(strncmp(a, "cma:", 4) == 0);
    TP_CHECK_STR_CONTAINS(a, ":pidns=");
    TP_CHECK_STR_CONTAINS(a, ":userns=");
    TP_CHECK_STR_CONTAINS(a, ":netns=");
    TP_CHECK_STR_CONTAINS(a, ":uid=");
    TP_CHECK_STR_CONTAINS(a, ":gid=");
    TP_CHECK_STR_CONTAINS(a, ":yama=");

    // Too small a buffer: TP_EINVAL, and the buffer is not written.
    char small[8] = "xxxxxxx";
    TP_CHECK_EQ(tp__cma_domain(small, sizeof(small), &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "cma: domain");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK(strcmp(small, "xxxxxxx") == 0);

    // A forked child is in the same namespaces with the same ids.
    int p[2];
    TP_CHECK(pipe(p) == 0);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        char c[TP_CMA_DOMAIN_MAX];
        memset(c, 0, sizeof(c));
        if (tp__cma_domain(c, sizeof(c), NULL) != TP_OK) {
            _exit(2);
        }
        _exit(write_full(p[1], c, sizeof(c)) ? 0 : 3);
    }
    close(p[1]);
    char c[TP_CMA_DOMAIN_MAX];
    TP_CHECK(read_full(p[0], c, sizeof(c), 10000));
    close(p[0]);
    TP_CHECK_EQ(wait_child(pid, 10000), 0);
    TP_CHECKF(strcmp(a, c) == 0, "parent %s, child %s", a, c);
}

// ---- a child reads its parent ----------------------------------------------

// Request from the parent: address, length, seed, chunk (0: tp__cma_read);
// length UINT64_MAX means "exit". Reply: one byte, 0 if the bytes matched.
typedef struct req {
    uint64_t addr, len, seed, chunk;
} req;

static void
reader_child(pid_t target, int rfd, int wfd)
{
    for (;;) {
        req q;
        if (!read_full(rfd, &q, sizeof(q), 20000)) {
            fprintf(stderr, "reader: no request\n");
            _exit(2);
        }
        if (q.len == UINT64_MAX) {
            _exit(0);
        }
        uint8_t *buf = malloc(q.len > 0 ? q.len : 1);
        if (buf == NULL) {
            _exit(3);
        }
        memset(buf, 0xee, q.len);
        tp_error *err = NULL;
        tp_status st = q.chunk == 0
                           ? tp__cma_read(target, q.addr, buf, q.len, &err)
                           : tp__cma_read_chunked(target, q.addr, buf, q.len,
                                                  q.chunk, &err);
        uint8_t rc = 0;
        if (st != TP_OK) {
            fprintf(stderr, "reader: %s\n", tp_error_message(err));
            tp_error_unref(err);
            rc = 1;
        } else {
            uint64_t bad = first_bad(buf, q.len, q.seed);
            if (bad != q.len) {
                fprintf(stderr,
                        "reader: byte %llu of %llu: got 0x%02x, want 0x%02x\n",
                        (unsigned long long)bad, (unsigned long long)q.len,
                        buf[bad], pat(bad, q.seed));
                rc = 2;
            }
        }
        free(buf);
        if (!write_full(wfd, &rc, 1)) {
            _exit(4);
        }
    }
}

typedef struct reader {
    pid_t pid;
    int to, from;
} reader;

static void
reader_start(reader *r)
{
    int down[2], up[2];
    TP_CHECK(pipe(down) == 0 && pipe(up) == 0);
    pid_t parent = getpid();
    r->pid = fork();
    TP_CHECK(r->pid >= 0);
    if (r->pid == 0) {
        close(down[1]);
        close(up[0]);
        reader_child(parent, down[0], up[1]);
        _exit(0);
    }
    close(down[0]);
    close(up[1]);
    r->to = down[1];
    r->from = up[0];
}

// Fills a fresh buffer of @len bytes (allocated after the fork, so the
// child holds no copy) and has the child read and check it.
static void
reader_check(reader *r, uint64_t len, uint64_t chunk, int64_t ms)
{
    uint8_t *src = mmap(NULL, len > 0 ? len : 1, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TP_CHECK(src != MAP_FAILED);
    uint64_t seed = len * 7u + chunk + 1u;
    fill(src, len, seed);
    req q = {(uint64_t)(uintptr_t)src, len, seed, chunk};
    TP_CHECK(write_full(r->to, &q, sizeof(q)));
    uint8_t rc = 0xff;
    TP_CHECKF(read_full(r->from, &rc, 1, ms),
              "no reply from the reader for %llu bytes",
              (unsigned long long)len);
    TP_CHECKF(rc == 0, "the reader failed on %llu bytes (chunk %llu): %u",
              (unsigned long long)len, (unsigned long long)chunk, rc);
    munmap(src, len > 0 ? len : 1);
}

static void
reader_stop(reader *r)
{
    req q = {0, UINT64_MAX, 0, 0};
    TP_CHECK(write_full(r->to, &q, sizeof(q)));
    TP_CHECK_EQ(wait_child(r->pid, 10000), 0);
    close(r->to);
    close(r->from);
}

static void
child_reads_parent(void)
{
    need_cma();
    reader r;
    reader_start(&r);
    static const uint64_t sizes[] = {0, 1, 4095, MIB + 3, 64 * MIB};
    for (size_t i = 0; i < TP_ARRAY_LEN(sizes); i++) {
        reader_check(&r, sizes[i], 0, 20000);
    }
    // The same across processes with small chunks.
    reader_check(&r, MIB + 3, 4097, 20000);
    reader_check(&r, 3, 1, 20000);
    reader_stop(&r);
}

// ---- chunking and short reads ----------------------------------------------

static void
chunked(void)
{
    need_cma();
    uint64_t n = MIB;
    uint8_t *src = malloc(n), *dst = malloc(n);
    TP_CHECK(src != NULL && dst != NULL);
    fill(src, n, 5);
    tp_error *err = NULL;
    static const uint64_t chunks[] = {4097, 4096, 1000003, MIB, MIB + 1};
    for (size_t i = 0; i < TP_ARRAY_LEN(chunks); i++) {
        memset(dst, 0, n);
        TP_CHECK_OK(tp__cma_read_chunked(getpid(), (uint64_t)(uintptr_t)src,
                                         dst, n, chunks[i], &err),
                    err);
        TP_CHECK_EQ(first_bad(dst, n, 5), n);
    }
    memset(dst, 0, 64);
    TP_CHECK_OK(tp__cma_read_chunked(getpid(), (uint64_t)(uintptr_t)src, dst,
                                     64, 1, &err),
                err);
    TP_CHECK_EQ(first_bad(dst, 64, 5), 64);

    // Chunk sizes out of range.
    TP_CHECK_EQ(tp__cma_read_chunked(getpid(), (uint64_t)(uintptr_t)src, dst, n,
                                     0, &err),
                TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__cma_read_chunked(getpid(), (uint64_t)(uintptr_t)src, dst, n,
                                     2 * GIB, &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "chunk");
    tp_error_unref(err);
    free(src);
    free(dst);
}

// Two pages, the second unmapped: the first call returns a short count,
// the next fails, and the error names offset 4096 with page one copied.
static void
short_read_at_hole(void)
{
    need_cma();
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TP_CHECK(m != MAP_FAILED);
    fill(m, (uint64_t)pg, 9);
    TP_CHECK(munmap(m + pg, (size_t)pg) == 0);
    uint8_t *dst = calloc(1, (size_t)pg * 2);
    TP_CHECK(dst != NULL);
    static const uint64_t chunks[] = {TP_CMA_CHUNK, 4097, 1000};
    for (size_t i = 0; i < TP_ARRAY_LEN(chunks); i++) {
        memset(dst, 0, (size_t)pg * 2);
        tp_error *err = NULL;
        tp_status st =
            tp__cma_read_chunked(getpid(), (uint64_t)(uintptr_t)m, dst,
                                 (uint64_t)pg * 2, chunks[i], &err);
        TP_CHECK_EQ(st, TP_EIO);
        char want[64];
        snprintf(want, sizeof(want), "(offset %ld)", pg);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), want);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bad address");
        TP_CHECK_EQ(tp_error_errno(err), EFAULT);
        tp_error_unref(err);
        TP_CHECK_EQ(first_bad(dst, (uint64_t)pg, 9), (uint64_t)pg);
    }
    munmap(m, (size_t)pg);
    free(dst);
}

// ---- errors ----------------------------------------------------------------

static void
bad_address(void)
{
    need_cma();
    // An address that is certainly unmapped: map, then unmap (after the
    // last allocation, which could otherwise reuse the hole).
    size_t n = MIB;
    uint8_t *dst = malloc(n);
    TP_CHECK(dst != NULL);
    void *hole = mmap(NULL, n, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TP_CHECK(hole != MAP_FAILED);
    TP_CHECK(munmap(hole, n) == 0);
    char pidtxt[32];
    snprintf(pidtxt, sizeof(pidtxt), "pid %d", (int)getpid());
    const uint64_t addrs[] = {(uint64_t)(uintptr_t)hole, 0, 16,
                              UINT64_C(0xffff800000000000)};
    for (size_t i = 0; i < TP_ARRAY_LEN(addrs); i++) {
        tp_error *err = NULL;
        tp_status st = tp__cma_read(getpid(), addrs[i], dst, n, &err);
        printf("%s\n", tp_error_message(err));
        TP_CHECK_EQ(st, TP_EIO);
        TP_CHECK_EQ(tp_error_status(err), TP_EIO);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), pidtxt);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "cma: read 1048576 bytes");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bad address");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "(offset 0)");
        tp_error_unref(err);
    }
    // A range that wraps the address space is refused before the syscall.
    tp_error *err = NULL;
    TP_CHECK_EQ(tp__cma_read(getpid(), UINT64_MAX - 10, dst, 100, &err),
                TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "wraps");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__cma_read(0, (uint64_t)(uintptr_t)dst, dst, 1, &err),
                TP_EINVAL);
    tp_error_unref(err);
    // Zero bytes: no syscall, no error, even at a bad address.
    TP_CHECK_OK(tp__cma_read(getpid(), 16, dst, 0, NULL), NULL);
    free(dst);
}

static void
check_gone(pid_t pid, const uint8_t *buf)
{
    uint8_t dst[64];
    tp_error *err = NULL;
    tp_status st =
        tp__cma_read(pid, (uint64_t)(uintptr_t)buf, dst, sizeof(dst), &err);
    printf("%s\n", tp_error_message(err));
    TP_CHECK_EQ(st, TP_ECONNRESET);
    TP_CHECK_EQ(tp_error_errno(err), ESRCH);
    char pidtxt[32];
    snprintf(pidtxt, sizeof(pidtxt), "from pid %d", (int)pid);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), pidtxt);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "process gone");
    tp_error_unref(err);
}

static void
dead_pid(void)
{
    need_cma();
    uint8_t buf[64];
    fill(buf, sizeof(buf), 3);
    // An exited, unreaped child (a zombie has no memory to read).
    pid_t z = fork();
    TP_CHECK(z >= 0);
    if (z == 0) {
        _exit(0);
    }
    wait_zombie(z, 10000);
    check_gone(z, buf);
    // Reaped: the pid is free (reuse within this case is very unlikely).
    TP_CHECK_EQ(wait_child(z, 10000), 0);
    check_gone(z, buf);
}

// ---- refusal reasons, each in a child that changes its own state -----------

// Runs @fn in a forked child; the child's TP_CHECKs report to stderr.
static void
in_child(void (*fn)(void))
{
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        fn();
        _exit(0);
    }
    TP_CHECK_EQ(wait_child(pid, 10000), 0);
}

static void
expect_refusal(const char *needle)
{
    char why[512] = "";
    TP_CHECKF(!tp__cma_viable(why, sizeof(why)), "viable, expected \"%s\"",
              needle);
    printf("refused: %s\n", why);
    TP_CHECK_STR_CONTAINS(why, needle);
}

static void
not_dumpable_child(void)
{
    TP_CHECK(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
    expect_refusal("process not dumpable (prctl PR_GET_DUMPABLE = 0)");
}

// Makes process_vm_readv fail with @errnum, as Docker's default profile
// does (EPERM) for a container without CAP_SYS_PTRACE.
static void
filter_process_vm_readv(int errnum)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
        BPF_STMT(BPF_RET | BPF_K,
                 SECCOMP_RET_ERRNO | ((unsigned)errnum & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = TP_ARRAY_LEN(f), .filter = f};
    TP_CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    TP_CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
}

static void
seccomp_eperm_child(void)
{
    filter_process_vm_readv(EPERM);
    expect_refusal("process_vm_readv: operation not permitted (a seccomp "
                   "filter is active; Docker's default profile blocks it)");
    // tp__cma_read reports it as TP_EPERM.
    uint8_t a[8] = {0}, b[8];
    tp_error *err = NULL;
    TP_CHECK_EQ(tp__cma_read(getpid(), (uint64_t)(uintptr_t)a, b, 8, &err),
                TP_EPERM);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "operation not permitted");
    tp_error_unref(err);
}

static void
seccomp_enosys_child(void)
{
    filter_process_vm_readv(ENOSYS);
    expect_refusal("process_vm_readv: function not implemented (a seccomp "
                   "filter is active");
}

static void
refusals(void)
{
    need_cma();
    in_child(not_dumpable_child);
    in_child(seccomp_eperm_child);
    in_child(seccomp_enosys_child);
}

// As root: mixed uids refuse, and a reader with another uid gets TP_EPERM.
static void
mixed_uids_child(void)
{
    TP_CHECK(setresuid((uid_t)-1, 65534, (uid_t)-1) == 0);
    // Changing the euid clears dumpable; restore it to reach the uid check.
    TP_CHECK(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0);
    expect_refusal("uids differ (real 0, effective 65534, saved 0)");
}

static void
other_uid_reader(pid_t target, const uint8_t *buf)
{
    TP_CHECK(setresgid(65534, 65534, 65534) == 0);
    TP_CHECK(setresuid(65534, 65534, 65534) == 0);
    uint8_t dst[16];
    tp_error *err = NULL;
    tp_status st =
        tp__cma_read(target, (uint64_t)(uintptr_t)buf, dst, sizeof(dst), &err);
    printf("%s\n", tp_error_message(err));
    TP_CHECK_EQ(st, TP_EPERM);
    char pidtxt[32];
    snprintf(pidtxt, sizeof(pidtxt), "from pid %d", (int)target);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), pidtxt);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "(EPERM)");
    tp_error_unref(err);
    _exit(0);
}

static void
other_uid(void)
{
    need_cma();
    if (geteuid() != 0) {
        tp_test_skip("needs root to switch uids");
    }
    in_child(mixed_uids_child);
    uint8_t buf[16];
    fill(buf, sizeof(buf), 1);
    pid_t self = getpid();
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        other_uid_reader(self, buf);
    }
    TP_CHECK_EQ(wait_child(pid, 10000), 0);
}

// ---- above 2 GiB (slow) ----------------------------------------------------

static void
above_2gib(void)
{
    const char *e = getenv("TP_CMA_HUGE");
    if (e == NULL || strcmp(e, "1") != 0) {
        tp_test_skip("allocates 2 x (2 GiB + 1 MiB): set TP_CMA_HUGE=1 "
                     "(ctest -L slow)");
    }
    need_cma();
    reader r;
    reader_start(&r);
    reader_check(&r, 2 * GIB + MIB, 0, 200000);
    reader_stop(&r);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(viable_or_reason),   TP_TEST_CASE(domain_stable),
    TP_TEST_CASE(child_reads_parent), TP_TEST_CASE(chunked),
    TP_TEST_CASE(short_read_at_hole), TP_TEST_CASE(bad_address),
    TP_TEST_CASE(dead_pid),           TP_TEST_CASE(refusals),
    TP_TEST_CASE(other_uid),          TP_TEST_CASE_T(above_2gib, 280),
};

TP_TEST_MAIN(cases)
