/* SPDX-License-Identifier: Apache-2.0 */
/* p2p_impl.h (internal) - what the files of the p2p layer (p2p.h) share:
 * its structs and the functions one file calls in another.
 *   p2p.c       wire format and its check, incoming pipes (reading and
 *               matching messages), the context, accept, create, destroy
 *   p2p_req.c   requests (completion, detach, cancel) and posting recvs
 *   p2p_send.c  peers (failure, connecting), sends, waiting
 *   p2p_ctl.c   control messages: abort, probe, query and answer
 *
 * Locks: p_mtx guards the peer table's errors, the posted and unexpected
 * lists and the incoming pipes; it is taken by loop callbacks, so no pipe
 * call that waits for the loop (tp_context_connect) is made under it.
 * p_conn_mtx serialises connecting (never taken by a loop callback). */
#ifndef TP_COLLECTIVES_P2P_IMPL_H
#define TP_COLLECTIVES_P2P_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectives/p2p.h"
#include "core/list.h"
#include "core/platform.h"
#include "core/pool.h"

#define P2P_MAGIC          0x4c435054u // "TPCL"
#define P2P_VERSION        1
#define P2P_HDR            TP__P2P_HDR
#define P2P_KIND_DATA      0 // + chan: 0 p2p, 1 coll
#define P2P_KIND_ABORT     2
#define P2P_KIND_PROBE     3
#define P2P_KIND_QUERY     4 // tag: the query's id (not 0)
#define P2P_KIND_ANSWER    5 // tag: the query's id; payload: tp__p2p_answer
#define P2P_MAX_URLS       512
#define P2P_MAX_ADDRS      16 // listener addresses published (one per transport)
#define P2P_CANCEL_WAIT_MS 5000

typedef struct p2p_in p2p_in;
typedef struct p2p_ux p2p_ux;

struct tp__req {
    tp__p2p *r_p;
    bool r_send;
    int r_peer; // dst; src or -1
    uint64_t r_gid;
    int r_chan;
    uint64_t r_tag;
    void *r_buf;
    size_t r_len;
    _Atomic(tp__req_cb) r_cb; // cleared by tp__req_cancel_free's leak path
    void *r_cb_arg;
    uint64_t r_posted_ns;
    _Atomic bool r_done;
    bool r_detached; // under p_mtx: freed by the p2p layer
    tp_status r_st;
    tp_error *r_err;
    int r_source;
    // send
    uint8_t r_hdr[P2P_HDR];
    tp_msg_buf r_tbuf;
    tp_message r_msg;
    tp_aio *r_aio;
    tp_pipe *r_pipe; // reference while the write is in flight
    char *r_owned;   // freed with the request (an abort's reason)
    // recv (under p_mtx)
    p2p_in *r_in;        // being received by this pipe
    p2p_ux *r_ux;        // claimed an arriving unexpected message
    tp_list_node r_node; // in p_posted while posted
    tp__req *r_next;     // in a singly linked chain (p_dead, failed)
};

// A message that arrived before its recv.
struct p2p_ux {
    tp_list_node u_node; // in p_ux while queued
    int u_src;
    uint64_t u_gid;
    int u_chan;
    uint64_t u_tag;
    size_t u_len;
    void *u_data;      // self sends: malloc'd copy
    tp_message *u_msg; // from a pipe: pipe-owned buffer
    bool u_ready;
    bool u_drop; // received only to be dropped (size mismatch)
    tp__req *u_claim;
};

// A pipe a peer connected to us: we only read on it.
struct p2p_in {
    tp__p2p *i_p;
    p2p_in *i_next;
    tp_pipe *i_pipe;
    tp_aio *i_daio;
    tp_aio *i_raio;
    int i_src;         // -1 until its first message
    tp_message *i_msg; // the message being read
    int i_kind;
    tp__req *i_req; // matched recv
    p2p_ux *i_ux;   // or unexpected entry
    bool i_dead;
    bool i_local_close; // closed by a cancellation here (under p_mtx)
};

// A query waiting for its answers (p_queries, under p_mtx).
typedef struct p2p_query {
    uint64_t q_id;
    uint64_t q_gid;
    const int *q_wranks;
    tp__p2p_seq *q_out;
    int q_n;
    int q_left; // entries still TP__P2P_SEQ_NO_ANSWER
    struct p2p_query *q_next;
} p2p_query;

typedef struct p2p_peer {
    char *pe_urls;   // newline-separated
    tp_pipe *pe_out; // we write on it (under p_conn_mtx to create)
    tp_error *pe_err;
    uint64_t pe_probe_ns;
} p2p_peer;

struct tp__p2p {
    int p_rank;
    int p_world;
    char p_name[96];
    tp_context *p_ctx;
    tp_pipe_listener *p_listener;
    tp_aio *p_accept_aio;
    char p_urls[1024];
    p2p_peer *p_peers;
    tp_mtx p_mtx;
    tp_cv p_cv;
    tp_mtx p_conn_mtx;
    tp_list p_posted; // recvs waiting (tp__req), in post order
    tp_list p_ux;     // unexpected messages (p2p_ux), in arrival order
    p2p_in *p_ins;
    bool p_closing;
    uint64_t p_gen; // bumped on every completion, under p_mtx
    tp__p2p_abort_cb p_abort_cb;
    tp__p2p_fail_cb p_fail_cb;
    tp__p2p_query_cb p_query_cb;
    void *p_cb_arg;
    // queries (under p_mtx)
    uint64_t p_qid_last; // the id of the last query sent
    p2p_query *p_queries;
    // Sends the answers to queries (the loop thread must not connect:
    // p_conn_mtx). Made on the first query, under p_mtx; NULL once
    // p_closing.
    tp_pool *p_ans_pool;
    tp__req *p_dead; // detached and complete: freed on a user thread
};

// ---- p2p.c
// Writes the P2P_HDR bytes of a header.
void tp__p2p_hdr_put(uint8_t *h, int kind, int src, uint64_t gid, uint64_t tag,
                     uint64_t nbytes);

// ---- p2p_req.c
// Completes @r once: records the outcome, runs its callback, wakes the
// waiters. No lock held.
void tp__p2p_req_complete(tp__req *r, tp_status st, const tp_error *err,
                          int source);
// Frees the detached requests that completed. A user thread.
void tp__p2p_reap_dead(tp__p2p *p);
tp__req *tp__p2p_req_new(tp__p2p *p, bool send, int peer, uint64_t gid,
                         int chan, uint64_t tag, void *buf, size_t len,
                         tp__req_cb cb, void *cb_arg);
// p_mtx held.
void tp__p2p_posted_remove(tp__p2p *p, tp__req *r);
// The first posted recv that takes a message with this key (p_mtx held).
tp__req *tp__p2p_posted_find(tp__p2p *p, int src, uint64_t gid, int chan,
                             uint64_t tag);
// Takes @u out of the unexpected queue if it is in it (p_mtx held).
void tp__p2p_ux_unqueue(tp__p2p *p, p2p_ux *u);
void tp__p2p_ux_free(p2p_ux *u);
// Completes @r from the ready unexpected message @u (removed from the
// queue by the caller) and frees @u. No lock held.
void tp__p2p_ux_deliver(tp__p2p *p, tp__req *r, p2p_ux *u);
// The error of a recv whose tensor does not have the message's size.
tp_error *tp__p2p_size_mismatch(const tp__p2p *p, int src, uint64_t tag,
                                uint64_t msg_len, size_t buf_len);

// ---- p2p_send.c
// Records the first failure of @rank, fails its recvs, tells the owner.
// No lock held.
void tp__p2p_peer_write_fail(tp__p2p *p, int rank, const tp_error *err);
void tp__p2p_peer_fail(tp__p2p *p, int rank, const tp_error *err);
// The pipe we write to @rank on (a new reference), connecting the first
// time. No p_mtx held; not on a loop thread.
tp_status tp__p2p_peer_out(tp__p2p *p, int rank, tp_pipe **pipe_p,
                           tp_error **err_p);
// Loop thread: the write of a request (its r_aio) finished.
void tp__p2p_send_cb(void *arg);

// ---- p2p_ctl.c
// Loop thread: rank @src asks which sequence number group @gid reached
// here (query @qid): answers, from the answer pool.
void tp__p2p_on_query(tp__p2p *p, int src, uint64_t gid, uint64_t qid);
// Loop thread: rank @src answered query @qid about group @gid with
// @payload. False, with @why, for a malformed answer (a protocol error).
bool tp__p2p_on_answer(tp__p2p *p, int src, uint64_t gid, uint64_t qid,
                       const void *payload, uint64_t len, char *why,
                       size_t why_len);

#endif
