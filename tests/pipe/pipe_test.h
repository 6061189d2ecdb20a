/* SPDX-License-Identifier: Apache-2.0 */
/* pipe_test.h - what the sources of pipe_test share: the (transport,
 * channel) pair under test (TP_PIPE_TRANSPORT, TP_PIPE_CHANNEL), contexts
 * and pipes allowed only that pair, messages filled with a pattern and
 * checked on arrival (pipe_test_util.c), and the cases that pipe_test.c's
 * table runs (pipe_test_msgs.c, pipe_test_errors.c, pipe_test_fork.c). */
#ifndef PIPE_TEST_H
#define PIPE_TEST_H

#include <stdbool.h>
#include <stdint.h>

#include <tpipe/pipe.h>

#include "tp_test_pipe.h"

#define WAIT_MS 20000

// ---- the pair under test (pipe_test_util.c)

const char *tr_name(void);
const char *ch_name(void);
bool in_process_only(void);
// A context allowed exactly the pair under test. Skips if the channel or
// transport cannot work here, with the context's reason.
tp_context *make_ctx(const char *name);
tp_pipe_listener *make_listener(tp_context *ctx);
// A pipe between two contexts of this process, each allowed the pair.
void pair_open(tp_test_pair *pr);

// ---- messages (pipe_test_util.c)

// A message with @np payloads and @nt tensors of the given sizes, filled.
tp_message *make_msg(uint32_t np, const uint64_t *psz, uint32_t nt,
                     const uint64_t *tsz, uint32_t seed);
void free_sent(tp_message *m);
// Reads one message from @p and checks it against what make_msg built.
void recv_check(tp_pipe *p, uint32_t np, const uint64_t *psz, uint32_t nt,
                const uint64_t *tsz, uint32_t seed);
// Writes @m on @tx and reads it on @rx, then waits for the write.
void send_recv(tp_pipe *tx, tp_pipe *rx, tp_message *m, uint32_t np,
               const uint64_t *psz, uint32_t nt, const uint64_t *tsz,
               uint32_t seed);

// ---- cases

// pipe_test_msgs.c
void test_negotiates_pair(void);
void test_shapes(void);
void test_many_parts(void);
void test_256mib_in_process(void);
void test_ordering(void);
void test_above_2gib(void);
// pipe_test_errors.c
void test_close_pending(void);
void test_read_timeout_keeps_pipe(void);
void test_destroy_with_pending(void);
void test_bad_user_input(void);
void test_options_errors(void);
void test_no_common_channel(void);
// pipe_test_fork.c
void test_cross_process_echo(void);
void test_peer_killed(void);

#endif
