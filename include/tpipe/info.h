/* SPDX-License-Identifier: Apache-2.0 */
/* info.h - what this build and this host offer: the transports, channels
 * and loop backends compiled in, best first, whether each works here and,
 * when not, why. `tpipe info` prints these lists; the benchmarks use them
 * to check names and to skip what cannot work.
 *
 * Each call evaluates viability now, with the tunables of the environment
 * (TP_*; a malformed value counts as its default here: tp_config_visit
 * reports it). The answers are those a context created now would get:
 * cma, for instance, says "not viable: ptrace_scope is 2 (Yama)" or that
 * the process may not attach to itself in its user namespace.
 *
 * Each list function fills at most @cap entries of @out (which may be NULL
 * when @cap is 0) in the library's order of preference and stores in *n_p
 * how many entries the full list has, so a caller can size @out with a
 * first call of @cap 0. TP_INFO_MAX entries are always enough.
 *
 * Errors: TP_EINVAL (@n_p NULL, or @out NULL with @cap > 0). Probing
 * failures of a single entry are no error of the call: they are in that
 * entry's reason or error.
 *
 * Threads: any thread, any time (no context needed). A call may block
 * briefly (probes create and remove small resources: a memfd, an
 * io_uring, a socket); TP_INFO_PROBE also starts and stops a loop thread.
 */
#ifndef TPIPE_INFO_H
#define TPIPE_INFO_H

#include <stdbool.h>
#include <stddef.h>

#include <tpipe/error.h>
#include <tpipe/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/** TP_INFO_MAX - the most entries any list has. */
#define TP_INFO_MAX 16
/** TP_INFO_TEXT_MAX - the size of every text field, NUL included. */
#define TP_INFO_TEXT_MAX 256

/**
 * TP_INFO_PROBE - flag of tp_info_transports: also create each viable
 * transport on a loop (the configured TP_IO_BACKEND) to read its domain
 * descriptor, and listen on its default address (closed at once) to read
 * that address.
 */
#define TP_INFO_PROBE 0x1u

/** tp_backend_info - one transport, channel or loop backend. */
typedef struct tp_backend_info {
    /** "shm", "tcp"; "xth", "cma", "mpt", "basic"; "epoll", "uring".
     * Static: valid after the call returns. */
    const char *name;
    /** Position in the order of preference, 0 = tried first. */
    unsigned priority;
    /** Usable in this process, with this configuration. */
    bool viable;
    /** Loop backends: the one TP_IO_BACKEND selects here ("auto" falls
     * back to epoll when io_uring is not viable). Otherwise false. */
    bool selected;
    /** Transports: connects processes of one host only (shm); a channel
     * that needs network lanes (mpt) cannot run over it. */
    bool same_host;
    /** Why not viable (empty when viable). */
    char reason[TP_INFO_TEXT_MAX];
    /** With TP_INFO_PROBE (transports only): the domain descriptor (two
     * ends can connect when theirs are equal) and the default listen
     * address; empty otherwise or when the probe failed. */
    char domain[TP_INFO_TEXT_MAX];
    char listen_addr[TP_INFO_TEXT_MAX];
    /** With TP_INFO_PROBE: why creating or listening failed although the
     * transport is viable; empty when it worked. */
    char error[TP_INFO_TEXT_MAX];
    /** Channels: a device channel (cuda_ipc), which carries only tensors
     * on a CUDA device at the writer: a pipe takes it beside its channel,
     * never as its channel (docs/cuda.md). */
    bool device_channel;
} tp_backend_info;

/**
 * tp_info_transports - the transports compiled in, best first (the order
 * a pipe tries them). @flags: 0 or TP_INFO_PROBE.
 */
TP_API tp_status tp_info_transports(unsigned flags, tp_backend_info *out,
                                    size_t cap, size_t *n_p, tp_error **err_p);

/**
 * tp_info_channels - the channels compiled in, best first (the order a
 * pipe tries them). @flags: 0.
 */
TP_API tp_status tp_info_channels(unsigned flags, tp_backend_info *out,
                                  size_t cap, size_t *n_p, tp_error **err_p);

/**
 * tp_info_io_backends - the loop backends, best first: uring (viable
 * when the io_uring probe passes), then epoll (always viable), with the
 * one the configuration selects marked. @flags: 0.
 */
TP_API tp_status tp_info_io_backends(unsigned flags, tp_backend_info *out,
                                     size_t cap, size_t *n_p, tp_error **err_p);

/**
 * tp_info_collective_engines - the engines of the process groups, in the
 * order a group considers them: "shm" (one host: shared memory; viable
 * when this host allows it, or why not), "pipe" (algorithms over pipes;
 * always viable), "nccl" (CUDA tensors; viable when libnccl and a GPU are
 * found at run time, or why not). @flags: 0.
 */
TP_API tp_status tp_info_collective_engines(unsigned flags,
                                            tp_backend_info *out, size_t cap,
                                            size_t *n_p, tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
