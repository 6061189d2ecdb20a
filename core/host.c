// SPDX-License-Identifier: Apache-2.0
// host.c - who this process is on its host, for the backends and engines
// that need to know whether a peer shares it: the boot id, namespace
// inodes, Yama's ptrace scope and the ptracer exception, and cross-memory
// attach (process_vm_readv): whether it can work here, the descriptor two
// peers compare, and the one-copy read. Used by the shm transport, the cma
// channel and the collectives' shared-memory engine. See
// docs/channel-cma.md for cross-memory attach.
//
// The kernel lets process A read process B (process_vm_readv uses
// PTRACE_MODE_ATTACH_REALCREDS) when A's real uid and gid equal all of B's
// uids and gids (or A has CAP_SYS_PTRACE in B's user namespace), B is
// dumpable, and the LSMs agree: Yama's ptrace_scope, and before all that a
// seccomp filter may refuse the syscall itself. Reads of our own process
// skip every one of those checks but seccomp, so the self-test only shows
// that the syscall exists and is allowed; the other conditions are checked
// one by one.
//
// No locks: the only shared state is host_ptracer_pid, an atomic.

#include "core/host.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/log.h"

#define CMA_CAP_SYS_PTRACE 19

// The pid of the process that last made PR_SET_PTRACER_ANY succeed, 0 if
// none. Yama keeps the exception per process and a forked child does not
// inherit it, so a different getpid() means "not done here yet".
static _Atomic pid_t host_ptracer_pid;

// ---- /proc helpers ---------------------------------------------------------

// Reads a small text file into @buf (NUL-terminated, first line only).
// Returns 0 or an errno (ENODATA for an empty file).
static int
host_read_line(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    ssize_t n;
    do {
        n = read(fd, buf, len - 1);
    } while (n < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (n < 0) {
        return e;
    }
    if (n == 0) {
        return ENODATA;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

// The value of "@key:" in /proc/self/status, NUL-terminated and without
// leading blanks. Returns false if the file or the key is missing.
static bool
host_status_field(const char *key, char *val, size_t len)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (f == NULL) {
        return false;
    }
    size_t klen = strlen(key);
    char line[256];
    bool found = false;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            const char *v = line + klen + 1;
            v += strspn(v, " \t");
            snprintf(val, len, "%s", v);
            val[strcspn(val, "\n")] = '\0';
            found = true;
            break;
        }
    }
    fclose(f);
    return found;
}

static bool
cma_has_cap_sys_ptrace(void)
{
    char v[64];
    if (!host_status_field("CapEff", v, sizeof(v))) {
        return false;
    }
    unsigned long long caps = strtoull(v, NULL, 16);
    return (caps >> CMA_CAP_SYS_PTRACE) & 1u;
}

// "no such process (ESRCH)": strerror with a lowercase first letter, then
// the errno's name. ESRCH is not in tp__errno_name's table.
static void
cma_errno_text(int e, char *buf, size_t len)
{
    const char *name = e == ESRCH ? "ESRCH" : tp__errno_name(e);
    snprintf(buf, len, "%s (%s)", strerror(e), name);
    if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z')) {
        buf[0] = (char)(buf[0] - 'A' + 'a');
    }
}

// ---- identity: boot id, namespaces, ptrace scope
// ----------------------------------------------------------

int
tp__host_ptrace_scope(char *why, size_t why_len)
{
    char buf[32];
    int e = host_read_line(TP_HOST_YAMA_PATH, buf, sizeof(buf));
    if (e == ENOENT) {
        return 0; // no Yama: only the classic uid and dumpable checks
    }
    if (e != 0) {
        if (why_len > 0) {
            snprintf(why, why_len, "read %s: %s", TP_HOST_YAMA_PATH,
                     strerror(e));
        }
        return -1;
    }
    char *end;
    long v = strtol(buf, &end, 10);
    if (end == buf || v < 0 || v > 3) {
        if (why_len > 0) {
            snprintf(why, why_len, "%s: unexpected value \"%s\"",
                     TP_HOST_YAMA_PATH, buf);
        }
        return -1;
    }
    return (int)v;
}

// One PR_SET_PTRACER_ANY per process. Returns 0 or the errno of prctl.
static int
host_set_ptracer_any(void)
{
    pid_t self = getpid();
    if (atomic_load_explicit(&host_ptracer_pid, memory_order_acquire) == self) {
        return 0;
    }
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0) {
        return errno;
    }
    atomic_store_explicit(&host_ptracer_pid, self, memory_order_release);
    return 0;
}

void
tp__cma_allow_peers(void)
{
    char why[160];
    int scope = tp__host_ptrace_scope(why, sizeof(why));
    if (scope != 1) {
        return;
    }
    int e = host_set_ptracer_any();
    if (e != 0) {
        TP_LOG_WARN("TP-CMA-PTRACER",
                    "cma: prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY): %s; "
                    "under ptrace scope 1 only ancestors can read this "
                    "process",
                    strerror(e));
    }
}

// ---- cross-memory attach: domain
// ----------------------------------------------------------------

int
tp__host_ns_inode(const char *ns, uint64_t *ino_p)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/ns/%s", ns);
    struct stat st;
    if (stat(path, &st) != 0) {
        return errno;
    }
    *ino_p = (uint64_t)st.st_ino;
    return 0;
}

int
tp__host_boot_id(char *buf, size_t len)
{
    return host_read_line(TP_HOST_BOOT_ID_PATH, buf, len);
}

tp_status
tp__cma_domain(char *buf, size_t len, tp_error **err_p)
{
    char boot[64];
    int e = tp__host_boot_id(boot, sizeof(boot));
    if (e != 0) {
        return tp__error_errno(err_p, e, "cma: domain: read %s",
                               TP_HOST_BOOT_ID_PATH);
    }
    // The pid namespace because the reader names the target by its pid in
    // the reader's own namespace; the user namespace because uids and
    // capabilities are relative to it.
    // The network namespace because the side socket (abstract unix,
    // see tp__cma_side_listen) is reachable only inside it.
    uint64_t pidns = 0, userns = 0, netns = 0;
    if ((e = tp__host_ns_inode("pid", &pidns)) != 0) {
        return tp__error_errno(err_p, e, "cma: domain: stat /proc/self/ns/pid");
    }
    if ((e = tp__host_ns_inode("net", &netns)) != 0) {
        return tp__error_errno(err_p, e, "cma: domain: stat /proc/self/ns/net");
    }
    if ((e = tp__host_ns_inode("user", &userns)) != 0) {
        return tp__error_errno(err_p, e,
                               "cma: domain: stat /proc/self/ns/user");
    }
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0) {
        return tp__error_errno(err_p, errno, "cma: domain: getresuid");
    }
    char why[160];
    int scope = tp__host_ptrace_scope(why, sizeof(why));
    if (scope < 0) {
        return tp__error_set(err_p, TP_EIO, "cma: domain: %s", why);
    }
    char tmp[TP_CMA_DOMAIN_MAX];
    int n =
        snprintf(tmp, sizeof(tmp),
                 "cma:%s:pidns=%" PRIu64 ":userns=%" PRIu64 ":netns=%" PRIu64
                 ":uid=%u/%u/%u:gid=%u/%u/%u:yama=%d",
                 boot, pidns, userns, netns, (unsigned)ru, (unsigned)eu,
                 (unsigned)su, (unsigned)rg, (unsigned)eg, (unsigned)sg, scope);
    if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(tmp)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "cma: domain: %d bytes do not fit in %zu", n, len);
    }
    memcpy(buf, tmp, (size_t)n + 1);
    return TP_OK;
}

// ---- cross-memory attach: viability
// -------------------------------------------------------------

// Reads a local buffer through process_vm_readv(getpid()). This passes
// every ptrace check (same thread group), so it fails only if the syscall
// is missing or filtered.
static bool
cma_self_test(char *why, size_t why_len)
{
    uint8_t src[64], dst[64];
    for (size_t i = 0; i < sizeof(src); i++) {
        src[i] = (uint8_t)(i * 37u + 11u);
    }
    memset(dst, 0, sizeof(dst));
    tp_error *err = NULL;
    tp_status st = tp__cma_read(getpid(), (uint64_t)(uintptr_t)src, dst,
                                sizeof(src), &err);
    if (st != TP_OK) {
        int e = tp_error_errno(err);
        char seccomp[32] = "";
        bool filtered =
            host_status_field("Seccomp", seccomp, sizeof(seccomp)) &&
            strcmp(seccomp, "2") == 0;
        if (e == EPERM) {
            // Docker's default seccomp profile allows the syscall only to
            // containers with CAP_SYS_PTRACE.
            snprintf(why, why_len,
                     "process_vm_readv: operation not permitted (%s Docker's "
                     "default profile blocks it)",
                     filtered ? "a seccomp filter is active;" : "seccomp?");
        } else if (e == ENOSYS) {
            snprintf(why, why_len,
                     "process_vm_readv: function not implemented (%s)",
                     filtered ? "a seccomp filter is active, or the kernel "
                                "lacks CONFIG_CROSS_MEMORY_ATTACH"
                              : "kernel without CONFIG_CROSS_MEMORY_ATTACH");
        } else {
            snprintf(why, why_len, "self-test: %s", tp_error_message(err));
        }
        tp_error_unref(err);
        return false;
    }
    if (memcmp(src, dst, sizeof(src)) != 0) {
        snprintf(why, why_len,
                 "process_vm_readv self-test: the bytes read differ from "
                 "those written");
        return false;
    }
    return true;
}

static bool
cma_viable(char *why, size_t why_len)
{
    char dom[TP_CMA_DOMAIN_MAX];
    tp_error *err = NULL;
    if (tp__cma_domain(dom, sizeof(dom), &err) != TP_OK) {
        snprintf(why, why_len, "%s", tp_error_message(err));
        tp_error_unref(err);
        return false;
    }
    if (!cma_self_test(why, why_len)) {
        return false;
    }
    // SUID_DUMP_USER (1) is the only value that lets a peer without
    // CAP_SYS_PTRACE read us; 0 and 2 (suidsafe) refuse.
    int d = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
    if (d != 1) {
        snprintf(why, why_len,
                 "process not dumpable (prctl PR_GET_DUMPABLE = %d)", d);
        return false;
    }
    // The reader's real ids must equal all three of ours; the domain
    // compares them, so they must agree among themselves too.
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0) {
        snprintf(why, why_len, "getresuid: %s", strerror(errno));
        return false;
    }
    if (ru != eu || ru != su) {
        snprintf(why, why_len,
                 "uids differ (real %u, effective %u, saved %u): a peer's "
                 "real uid must match all three",
                 (unsigned)ru, (unsigned)eu, (unsigned)su);
        return false;
    }
    if (rg != eg || rg != sg) {
        snprintf(why, why_len,
                 "gids differ (real %u, effective %u, saved %u): a peer's "
                 "real gid must match all three",
                 (unsigned)rg, (unsigned)eg, (unsigned)sg);
        return false;
    }
    int scope = tp__host_ptrace_scope(why, why_len);
    switch (scope) {
    case 0:
        return true;
    case 1: {
        int e = host_set_ptracer_any();
        if (e != 0) {
            snprintf(why, why_len,
                     "ptrace scope 1 (%s): only ancestors may attach, and "
                     "prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) failed: %s",
                     TP_HOST_YAMA_PATH, strerror(e));
            return false;
        }
        return true;
    }
    case 2:
        // Peers in our domain have the same uid; if we hold CAP_SYS_PTRACE
        // a viable peer does too (it ran this same check).
        if (cma_has_cap_sys_ptrace()) {
            return true;
        }
        snprintf(why, why_len,
                 "ptrace scope 2 (%s): only admin may attach (CAP_SYS_PTRACE, "
                 "which this process lacks)",
                 TP_HOST_YAMA_PATH);
        return false;
    case 3:
        snprintf(why, why_len,
                 "ptrace scope 3 (%s): no process may attach (fixed until "
                 "reboot)",
                 TP_HOST_YAMA_PATH);
        return false;
    default:
        return false; // why set by tp__host_ptrace_scope
    }
}

bool
tp__cma_viable(char *why, size_t why_len)
{
    char tmp[512];
    bool ok = cma_viable(tmp, sizeof(tmp));
    if (!ok && why_len > 0) {
        snprintf(why, why_len, "%s", tmp);
    }
    return ok;
}

// ---- cross-memory attach: read
// ------------------------------------------------------------------

static tp_status
cma_read_error(tp_error **err_p, int e, pid_t pid, uint64_t remote,
               uint64_t len, uint64_t off)
{
    // ESRCH: the pid does not exist, exited (a zombie has no mm) or lives
    // in another pid namespace. The peer is gone: a connection-scope error.
    tp_status st = e == ESRCH ? TP_ECONNRESET : tp__status_from_errno(e);
    char et[128];
    if (e == ESRCH) {
        snprintf(et, sizeof(et), "process gone (ESRCH)");
    } else {
        cma_errno_text(e, et, sizeof(et));
    }
    if (err_p != NULL) {
        *err_p = tp__error_new(st, e, NULL,
                               "cma: read %" PRIu64 " bytes at 0x%" PRIx64
                               " from pid %d: %s (offset %" PRIu64 ")",
                               len, remote, (int)pid, et, off);
    }
    return st;
}

tp_status
tp__cma_read_chunked(pid_t pid, uint64_t remote, void *dst, uint64_t len,
                     uint64_t chunk, tp_error **err_p)
{
    if (chunk == 0 || chunk >= TP_CMA_CHUNK_LIMIT) {
        return tp__error_set(
            err_p, TP_EINVAL,
            "cma: chunk of %" PRIu64 " bytes: must be 1 to 2 GiB - 1", chunk);
    }
    if (len == 0) {
        return TP_OK;
    }
    TP_ASSERT(dst != NULL);
    if (pid <= 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "cma: read %" PRIu64 " bytes at 0x%" PRIx64
                             " from pid %d: bad pid",
                             len, remote, (int)pid);
    }
    if (remote + len < remote ||
        (uint64_t)(uintptr_t)(remote + len - 1) != remote + len - 1) {
        return tp__error_set(err_p, TP_EINVAL,
                             "cma: read %" PRIu64 " bytes at 0x%" PRIx64
                             " from pid %d: the range wraps the address "
                             "space",
                             len, remote, (int)pid);
    }
    uint8_t *d = dst;
    uint64_t off = 0;
    while (off < len) {
        size_t n = (size_t)TP_MIN(len - off, chunk);
        struct iovec liov = {.iov_base = d + off, .iov_len = n};
        struct iovec riov = {.iov_base = (void *)(uintptr_t)(remote + off),
                             .iov_len = n};
        ssize_t r = process_vm_readv(pid, &liov, 1, &riov, 1, 0);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return cma_read_error(err_p, errno, pid, remote, len, off);
        }
        if (r == 0) {
            // Not seen in practice (a fault at the first byte is EFAULT),
            // but looping on it would never end.
            return cma_read_error(err_p, EIO, pid, remote, len, off);
        }
        // A short count means a fault part-way through; the next call
        // starts at the faulting page and reports it.
        off += (uint64_t)r;
    }
    return TP_OK;
}

tp_status
tp__cma_read(pid_t pid, uint64_t remote, void *dst, uint64_t len,
             tp_error **err_p)
{
    return tp__cma_read_chunked(pid, remote, dst, len, TP_CMA_CHUNK, err_p);
}
