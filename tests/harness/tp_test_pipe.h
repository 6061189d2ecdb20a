/* SPDX-License-Identifier: Apache-2.0 */
/* tp_test_pipe.h - what the pipe, channel and CUDA tests share to get
 * pipes to test: a context of given transports and channels, a pipe pair
 * inside one process, a descriptor read, and a forked peer process that
 * gets (or gives) a listener URL through a pipe. Every wait has a
 * deadline (scaled by TP_TEST_TIMEOUT_MULTIPLIER); a helper that cannot
 * do its part fails the case, saying what and where. Accepting one pipe
 * is op_pipe_accept (tp_test_op.h). */
#ifndef TP_TEST_PIPE_H
#define TP_TEST_PIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tpipe/pipe.h>

// A context named @name restricted to @transports and @channels
// (comma-separated lists; NULL: all that are viable). Fails the case if
// tp_context_create fails.
tp_context *tp_test_ctx(const char *name, const char *transports,
                        const char *channels);

// Two ends of a pipe between two contexts of this process: @b connected
// to @a's listener.
typedef struct tp_test_pair {
    tp_context *a, *b;
    tp_pipe_listener *l; // @a's
    tp_pipe *pa;         // accepted (listener side)
    tp_pipe *pb;         // connected
} tp_test_pair;

// Takes @a and @b; listens on @a at @url (NULL: each transport of @a at
// its default address), connects @b to the listener's first address,
// accepts the pipe and waits until @b's end is ready, each within @ms.
// Fails the case on error.
void tp_test_pair_open(tp_test_pair *pr, tp_context *a, tp_context *b,
                       const char *url, int64_t ms);
// Unrefs both ends, destroys the listener and both contexts (@b first).
void tp_test_pair_close(tp_test_pair *pr);

// The next descriptor of @p, read within @ms (an aio timeout of @ms too);
// the case fails if the read fails or overruns. The caller owns it.
tp_message *tp_test_read_desc(tp_pipe *p, int64_t ms);

// ---- a forked peer process --------------------------------------------------

// Which way the one line of the peer's pipe goes.
typedef enum tp_test_peer_dir {
    TP_TEST_PEER_DOWN, // from this process to the child (the URL to dial)
    TP_TEST_PEER_UP,   // from the child to this process (its listener URL)
} tp_test_peer_dir;

typedef struct tp_test_peer {
    const char *name; // for messages ("writer", "reader")
    pid_t pid;        // the child's (0 in the child itself)
    int fd;           // this process's end of the line pipe; -1 once used
} tp_test_peer;

typedef void (*tp_test_peer_fn)(tp_test_peer *self, void *arg);

// Forks a child named @name (borrowed: a string that outlives the peer)
// with a pipe between it and this process, one way as @dir says. The
// child runs fn(self, arg), its end of the pipe in self->fd, and exits 0
// when fn returns (a failed check exits 1, a skip 77; fn may _exit
// itself). Fork before this process starts threads where it can: TSan
// does not follow threads across fork, nor does a real CUDA runtime.
// Output buffered by stdio is flushed first, so it is not written twice.
void tp_test_peer_fork(tp_test_peer *pe, const char *name, tp_test_peer_dir dir,
                       tp_test_peer_fn fn, void *arg);
// Writes @line and a newline to the pipe and closes this end. A line, not
// end of file, marks the end: a peer forked later may hold the same pipe
// open. Fails the case if the write fails.
void tp_test_peer_send(tp_test_peer *pe, const char *line);
// Reads one line (without its newline) into @buf within @ms and closes
// this end. False, with @buf empty, at end of file, an error, a line that
// does not fit @len, or the deadline.
bool tp_test_peer_recv(tp_test_peer *pe, char *buf, size_t len, int64_t ms);
// Waits up to @ms for the child to exit and returns its waitpid status.
// Past the deadline it kills the child and fails the case.
int tp_test_peer_wait_status(tp_test_peer *pe, int64_t ms);
// As tp_test_peer_wait_status; fails the case unless the child exited 0,
// naming it and how it ended.
void tp_test_peer_wait(tp_test_peer *pe, int64_t ms);
// Kills the child (SIGKILL) and reaps it.
void tp_test_peer_kill(tp_test_peer *pe);

#endif
