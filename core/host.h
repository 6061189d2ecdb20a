/* SPDX-License-Identifier: Apache-2.0 */
/* host.h (internal) - who this process is on its host: the boot id,
 * namespace inodes, Yama's ptrace scope, and cross-memory attach
 * (process_vm_readv: viability, the descriptor two peers compare, the
 * one-copy read). One copy for every user: the shm transport, the cma
 * channel and the collectives' shared-memory engine. Thread safety: any
 * thread, for all of it. */
#ifndef TP_CORE_HOST_H
#define TP_CORE_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

#define TP_HOST_BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"
#define TP_HOST_YAMA_PATH    "/proc/sys/kernel/yama/ptrace_scope"

// ---- identity --------------------------------------------------------------

// The running kernel's boot id (TP_HOST_BOOT_ID_PATH, first line) into
// @buf (64 bytes are enough): equal in two processes = same host, same
// boot. Returns 0 or an errno (ENODATA for an empty file).
int tp__host_boot_id(char *buf, size_t len);

// The inode of /proc/self/ns/@ns ("net", "user", "pid"): equal in two
// processes of one host = same namespace. Returns 0 or the errno of stat.
int tp__host_ns_inode(const char *ns, uint64_t *ino_p);

// The Yama ptrace scope (/proc/sys/kernel/yama/ptrace_scope): 0 if Yama is
// absent, else 0..3; -1 if the file exists but cannot be read (then @why,
// if @why_len > 0, says why).
int tp__host_ptrace_scope(char *why, size_t why_len);

// ---- cross-memory attach ---------------------------------------------------

// tp__cma_read moves at most this many bytes per process_vm_readv call.
// The kernel caps one call at MAX_RW_COUNT (2 GiB - 4 KiB) and would return
// a short count above it; a power of two well below keeps calls full.
#define TP_CMA_CHUNK (UINT64_C(1) << 30)
// Chunks passed to tp__cma_read_chunked must be below this (2 GiB).
#define TP_CMA_CHUNK_LIMIT (UINT64_C(1) << 31)
// Enough for any descriptor tp__cma_domain writes.
#define TP_CMA_DOMAIN_MAX 256

// Whether cma can work in this process: /proc is readable, a self-test
// process_vm_readv of a local buffer succeeds and returns the right bytes,
// the process is dumpable, its real, effective and saved uids (and gids)
// agree, and the Yama ptrace scope lets peers attach. With scope 1 it makes
// tp__cma_allow_peers()'s prctl, and refuses if it fails. On false @why (if
// @why_len > 0) says why, e.g. "process_vm_readv: operation not permitted
// (seccomp? Docker's default profile blocks it)", "process not dumpable (prctl
// PR_GET_DUMPABLE = 0)", "ptrace scope 2 (/proc/sys/kernel/yama/
// ptrace_scope): only admin may attach (...)". Thread safety: any thread.
bool tp__cma_viable(char *why, size_t why_len);

// Lets any process of the same uid read this one under Yama ptrace scope 1
// (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)); without it only ancestors
// may. Best effort: a failure is logged (TP-CMA-PTRACER) and the next call
// tries again. Idempotent: one prctl per process (a forked child, which
// does not inherit the exception, makes its own). Does nothing when Yama is
// absent or its scope is not 1. Thread safety: any thread.
void tp__cma_allow_peers(void);

// Writes the domain descriptor into @buf (@len bytes, TP_CMA_DOMAIN_MAX is
// enough): "cma:<boot id>:pidns=<ino>:userns=<ino>:netns=<ino>:uid=<r>/<e>/<s>:
// gid=<r>/<e>/<s>:yama=<scope>". Two processes can reach each other with
// cma only if their descriptors are equal (and both are viable). @buf is
// written only on success. Errors: TP_EIO or the errno's status if /proc
// is unreadable, TP_EINVAL if @len is too small. Thread safety: any thread.
tp_status tp__cma_domain(char *buf, size_t len, tp_error **err_p);

// Copies @len bytes from address @remote in process @pid into @dst with
// process_vm_readv, one iovec and at most TP_CMA_CHUNK bytes per call,
// continuing after short reads. @dst is borrowed. A bad remote address
// never crashes: it is an error. Errors name the pid, the range, the offset
// reached and the errno: TP_EIO (EFAULT: bad address), TP_EPERM (EPERM:
// not allowed), TP_ECONNRESET (ESRCH: process gone), TP_EINVAL (bad
// arguments), others from the errno. On error the bytes before the offset
// reached have been copied. Thread safety: any thread.
tp_status tp__cma_read(pid_t pid, uint64_t remote, void *dst, uint64_t len,
                       tp_error **err_p);

// tp__cma_read with @chunk bytes at most per call; 0 < @chunk <
// TP_CMA_CHUNK_LIMIT, else TP_EINVAL. Exposed for tests.
tp_status tp__cma_read_chunked(pid_t pid, uint64_t remote, void *dst,
                               uint64_t len, uint64_t chunk, tp_error **err_p);

#endif
