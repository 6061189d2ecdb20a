/* SPDX-License-Identifier: Apache-2.0 */
/* fault.h - fault injection in the generic transport layer, for tests.
 * Built in every configuration; costs one NULL check per write when off.
 *
 * A fault applies to the writes of a conn: the generic layer (transport.c)
 * wraps the backend's conn_write, so every transport gets it. Bytes are
 * counted from the conn's first write.
 *
 *   close_after=N  bytes up to N go out; then the conn is closed: the
 *                  write that reaches N fails with TP_ECONNRESET, later ones
 *                  fail, and the peer's reads fail as on a peer that died
 *                  (EOF, naming this side).
 *   drop_after=N   bytes up to N go out; later bytes are discarded and
 *                  their writes complete with success (a black hole).
 *   stall_after=N  bytes up to N go out; later writes never complete
 *                  (until their timeout, a cancel or the conn's close).
 *   delay_ms=D     each write starts D ms after it was submitted (order is
 *                  kept; its timeout starts then too).
 * At most one of close_after, drop_after, stall_after; delay_ms combines
 * with any.
 *
 * Environment (read by tp__transport_create, so by every context made
 * afterwards): TP_FAULT="transport=tcp,close_after=4096" - comma-separated
 * key=value; transport=NAME limits it to one backend (default: all).
 * Sizes are decimal with an optional K, M or G (binary) suffix. Anything
 * else (an unknown key, a repeated key, a bad number, two byte limits) is
 * an error: the transport is not created, and the message says what is
 * wrong.
 */
#ifndef TP_TRANSPORT_FAULT_H
#define TP_TRANSPORT_FAULT_H

#include <stdint.h>

#include "transport/transport.h"

typedef enum tp_fault_mode {
    TP_FAULT_NONE = 0,
    TP_FAULT_CLOSE = 1, // close after f_after bytes
    TP_FAULT_DROP = 2,  // discard after f_after bytes
    TP_FAULT_STALL = 3, // never complete after f_after bytes
} tp_fault_mode;

typedef struct tp_fault {
    char f_transport[32]; // "" = every transport
    int f_mode;           // tp_fault_mode
    uint64_t f_after;     // bytes that go out before the fault
    int64_t f_delay_ms;   // 0 = no delay
} tp_fault;

// Parses @spec (the TP_FAULT syntax above) into *f_p. TP_EINVAL with a
// message naming the bad part.
tp_status tp__fault_parse(const char *spec, tp_fault *f_p, tp_error **err_p);

// Any thread, before the transport's conns are made: conns created from
// now on get @f (NULL or TP_FAULT_NONE without delay: none). Overrides
// TP_FAULT.
void tp__transport_fault_set(tp_transport *t, const tp_fault *f);

// Any thread: from its next write on, @c gets @f (NULL: none; bytes
// already written count towards f_after). Runs on the loop thread (posted,
// and waited for, from other threads). TP_ENOMEM.
tp_status tp__conn_fault_set(tp_conn *c, const tp_fault *f);

// ---- between transport.c and fault.c (loop thread) -------------------------

// Gives @c the fault @f (NULL: a fault that does nothing yet), allocating
// its state on first use. TP_ENOMEM.
tp_status tp__conn_fault_attach(tp_conn *c, const tp_fault *f);

// Frees what fault injection holds for @c (c_fault may be NULL).
void tp__conn_fault_free(tp_conn *c);

// A write on @c, which has a fault: delayed, held, sent, dropped or
// stalled as the fault says.
void tp__conn_fault_write(tp_conn *c, tp_aio *aio);

// @c was closed: stalled writes fail, held ones go to the closed backend.
void tp__conn_fault_on_close(tp_conn *c);

// transport.c: the backend's close of @c, then tp__conn_fault_on_close.
void tp__conn_close_now(tp_conn *c);

#endif
