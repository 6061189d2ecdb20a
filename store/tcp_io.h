/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_io.h (internal) - blocking socket I/O bounded by a deadline, shared
 * by the tcp store client and server. */
#ifndef TP_STORE_TCP_IO_H
#define TP_STORE_TCP_IO_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

// Milliseconds until @deadline_ns for poll (rounded up), -1 for none.
int tp__io_poll_ms(uint64_t deadline_ns);
void tp__io_sleep_ms(uint64_t ms);

// Writes all @n bytes (MSG_NOSIGNAL). Errors: TP_ETIMEDOUT, or the status
// of the errno; @why gets a lowercase reason.
tp_status tp__io_write_all(int fd, const void *p, size_t n,
                           uint64_t deadline_ns, char *why, size_t why_len);
// Reads exactly @n bytes. Errors: TP_ECLOSED if the peer closed before the
// first byte, TP_ECONNRESET if it closed in the middle, TP_ETIMEDOUT, or
// the status of the errno.
tp_status tp__io_read_all(int fd, void *p, size_t n, uint64_t deadline_ns,
                          char *why, size_t why_len);

#endif
