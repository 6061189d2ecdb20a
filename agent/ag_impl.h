/* SPDX-License-Identifier: Apache-2.0 */
/* ag_impl.h (internal) - the agent's state, shared by its files:
 *
 *   init.c        options, tp_rpc_init, worker infos, listening, teardown,
 *                 tp_rpc_shutdown
 *   options.c     the agent's own tunables: caps, faulty mode
 *   faulty.c      the faulty mode of tests: failed and delayed sends
 *   rendezvous.c  the store: worker records at init, shutdown rounds, exit
 *   conn.c        connections: the read state machine, the dispatch of
 *                 messages by kind, failure, accept, connect
 *   slot.c        write slots: building, sending and completing writes
 *   calls.c       pending calls, the timer thread
 *   calls_send.c  making a call: requests, protocol kinds, notifications
 *   calls_api.c   tp_rpc_async/sync/wait, workers by name
 *   serve.c       requests: handlers on the pool, replies
 *   stats.c       per-peer counters, latency histogram, debug info
 *   flight.c      the flight recorder: the last messages sent, their state
 *   proto.c       the kinds table, the protocols above the agent
 *                 (proto.h): their hooks, extension sections
 *
 * Locks: a_mtx protects the agent's tables (peers' connections, pending
 * calls, timer lists, write slots, counters). It is never held across a
 * call into the pipe layer, the store, a future, a protocol hook or user
 * code. Functions named *_locked are called with it held. */
#ifndef TP_AG_IMPL_H
#define TP_AG_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tpipe/pipe.h>
#include <tpipe/rpc.h>
#include <tpipe/store.h>

#include "agent_int.h"
#include "core/error.h"
#include "core/platform.h"
#include "core/pool.h"
#include "proto.h"
#include "wire.h"

#define AG_MAX_URLS    4
#define AG_MAX_URL     256
#define AG_KEY_PREFIX  "tp.rpc/"
#define AG_LAT_BUCKETS (64 * 4)
#define AG_META_INLINE 192
#define AG_TEARDOWN_MS 5000 /* waiting for handlers at shutdown */
/* Teardown waits for the pipes it closed until the shutdown deadline, and
 * at least this long after it began (an agreement that timed out used the
 * deadline up; closing pipes takes milliseconds). */
#define AG_TEARDOWN_MIN_MS 1000
#define AG_SYNC_GRACE_MS   5000 /* tp_rpc_sync beyond the call's deadline */
#define AG_SD_PROBE_MS     1000 /* shutdown: a dead worker's liveness probe */

#define AG_NKINDS           256 /* message kinds are a u8 */
#define AG_FAULTY_MAX_RULES 8

typedef struct ag_conn ag_conn;
typedef struct ag_call ag_call;

// ---- the faulty mode (faulty.c) ------------------------------------------

typedef struct ag_fault_rule {
    bool r_kinds[AG_NKINDS]; // the message kinds it applies to
    bool r_fail;             // fail the sends, else delay them
    uint64_t r_n;            // fail: sends left to fail; delay: ms
    uint64_t r_total;        // fail: sends to fail in all
    char r_text[64];         // the rule as written, for messages
} ag_fault_rule;

typedef struct ag_faulty {
    int f_nrules; // 0: off
    ag_fault_rule f_rules[AG_FAULTY_MAX_RULES];
    char f_spec[256];
} ag_faulty;

// ---- the flight recorder (flight.c) -------------------------------------

// One message sent. Written under a_mtx where the lock is held anyway
// (a call made, a slot taken, a write or a call ended).
typedef struct ag_fr_rec {
    uint64_t r_seq; // 0: empty
    uint64_t r_call_id;
    uint64_t r_bytes;
    uint64_t r_start_ns;
    uint64_t r_end_ns; // 0 while in flight
    int32_t r_peer;    // rank, -1 if unknown
    uint8_t r_kind;
    uint8_t r_state; // tp_rpc_op_state
    bool r_call;     // a call: written, it waits for its reply
    char r_name[64]; // the function (cut), "" if none
} ag_fr_rec;

typedef struct ag_fr {
    ag_fr_rec *f_recs; // f_cap records, a ring; NULL: off
    uint32_t f_cap;
    uint64_t f_next; // the last seq given (records f_next - f_cap + 1..)
} ag_fr;

// ---- per-peer state ----------------------------------------------------

typedef struct ag_stats {
    uint64_t s_calls_sent;
    uint64_t s_calls_received;
    uint64_t s_bytes_sent;
    uint64_t s_bytes_received;
    uint64_t s_errors;
    uint64_t s_timeouts;
    uint64_t s_pending;
    uint64_t s_lat_n;
    uint64_t s_lat_min_ns;
    uint64_t s_lat_max_ns;
    double s_lat_sum_ns;
    uint32_t s_lat_hist[AG_LAT_BUCKETS]; // log2 buckets, 4 sub-buckets
} ag_stats;

typedef struct ag_peer {
    tp_worker_info p_info;
    char p_urls[AG_MAX_URLS][AG_MAX_URL];
    int p_nurls;
    ag_conn *p_out;    // outgoing connection, NULL until a call needs it
    ag_call *p_calls;  // pending calls to this peer (c_pnext list)
    bool p_sd_missing; // did not arrive in the last shutdown round
    // Its pipe failed while this agent ran or agreed on shutdown: it died
    // (or shut down abruptly), so it will not join the agreement.
    bool p_dead;
    char p_dead_why[200];
    // When the shutdown last connected to it to see whether it lives
    // (rendezvous.c, shutdown_probe); 0: never.
    uint64_t p_sd_probe_ns;
    // Bytes of messages received from it, allocated and not yet handed
    // over (max_peer_inflight_bytes).
    uint64_t p_inflight;
    ag_stats p_stats;
} ag_peer;

// ---- connections and write slots ---------------------------------------

// One pipe write in flight: the message, its metadata buffer and what
// keeps its buffers alive.
typedef struct ag_wslot {
    struct ag_wslot *w_next; // free list of the connection
    ag_conn *w_conn;
    tp_aio *w_aio;
    tp_message w_msg;
    tp_msg_buf w_payload;
    tp_msg_buf *w_tbufs;
    uint32_t w_tcap;
    uint8_t *w_meta;
    size_t w_meta_cap;
    tp_args *w_args; // referenced until the write completes
    ag_kind w_kind;  // what the message is
    uint64_t w_call_id;
    uint64_t w_fr_seq;          // its flight recorder record, 0 if none
    bool w_any_tok;             // protocols want po_sent for this write
    void *w_tok[TP__PROTO_MAX]; // their tokens, by protocol index
    // Faulty mode: queued on a_delayed until w_due_ns, then written, or
    // failed with w_inject (taken) as the pipe would fail it.
    struct ag_wslot *w_dnext;
    uint64_t w_due_ns;
    tp_error *w_inject;
    uint8_t w_meta_inline[AG_META_INLINE];
} ag_wslot;

struct ag_conn {
    ag_conn *c_next; // the agent's list of every connection
    // Operations in flight on it (reads, writes) and requests whose reply
    // goes on it; a failed connection is freed when this is 0.
    _Atomic long c_ops;
    // ... of which requests whose reply goes on it (a handler, maybe an
    // async one that resolves late, holds them): teardown waits for the
    // others, the pipe's own reads and writes.
    _Atomic long c_reqs;
    tp_agent *c_agent;
    tp_pipe *c_pipe;
    bool c_outgoing;
    bool c_failed;
    bool c_heard;    // a message from its peer arrived on it (loop thread)
    ag_peer *c_peer; // outgoing: the callee; incoming: set by requests
    char c_url[AG_MAX_URL];
    tp_aio *c_daio;     // reads descriptors
    tp_aio *c_raio;     // reads the rest of a message
    tp_message *c_rmsg; // the message being read
    tp_args *c_rargs;   // its args, tensors allocated at the descriptor
    ag_hdr c_rhdr;      // its header, decoded at the descriptor
    // Its bytes, counted in c_rpeer's p_inflight from the descriptor
    // until handed over (a request's ag_req takes them).
    uint64_t c_rcharge;
    ag_peer *c_rpeer;
    ag_tensor_meta *c_metas;
    uint32_t c_metas_cap;
    ag_wslot *c_slots;     // free write slots
    ag_wslot **c_allslots; // every slot, for freeing
    size_t c_nslots, c_slots_cap;
};

// ---- calls -------------------------------------------------------------

typedef struct ag_tclass ag_tclass;

struct ag_call {
    ag_call *c_hnext;           // pending table chain
    ag_call *c_tprev, *c_tnext; // the timeout class list
    ag_call *c_pprev, *c_pnext; // the peer's pending list
    ag_tclass *c_tclass;        // NULL: no deadline
    uint64_t c_id;
    tp_future *c_fut;
    ag_peer *c_peer;
    ag_conn *c_conn; // NULL for calls to self
    int64_t c_timeout_ms;
    uint64_t c_start_ns;
    uint64_t c_deadline_ns;
    uint64_t c_fr_seq; // its flight recorder record, 0 if none
    char c_fn_name[TP_RPC_MAX_FN_NAME + 1];
};

// The calls with one timeout value, in deadline order (the deadline of a
// call is its start + the class's timeout, and starts are taken under
// a_mtx, so appending keeps the order).
struct ag_tclass {
    ag_tclass *t_next;
    int64_t t_ms;
    ag_call *t_head, *t_tail;
};

// A request being handled.
typedef struct ag_req {
    tp_task r_task;
    tp_agent *r_agent; // referenced
    ag_conn *r_conn;   // NULL: a call to self (r_call_id is local)
    ag_peer *r_caller;
    const ag_fn *r_fn; // NULL: not registered here
    ag_kind r_kind;    // REQUEST or a protocol's kind
    uint64_t r_call_id;
    uint64_t r_fn_id;
    tp_args *r_args;
    const uint8_t *r_hdr; // protocol kinds: section 0 (in r_args' message)
    size_t r_hdr_len;
    void *r_proto_ctx; // from pk_on_loop to pk_run
    uint64_t r_charge; // bytes counted in r_caller's p_inflight
    tp_rpc_call_info r_info;
    char r_fn_name[TP_RPC_MAX_FN_NAME + 1];
    size_t r_fn_name_len;
} ag_req;

typedef enum ag_state {
    AG_RUNNING = 0,
    AG_SHUTTING_DOWN, // graceful shutdown in progress: calls still work
    AG_CLOSED,        // calls fail with TP_ECLOSED
} ag_state;

typedef struct ag_devmaps ag_devmaps; // devmap.c

struct tp_agent {
    _Atomic long a_refs;
    tp_mtx a_mtx;
    ag_state a_state;
    tp_agent_options a_opts;
    char a_init_method[1024];
    char a_transports[128];
    char a_channels[128];
    int a_rank;
    int a_world;
    ag_peer *a_peers; // by rank
    ag_peer *a_self;
    tp_store *a_store;
    char a_prefix[48]; // "tp.rpc/<generation>/": this job's store keys
    int64_t a_gen;     // the store generation joined (-1 before)
    tp_context *a_ctx;
    tp_pipe_listener *a_listener;
    tp_aio *a_accept_aio;
    char a_listen_url[AG_MAX_URL];
    tp_pool *a_pool;
    bool a_pool_leaked;
    ag_conn *a_conns;
    // Threads inside a pipe call (shutdown waits): entered with an atomic
    // add, left with tp__ag_writers_exit (under a_mtx, for a_quiet_cv).
    _Atomic long a_writers;
    // Broadcast once the agent is closed, when a_writers or a connection's
    // c_ops drops to 0 (both decremented under a_mtx): teardown waits on
    // it for the pipes it closed.
    tp_cv a_quiet_cv;
    // pending calls
    _Atomic uint64_t a_next_id;
    ag_call **a_table;
    size_t a_table_size; // power of two
    size_t a_npending;
    uint64_t a_activity;   // calls made + requests received, for shutdown
    uint64_t a_notes_sent; // notifications written (or being written)
    uint64_t a_notes_recv; // notifications received
    tp_cv a_idle_cv;       // broadcast when a_npending drops to 0
    // timer
    ag_tclass *a_tclasses;
    pthread_t a_timer;
    bool a_timer_started;
    bool a_timer_stop;
    tp_cv a_timer_cv;
    uint64_t a_timer_until; // what the timer thread sleeps until
    uint64_t a_spin_ns;     // tp_rpc_wait's spin before sleeping
    ag_faulty a_faulty;     // set at init, rules' counts under a_mtx
    ag_devmaps *a_devmaps;  // device_maps, set at init (NULL: none)
    ag_wslot *a_delayed;    // faulty sends the timer thread owes
    ag_fr a_fr;             // the flight recorder (under a_mtx)

    // The protocols' states, by index in tp__agent_protos: set at init,
    // cleared by detach (read without the lock in between).
    void *_Atomic a_proto[TP__PROTO_MAX];
};

// ---- shared helpers ----------------------------------------------------

static inline const char *
ag_name(const tp_agent *a)
{
    return a->a_self->p_info.name;
}

static inline bool
ag_worker_name_valid(const char *name, size_t len)
{
    return tp__ag_name_valid(name, len, TP_RPC_MAX_NAME, "_-:");
}

// init.c
void tp__ag_agent_unref(tp_agent *a);
ag_peer *tp__ag_peer_by_name(tp_agent *a, const char *name);

// options.c: the agent's own tunables (table, environment).
void tp__ag_options_defaults(tp_agent_options *o);
tp_status tp__ag_options_check(tp_agent_options *ao, tp_error **err_p);

// devmap.c: PyTorch's device maps (tp_agent_options.device_maps).
// Parses and checks @maps and @devices against this host's devices;
// *@d_p NULL when both are empty. Errors: TP_EINVAL with what is wrong.
tp_status tp__ag_devmaps_parse(const char *maps, const char *devices,
                               ag_devmaps **d_p, tp_error **err_p);
void tp__ag_devmaps_free(ag_devmaps *d);
// After the rendezvous: publishes this worker's CUDA device count in the
// store, then checks that the mapped workers are in the job and have the
// devices.
tp_status tp__ag_devmaps_check_peers(tp_agent *a, uint64_t deadline,
                                     tp_error **err_p);
// Where tensor @i of a message to rank @to, on @src here, arrives: @src
// for the CPU; for a reply (@req: the request), the device the request's
// tensor on @src came from; else the device map to @to. TP_EINVAL naming
// the worker and what to do when no map covers it.
tp_status tp__ag_devmaps_target(const tp_agent *a, int to, const tp_args *req,
                                size_t i, tp_device src, tp_device *dst_p,
                                tp_error **err_p);

// rendezvous.c
tp_status tp__ag_rendezvous(tp_agent *a, uint64_t deadline, tp_error **err_p);
tp_status tp__ag_shutdown_round(tp_agent *a, int round, uint64_t deadline,
                                uint64_t *pending_p, uint64_t *activity_p,
                                tp_error **err_p);
void tp__ag_rendezvous_exit(tp_agent *a, uint64_t deadline);

// conn.c
void tp__ag_conn_free(ag_conn *c);
void tp__ag_conn_describe(const ag_conn *c, char *buf, size_t len);
void tp__ag_conn_fail(ag_conn *c, const tp_error *err);
void tp__ag_conn_protocol_error(ag_conn *c, tp_error *err);
/* Gives back @n bytes of @p's p_inflight (no lock held). */
void tp__ag_peer_release(tp_agent *a, ag_peer *p, uint64_t n);
/* An operation on @c ended (no lock held; takes a_mtx). */
void tp__ag_conn_op_done(ag_conn *c);
/* A thread counted in a_writers leaves its pipe call (no lock held). */
void tp__ag_writers_exit(tp_agent *a);
ag_conn *tp__ag_conn_get_locked(tp_agent *a, ag_peer *p, tp_error **err_p);
void tp__ag_accept_cb(void *arg);

// slot.c
ag_wslot *tp__ag_slot_get_locked(ag_conn *c);
void tp__ag_slot_put_locked(ag_wslot *w);
void tp__ag_slot_free(ag_wslot *w);
/* Timer thread: a slot queued by the faulty mode is due: written, or
 * failed with its w_inject. */
void tp__ag_slot_run_delayed(ag_wslot *w);

// faulty.c
tp_status tp__ag_faulty_parse(const char *spec, ag_faulty *f, tp_error **err_p);
/* Called by a slot's sender instead of writing it: true if a rule took
 * the slot (queued on a_delayed for the timer thread). No lock held. */
bool tp__ag_faulty_intercept(tp_agent *a, ag_wslot *w);
/* Builds and writes the message of @w: @h (its ext is filled here from a
 * protocol header @hdr when @has_hdr, and the protocols' sections for
 * @args), payload @args's bytes or @errmsg, @args's tensors. Takes @args.
 * On failure nothing was written: the caller puts @w back. */
tp_status tp__ag_slot_send(ag_wslot *w, ag_hdr *h, bool has_hdr,
                           const void *hdr, size_t hdr_len, tp_args *args,
                           const tp_args *req, const char *errmsg,
                           tp_error **err_p);

// calls.c
void tp__ag_pending_unlink_locked(tp_agent *a, ag_call *c, tp_status st);
ag_call *tp__ag_pending_take_locked(tp_agent *a, uint64_t id,
                                    const ag_conn *conn, tp_status st);
void tp__ag_call_finish(ag_call *c, tp_args *result, tp_error *err);
void *tp__ag_timer_main(void *arg);
/* Puts @c in the pending table, its peer's list and its timeout class. */
void tp__ag_pending_insert_locked(tp_agent *a, ag_call *c);

// calls_send.c
/* The call's timeout: @timeout_ms, or the agent's default if negative. */
int64_t tp__ag_call_timeout(const tp_agent *a, int64_t timeout_ms);
/* A future failed with @err (taken); NULL if none could be made. */
tp_future *tp__ag_future_failed(tp_error *err);
tp_future *tp__ag_call_fn(tp_agent *a, ag_peer *p, const char *fn_name,
                          const tp_args *in, int64_t timeout_ms);

// serve.c
void tp__ag_serve_request(ag_conn *c, const ag_hdr *h, tp_args *args);
void tp__ag_serve_reply(ag_conn *c, const ag_hdr *h, tp_args *args);
void tp__ag_req_run(void *arg);
void tp__ag_req_reply(ag_req *r, tp_args *result, const tp_error *err);
void tp__ag_write_failed_locally(ag_conn *c, ag_kind kind, uint64_t call_id,
                                 const tp_error *err);

// stats.c
void tp__ag_lat_record_locked(ag_stats *s, uint64_t ns);

// flight.c
tp_status tp__ag_fr_init(tp_agent *a, tp_error **err_p);
void tp__ag_fr_fini(tp_agent *a);
/* Records a message of @kind to rank @peer sent now (@now_ns, 0: read the
 * clock if the recorder is on): its seq,
 * for the updates below (0 when the recorder is off). @call: a call (it
 * waits for a reply once written); @name may be NULL. */
uint64_t tp__ag_fr_begin_locked(tp_agent *a, ag_kind kind, int peer,
                                uint64_t call_id, const char *name,
                                uint64_t bytes, bool call, uint64_t now_ns);
/* Its write completed (@ok) or failed. */
void tp__ag_fr_written_locked(tp_agent *a, uint64_t seq, bool ok);
/* The call (or a message not written) ended with @st: TP_OK done,
 * TP_ETIMEDOUT timed out, else failed. */
void tp__ag_fr_end_locked(tp_agent *a, uint64_t seq, tp_status st);
/* Timer thread, no lock held: logs, for each peer of the calls of
 * @expired (linked by c_hnext, taken out of the table), one line naming
 * them and the messages still in flight to that peer. */
void tp__ag_fr_log_timeouts(tp_agent *a, const ag_call *expired);
/* The recorder's lines for the debug info (no lock held); the length
 * written, as tp__ag_proto_debug. */
size_t tp__ag_fr_debug(tp_agent *a, char *buf, size_t len);
/* Upper bound of tp__ag_fr_debug's text. */
size_t tp__ag_fr_debug_size(const tp_agent *a);

// proto.c: message kinds (one table per process: the agent's own kinds and
// those of the protocols of this build) and the protocols' hooks.
typedef struct ag_kind_desc {
    const char *k_name;
    bool k_request; // arrives on incoming pipes, answered by a reply
    void (*k_dispatch)(ag_conn *c, const ag_hdr *h, tp_args *args);
    const tp__proto_kind *k_proto; // a protocol's kind: its handlers
    size_t k_proto_idx;            // ... and the protocol's index
    bool k_note;                   // a notification: no reply
} ag_kind_desc;

/* The kind @kind, NULL if nothing here handles it. */
const ag_kind_desc *tp__ag_kind_get(unsigned kind);
void *tp__ag_proto_state_at(const tp_agent *a, size_t idx);
tp_status tp__ag_protos_attach(tp_agent *a, tp_error **err_p);
void tp__ag_protos_detach(tp_agent *a);
/* Appends section @id (@n bytes at @p) to @x. */
tp_status tp__ag_ext_section(tp__ext *x, unsigned id, const void *p, size_t n);
/* Every protocol's po_send for a message to @to carrying @args (NULL: no
 * args, nothing to do); tokens in @toks, *@any_p if one was given. On
 * failure the tokens taken are given back. */
tp_status tp__ag_proto_send(tp_agent *a, int to, uint8_t kind,
                            const tp_args *args, const tp_args *req,
                            tp__ext *ext, void **toks, bool *any_p,
                            tp_error **err_p);
void tp__ag_proto_sent(tp_agent *a, void **toks, const tp_error *err);
tp_status tp__ag_proto_recv(tp_agent *a, int from, const ag_hdr *h,
                            tp_args *args, tp_error **err_p);
void tp__ag_proto_peer_failed(tp_agent *a, int rank, const tp_error *err);
void tp__ag_proto_shutdown_begin(tp_agent *a);
uint64_t tp__ag_proto_pending(tp_agent *a);
void tp__ag_proto_shutdown_end(tp_agent *a, bool agreed);
size_t tp__ag_proto_debug(tp_agent *a, char *buf, size_t len);

#endif
