/* SPDX-License-Identifier: Apache-2.0 */
/* launch.h (internal) - what env:// learns from the launcher when
 * MASTER_ADDR is unset: under Slurm, rank 0's host from the job's node
 * list and a port from the job id (slurm.c); under a PMIx launcher, rank
 * 0's store address exchanged through PMIx (pmix.c). docs/store.md. */
#ifndef TP_STORE_LAUNCH_H
#define TP_STORE_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

// The derived port: TP__SLURM_PORT_BASE + job id mod TP__SLURM_PORT_SPAN,
// 20000..29999 (below the kernel's default ephemeral ports).
#define TP__SLURM_PORT_BASE 20000
#define TP__SLURM_PORT_SPAN 10000
// Hosts one node list may expand to (a bound against "n[0-999999999]").
#define TP__SLURM_MAX_HOSTS 1000000

// Called for each host of a node list, in order; false stops the walk.
typedef bool (*tp__slurm_host_fn)(void *arg, const char *host);

// Expands a Slurm hostlist ("node[01-03,07]", "a1,b[2-3]",
// "gpu-[001-004]-ib", "r[1-2]n[1-2]") and calls @fn for each host. The
// whole list is checked even when @fn stops early. Errors: TP_EINVAL with
// a message naming the list and what is wrong (unclosed "[", empty range,
// descending range, a non-digit in a range, an empty name, a name over
// 255 bytes, more than TP__SLURM_MAX_HOSTS hosts).
tp_status tp__slurm_nodelist_visit(const char *list, tp__slurm_host_fn fn,
                                   void *arg, tp_error **err_p);

// The first host of @list into @buf (@len bytes); errors as above.
tp_status tp__slurm_first_host(const char *list, char *buf, size_t len,
                               tp_error **err_p);

// The store port of Slurm job @job_id.
unsigned tp__slurm_port(uint64_t job_id);

// Under Slurm (SLURM_JOB_ID and a node list set): rank 0's host (the
// first of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, else
// SLURM_NODELIST) and port (from SLURM_JOB_ID), each only where @host or
// @port is empty on entry. *found_p false (and nothing changed) when not
// under Slurm. Errors: TP_EINVAL naming the variable.
tp_status tp__slurm_master(char *host, size_t hlen, char *port, size_t plen,
                           bool *found_p, tp_error **err_p);

// True when this process was started by a PMIx launcher (PMIX_RANK and
// PMIX_NAMESPACE set) and the library was built with PMIx.
bool tp__pmix_present(void);

// Exchanges the store address through PMIx: the process with PMIx rank 0
// passes @mine (its address) and everyone, it included, gets rank 0's
// address in @buf (@len bytes). A collective over the namespace: every
// process of the job must call it. Errors: TP_ENOTSUP without PMIx,
// TP_EINVAL for a rank mismatch, TP_ETIMEDOUT, TP_EINTERNAL naming the
// PMIx call and its status string.
tp_status tp__pmix_exchange(const char *mine, int store_rank,
                            int64_t timeout_ms, char *buf, size_t len,
                            tp_error **err_p);

#endif
