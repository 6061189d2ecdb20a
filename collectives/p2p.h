/* SPDX-License-Identifier: Apache-2.0 */
/* p2p.h (internal) - tagged point-to-point messages between the ranks of a
 * job over pipes: the transport of the pipe engine's algorithms and of
 * tp_pg_send / tp_pg_recv.
 *
 * One tp__p2p per world group. It listens on every transport of its
 * context; a pipe to a rank is made on the first send to it (one pipe per
 * direction: a rank writes only on the pipes it connected and reads only
 * on the pipes it accepted, so there are no connect races).
 *
 * A message carries (group id, channel, tag, source rank) and one buffer.
 * A recv matches the first message with its group, channel, tag and source
 * (or any source): messages from one source with one key match the recvs
 * in the order both were issued. A message that arrives before its recv
 * waits in an unexpected queue (one extra copy); a recv posted first
 * receives straight into its buffer.
 *
 * Peer failures: a pipe error to or from a rank fails that rank's pending
 * sends and recvs (naming it), and every later send to it. A waiter that
 * waits more than TP__P2P_PROBE_MS for a recv from a rank writes a probe to
 * it, so a peer that died before ever connecting is still noticed. An
 * abort message tells the other ranks of a group that it failed.
 *
 * A query asks a rank which sequence number it has reached on a group;
 * the peer's loop thread answers (through a helper thread, which may
 * connect), so a rank busy elsewhere or in user code answers, and one
 * that is stopped or dead does not: the pipe engine names the rank that
 * never called a collective that timed out. */
#ifndef TP_COLLECTIVES_P2P_H
#define TP_COLLECTIVES_P2P_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>
#include <tpipe/pipe.h>

#define TP__P2P_PROBE_MS 200
// The longest wait for the answers of a query (tp__p2p_query_seqs).
#define TP__P2P_QUERY_MS 500
// The longest abort reason carried, in bytes.
#define TP__P2P_MAX_REASON 2048

typedef struct tp__p2p tp__p2p;
typedef struct tp__req tp__req;

enum {
    TP__CHAN_P2P = 0,  // tp_pg_send / tp_pg_recv
    TP__CHAN_COLL = 1, // collectives of the pipe engine
};

// Called once when a request completes, on the thread that completed it
// (a loop thread, or the caller's for requests completed at once); short
// and non-blocking. The request may be freed by its owner as soon as the
// callback returned.
typedef void (*tp__req_cb)(tp__req *r, void *arg);
// An abort from rank @from for group @gid: @reason names what failed.
// On a loop thread, short.
typedef void (*tp__p2p_abort_cb)(void *arg, uint64_t gid, int from,
                                 const char *reason);
// Rank @rank failed (the pipe to or from it). On any thread, short.
typedef void (*tp__p2p_fail_cb)(void *arg, int rank, const tp_error *err);
// Rank @from asks which sequence number this rank reached on group @gid:
// true with *@next_p = how many sequence numbers the group has taken
// here (its collectives #0 .. #next-1 were called); false if there is no
// such group here with @from as a member (not made yet, or destroyed).
// On a loop thread, short, non-blocking.
typedef bool (*tp__p2p_query_cb)(void *arg, uint64_t gid, int from,
                                 uint64_t *next_p);

// Creates the context (allow lists from @co) and listens: on loopback tcp
// when @loopback. @name prefixes messages ("pg world rank 0").
tp_status tp__p2p_create(const tp_context_options *co, bool loopback, int rank,
                         int world, const char *name, tp__p2p **p_p,
                         tp_error **err_p);
// The addresses to publish, newline-separated, best first.
const char *tp__p2p_urls(const tp__p2p *p);
// Sets rank @r's published addresses (copied); then tp__p2p_start.
tp_status tp__p2p_set_peer(tp__p2p *p, int r, const char *urls,
                           tp_error **err_p);
void tp__p2p_set_callbacks(tp__p2p *p, tp__p2p_abort_cb abort_cb,
                           tp__p2p_fail_cb fail_cb, tp__p2p_query_cb query_cb,
                           void *arg);
// Starts accepting pipes.
void tp__p2p_start(tp__p2p *p);
// Fails everything pending with TP_ECLOSED, closes the pipes, frees.
void tp__p2p_destroy(tp__p2p *p);

// Posts a send of @len bytes at @buf (borrowed until completion) to rank
// @dst (may be this rank). Errors at once: the rank already failed.
tp_status tp__p2p_isend(tp__p2p *p, int dst, uint64_t gid, int chan,
                        uint64_t tag, const void *buf, size_t len,
                        tp__req_cb cb, void *cb_arg, tp__req **r_p,
                        tp_error **err_p);
// Posts a recv of exactly @len bytes into @buf from rank @src or -1 (any).
tp_status tp__p2p_irecv(tp__p2p *p, int src, uint64_t gid, int chan,
                        uint64_t tag, void *buf, size_t len, tp__req_cb cb,
                        void *cb_arg, tp__req **r_p, tp_error **err_p);

bool tp__req_done(const tp__req *r);
// After done: the status and (new reference) error.
tp_status tp__req_status(const tp__req *r, tp_error **err_p);
// After a recv completed: the source rank.
int tp__req_source(const tp__req *r);
// Cancels @r if still pending (a recv being received closes its pipe; a
// send in flight is canceled, which may close its pipe) and waits up to
// 5 s for it to complete. Then frees. NULL is fine.
void tp__req_cancel_free(tp__req *r);
// As tp__req_cancel_free, but a send in flight gets @grace_ms (-1: the
// usual 5 s) to complete on its own before it is canceled.
void tp__req_cancel_free_within(tp__req *r, int64_t grace_ms);
// Frees a completed request.
void tp__req_free(tp__req *r);
// Gives @r to the p2p layer: freed now if complete, else once it
// completes (its callback still runs). May be called from its callback.
void tp__req_detach(tp__req *r);

// Waits until each of the @n requests (NULL entries skipped) completed,
// or @deadline_ns, or @check(@arg) returns an error (checked whenever a
// request completes and every few ms). Probes the sources of pending
// recvs that waited longer than TP__P2P_PROBE_MS. Returns TP_OK or the
// first error (a request's, @check's, or TP_ETIMEDOUT prefixed with @what
// alone, giving the time since @start_ns, the operation's start (0: this
// call), and the timeout it had).
// Requests are not freed.
tp_status tp__p2p_waitall(tp__p2p *p, tp__req *const *rs, int n,
                          uint64_t start_ns, uint64_t deadline_ns,
                          tp_status (*check)(void *arg, tp_error **err_p),
                          void *arg, const char *what, tp_error **err_p);
// Writes a probe to world rank @rank if none went there in the last
// TP__P2P_PROBE_MS and it is not known to have failed: a dead rank fails
// the write (and so its pending recvs). Does not wait.
void tp__p2p_probe(tp__p2p *p, int rank);
// Wakes the waiters of tp__p2p_waitall (to re-run their checks).
void tp__p2p_kick(tp__p2p *p);

// The error rank @rank failed with (new reference), or NULL.
tp_error *tp__p2p_peer_error(tp__p2p *p, int rank);
// Best effort, does not wait: tells rank @dst that group @gid failed.
void tp__p2p_send_abort(tp__p2p *p, int dst, uint64_t gid, const char *reason);

// What a query learnt of one rank.
typedef enum tp__p2p_seq_state {
    TP__P2P_SEQ_SELF,      // this rank: not asked
    TP__P2P_SEQ_NO_ANSWER, // no answer within the bound (stopped, dead?)
    TP__P2P_SEQ_FAILED,    // known to have failed (tp__p2p_peer_error)
    TP__P2P_SEQ_NO_GROUP,  // it has no such group (not made, destroyed)
    TP__P2P_SEQ_OK,        // answered: next
} tp__p2p_seq_state;

typedef struct tp__p2p_seq {
    tp__p2p_seq_state state;
    uint64_t next; // TP__P2P_SEQ_OK: sequence numbers taken there
} tp__p2p_seq;

// Asks world ranks @wranks[0..@n) which sequence number they reached on
// group @gid and waits up to @bound_ms for their answers (fewer if all
// came): @out[i] says what rank @wranks[i] answered. Blocks; not on a
// loop thread. No error: what could not be learnt is in @out.
void tp__p2p_query_seqs(tp__p2p *p, uint64_t gid, const int *wranks, int n,
                        int64_t bound_ms, tp__p2p_seq *out);

// ---- wire (exposed for the fuzzer) -------------------------------------

#define TP__P2P_HDR 40

typedef struct tp__p2p_hdr {
    int kind; // 0 p2p, 1 collective, 2 abort, 3 probe, 4 query, 5 answer
    int src;  // world rank
    uint64_t gid;
    uint64_t tag;
    uint64_t nbytes;
} tp__p2p_hdr;

// Checks a received message: its metadata (the header) and its shape
// (payloads and tensors), for a receiver that is rank @self of @world on a
// pipe whose messages so far came from @pipe_src (-1: none yet). False,
// with @why, for anything malformed.
bool tp__p2p_hdr_check(const void *meta, uint64_t meta_len, uint32_t npayloads,
                       uint64_t payload_len, uint32_t ntensors,
                       uint64_t tensor_len, int world, int self, int pipe_src,
                       tp__p2p_hdr *hd, char *why, size_t why_len);
// Writes the TP__P2P_HDR bytes of @hd.
void tp__p2p_hdr_encode(uint8_t *out, const tp__p2p_hdr *hd);

// The payload of an answer: u64 next | u32 flags (bit 0: has the group) |
// u32 0.
#define TP__P2P_ANSWER_LEN 16

typedef struct tp__p2p_answer {
    bool has_group;
    uint64_t next; // 0 without the group
} tp__p2p_answer;

// Checks and decodes an answer's payload. False, with @why, for anything
// malformed (length, unknown flags, reserved bits, a count without the
// group).
bool tp__p2p_answer_decode(const void *buf, uint64_t len, tp__p2p_answer *a,
                           char *why, size_t why_len);
// Writes the TP__P2P_ANSWER_LEN bytes of @a.
void tp__p2p_answer_encode(uint8_t *out, const tp__p2p_answer *a);

#endif
