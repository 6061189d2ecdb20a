/* SPDX-License-Identifier: Apache-2.0 */
/* pg_impl.h (internal) - what the files of the process-group layer share:
 * the group and work structs and the functions one file calls in another.
 *   pg.c        options, accessors, group objects, failure, subgroups,
 *               destroy
 *   pg_init.c   tp_pg_init: the rendezvous through the store (store/join.h)
 *               and the world's set-up; the store exchange
 *   pg_work.c   work handles, running a collective on its engine, the
 *               group's queue and thread
 *   pg_api.c    argument checks, strided tensors staged through
 *               contiguous copies, the common begin and finish of a call
 *   pg_api_ops.c the public collective and point-to-point calls
 *   pg_debug.c  TP_DEBUG_COLLECTIVES (the mismatch check)
 *   pg_engine.c the engines (shm, pipe, nccl) behind tp__coll_engine_ops
 *
 * Order: a group runs one collective at a time. A blocking call runs on
 * the caller's thread when nothing is queued before it; asynchronous calls
 * are queued for the group's thread (started on first use), and a
 * blocking call issued behind them waits for its turn there. Every
 * collective gets the next sequence number of its group when it starts, so
 * the same collective has the same number on every member: the pipe
 * engine's messages are tagged with it.
 *
 * Locks: w_mtx (world's group list) > g_mtx (one group's queue and
 * state) > wk_mtx (one work). The abort callback takes w_mtx then
 * g_mtx. */
#ifndef TP_COLLECTIVES_PG_IMPL_H
#define TP_COLLECTIVES_PG_IMPL_H

#include <tpipe/collectives.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "collectives/nccl.h"
#include "collectives/p2p.h"
#include "collectives/shm.h"
#include "core/config.h"
#include "core/tensor_impl.h"
#include "core/list.h"
#include "core/platform.h"
#include "store/store_int.h"

#define PG_KEY_PREFIX      "tp.pg/"
#define PG_DESC_BYTES      32
#define PG_FINISH_GRACE_MS 5000
// tp_pg_destroy's bound on telling the store it left (tp__store_job_leave).
#define PG_LEAVE_TIMEOUT_MS 2000
// Flight recorder: entries kept per group (TP_PG_FLIGHT_RECORDER).
#define PG_FR_DEFAULT 64
#define PG_FR_MAX     65536

typedef enum pg_fr_state {
    PG_FR_QUEUED,
    PG_FR_RUNNING,
    PG_FR_DONE,
    PG_FR_FAILED,
} pg_fr_state;

// One collective in the group's flight recorder (pg_fr.c).
typedef struct pg_fr_ent {
    uint64_t fr_id; // 1 + its index among the group's collectives
    tp__coll_kind fr_kind;
    uint64_t fr_seq; // its sequence number once running, else UINT64_MAX
    int fr_root;     // -1: not a rooted collective
    size_t fr_bytes; // this rank's contribution (input bytes)
    pg_fr_state fr_state;
    uint64_t fr_issued_ns;
    uint64_t fr_run_ns; // 0 until running
    uint64_t fr_end_ns; // 0 until done or failed
} pg_fr_ent;

struct tp_work {
    tp_pg *wk_pg;
    atomic_int wk_refs;
    bool wk_p2p;
    tp__req *wk_req;
    int wk_peer; // p2p: group rank or TP_ANY_SOURCE
    bool wk_send;
    tp__coll_args wk_args;
    tp_reduce_op wk_op; // as asked (avg)
    size_t *wk_splits;  // all_to_all: 4n entries behind wk_args' pointers
    void *wk_in_copy;   // an input that overlapped the output
    tp_tensor *wk_t1;
    tp_tensor *wk_t2;
    bool wk_cuda;
    bool wk_local; // on the stack of a blocking call: no lock, no free
    uint64_t wk_deadline_ns;
    tp_mtx wk_mtx;
    tp_cv wk_cv;
    bool wk_done;
    tp_status wk_st;
    tp_error *wk_err;
    tp_future *wk_fut;    // tp_work_get_future's (wk_mtx), or NULL
    tp_tensor *wk_result; // its future's value (a reference), or NULL
    bool wk_no_result;    // coalesced: the future's value is NULL
    // Copies into the caller's tensors once the collective succeeded
    // (coalesced calls; strided tensors): b_dst = b_src, same shape;
    // b_dst NULL: a strided input's copy, only held.
    struct pg_back {
        tp_tensor *b_dst;
        tp_tensor *b_src;
    } * wk_back;
    int wk_nback;
    int wk_source;         // group rank
    uint64_t wk_fr_id;     // its flight-recorder entry (0: none)
    tp_list_node wk_qnode; // in its group's g_queue while queued
    // point-to-point works are listed in their world (w_works, under
    // w_mtx) from posting until freed, so that destroying a group can
    // finish them and the p2p layer never outlives their requests
    _Atomic(tp_pg *) wk_world;
    tp_list_node wk_lnode; // in w_works
};

/**
 * tp__coll_engine_ops - an engine that runs a group's collectives
 * (pg_engine.c). Each keeps its state in its own fields of the group.
 * A group has one host engine (shm or pipe, chosen when it is made by
 * tp__pg_engine_choose); CUDA tensors go to NCCL (tp__pg_engine_for).
 */
typedef struct tp__coll_engine_ops {
    const char *name; // "shm", "pipe", "nccl" (tp_pg_engine)
    // Runs CUDA tensors: takes no sequence number, has no
    // TP_DEBUG_COLLECTIVES check, and reduces avg itself.
    bool device;
    // Optional (NULL: nothing to open, or opened on first use). Collective:
    // every member calls it at the same point of the group's creation.
    // TP_OK with @why empty: the group uses the engine; TP_OK with @why
    // set: the engine cannot be used (every member gets the same answer);
    // other statuses: the store failed or @deadline passed.
    tp_status (*open)(tp_pg *g, uint64_t deadline, char *why, size_t why_len,
                      tp_error **err_p);
    // Runs one collective (coll.h) numbered @seq before @deadline. Called
    // by the one thread running the group's collective, no lock held.
    tp_status (*run)(tp_pg *g, const tp__coll_args *a, uint64_t seq,
                     uint64_t deadline, tp_error **err_p);
    // Optional: makes a collective running on another thread end soon
    // (the group is broken first). Never blocks. NULL: the destroy waits
    // for it (bounded by its deadline).
    void (*abort)(tp_pg *g);
    // Optional: frees the engine's state (not collective). Safe on a group
    // the engine never ran on.
    void (*close)(tp_pg *g);
    // Optional: a collective failed on this rank with @e: tell the other
    // members, so that they do not wait for their deadline.
    void (*tell_failed)(tp_pg *g, const tp_error *e);
} tp__coll_engine_ops;

struct tp_pg {
    tp_pg *g_world; // itself for the world group
    char g_name[64];
    char g_what[128]; // "process group world (rank 1 of 4)"
    int g_rank;
    int g_size;
    int *g_wranks; // group rank -> world rank
    int *g_granks; // world rank -> group rank or -1 (world-size entries)
    uint64_t g_gid;
    char g_prefix[160]; // store keys of this group
    int64_t g_timeout_ms;
    tp_config g_cfg;
    // the group's host engine (shm or pipe), chosen when it is made
    const struct tp__coll_engine_ops *g_eng;
    tp__shm *g_shm; // the shm engine's
    tp__nccl_comm *g_nccl;
    void *g_scratch; // the pipe engine's, kept between collectives
    size_t g_scratch_len;
    int g_nccl_device;
    // queue and state
    tp_mtx g_mtx;
    tp_cv g_cv;
    tp_list g_queue; // async collectives (tp_work), in issue order
    bool g_busy;
    bool g_stop;
    bool g_thread_started;
    pthread_t g_thread;
    uint64_t g_seq; // taken by the thread running the collective
    // g_seq, for the p2p layer's loop thread (a query of another member):
    // stored when a number is taken (tp__pg_seq_take)
    _Atomic uint64_t g_seq_taken;
    tp_error *g_broken;
    atomic_bool g_is_broken; // g_broken != NULL, read without the lock
    // The owner's reference (dropped by tp_pg_destroy), one per work of
    // the group and, for the world, one per subgroup: the memory goes
    // with the last, so a thread still inside tp_work_wait, or a handle
    // freed late, never touches freed memory.
    atomic_int g_refs;
    tp_pg *g_next; // in the world's list
    // flight recorder: the last g_fr_cap collectives, a ring indexed by
    // fr_id - 1 (g_fr_mtx, a leaf lock)
    tp_mtx g_fr_mtx;
    pg_fr_ent *g_fr;
    int g_fr_cap;
    uint64_t g_fr_last; // fr_id of the newest entry
    // world only
    tp_store *w_store;
    tp__p2p *w_p2p;
    tp_mtx w_mtx;
    // The p2p layer is closed (w_closed) only once no thread is using it
    // outside a work's request (a probe or a cancel of tp_work_wait):
    // w_p2p_users counts those, w_cv tells the destroy when they left.
    tp_cv w_cv;
    bool w_closed;
    int w_p2p_users;
    tp_pg *w_groups; // every live group, the world first
    int w_nsub;
    int w_ngroups_made;
    char w_prefix[64];
    int64_t w_gen;     // the store generation joined (-1 before)
    bool w_gen_hosted; // its store lives in rank 0's process
    struct pg_set {
        uint64_t hash;
        int count;
    } * w_sets;
    int w_nsets;
    tp_list w_works; // point-to-point works (see tp_work)
    // aborts for groups not (yet) listed here: a member may give up
    // while this rank is still inside tp_pg_new_group
    struct pg_abort {
        uint64_t gid;
        int from;
        char reason[256];
    } w_aborts[16];
    int w_naborts;
};

// ---- pg.c
// Copies the caller's options @o (NULL: the defaults) into *@out, checking
// its size: fields past it take their defaults; an unknown size is
// TP_EINVAL (a caller built against another tpipe version).
tp_status tp__pg_options_load(const tp_pg_options *o, tp_pg_options *out,
                              tp_error **err_p);
void tp__pg_ref(tp_pg *g);
// Drops a reference; the last frees the group (and drops its world's).
void tp__pg_unref(tp_pg *g);
// Whether the world's p2p layer may be used outside a request: then it
// stays open until the matching tp__pg_p2p_leave. Takes w_mtx.
bool tp__pg_p2p_enter(tp_pg *w);
void tp__pg_p2p_leave(tp_pg *w);
// Breaks @g with @err (the first error wins). Takes g_mtx.
void tp__pg_break(tp_pg *g, const tp_error *err);
// The group's first error (a new reference in *@err_p), or TP_OK. @arg is
// the group (the pipe engine's check callback).
tp_status tp__pg_check(void *arg, tp_error **err_p);
// p2p callbacks of the world (@arg): world rank @from aborted group @gid;
// asks which sequence number group @gid reached here.
void tp__pg_on_abort(void *arg, uint64_t gid, int from, const char *reason);
bool tp__pg_on_query(void *arg, uint64_t gid, int from, uint64_t *next_p);
// A group of @size members in a world of @world_size, one reference
// (NULL on ENOMEM); freed by tp__pg_group_free (never handed out) or the
// last tp__pg_unref.
tp_pg *tp__pg_group_alloc(int size, int world_size);
void tp__pg_group_free(tp_pg *g);
// Sets g_what from the group's name, rank and size.
void tp__pg_group_set_what(tp_pg *g);
// Loads the config of @g and its collective timeout from @o.
tp_status tp__pg_load_config(tp_pg *g, const tp_pg_options *o,
                             tp_error **err_p);

// ---- pg_init.c
struct tp__store_member;
// Publishes @val and reads every rank's value under <prefix><stem><rank>
// into vals[i] (see pg_init.c); free them with tp__pg_free_vals.
tp_status tp__pg_store_exchange(tp_pg *w, struct tp__store_member *join,
                                const char *prefix, const char *stem, int n,
                                int me, const int *wr, const char *val,
                                char **vals, uint64_t deadline,
                                const char *what, tp_error **err_p);
void tp__pg_free_vals(char **vals, int n);

// ---- pg_api.c
// Argument checks of a call @op of @g (TP_EINVAL with the argument named).
tp_status tp__pg_check_tensor(tp_pg *g, const char *op, const char *arg,
                              const tp_tensor *t, tp_error **err_p);
tp_status tp__pg_check_root(tp_pg *g, const char *op, int root,
                            tp_error **err_p);
// @big must hold group size x the elements of @small (see pg_api.c).
tp_status tp__pg_check_blocks(tp_pg *g, const char *op, const tp_tensor *big,
                              const char *big_name, const tp_tensor *small,
                              const char *small_name, tp_error **err_p);
tp_status tp__pg_check_op(tp_pg *g, const char *opname, tp_reduce_op op,
                          tp_dtype dt, tp_error **err_p);
bool tp__pg_is_cuda(const tp_tensor *t);
size_t tp__pg_numel(const tp_tensor *t);
// Common start of every collective: a work holding the tensors (@local:
// a blocking call's work on the caller's stack).
tp_status tp__pg_coll_begin(tp_pg *g, tp__coll_kind kind, tp_work *local,
                            tp_work **wk_p, tp_error **err_p);
void tp__pg_work_hold(tp_work *wk, tp_tensor *t1, tp_tensor *t2);
// Strided tensors: replaces *@t_p by a contiguous copy held by @wk (for an
// output, copied back once the collective succeeded); stage2 stages an
// output and an input.
tp_status tp__pg_stage(tp_work *wk, tp_tensor **t_p, bool out,
                       tp_error **err_p);
tp_status tp__pg_stage2(tp_work *wk, tp_tensor **out_p, tp_tensor **in_p,
                        tp_error **err_p);
// Common end: untangles an input overlapping the output, then submits @wk
// (or drops it if @st failed).
tp_status tp__pg_coll_finish(tp_pg *g, tp_work *wk, tp_work **w_p, tp_status st,
                             tp_error **err_p);

// ---- pg_work.c
// Takes the next sequence number of @g (by the thread running its
// collective).
uint64_t tp__pg_seq_take(tp_pg *g);
// A heap work of @g with one reference (the caller's).
tp_work *tp__pg_work_new(tp_pg *g);
void tp__pg_work_unref(tp_work *wk);
// Completes @wk (the first completion wins) and wakes its waiters.
void tp__pg_work_complete(tp_work *wk, tp_status st, const tp_error *err,
                          int source);
// p2p request callback of a point-to-point work.
void tp__pg_p2p_work_cb(tp__req *r, void *arg);
// Runs @wk now on this thread (blocking call, nothing queued) or queues
// it. Takes the caller's reference of @wk.
tp_status tp__pg_coll_submit(tp_pg *g, tp_work *wk, tp_work **w_p,
                             tp_error **err_p);
// Finishes the point-to-point works of @pg (see pg_work.c).
void tp__pg_finish_p2p_works(tp_pg *pg);

// ---- pg_engine.c
// The engine a group has before tp__pg_engine_choose (pipe).
extern const tp__coll_engine_ops *const tp__pg_default_engine;
// Chooses and opens the host engine of @g (TP_COLL_ENGINE): every member
// calls this at the same point of its creation.
tp_status tp__pg_engine_choose(tp_pg *g, uint64_t deadline, tp_error **err_p);
// The engine that runs a collective of @g: NCCL for CUDA tensors, else the
// group's host engine.
const tp__coll_engine_ops *tp__pg_engine_for(const tp_pg *g, bool cuda);
// Runs one collective on the group's host engine (no debug check).
tp_status tp__pg_engine_run(tp_pg *g, const tp__coll_args *a, uint64_t seq,
                            uint64_t deadline, tp_error **err_p);
// Aborts what runs on @g's engines (destroy); closes them (free).
void tp__pg_engine_abort(tp_pg *g);
void tp__pg_engine_close(tp_pg *g);

// ---- pg_fr.c (flight recorder)
void tp__pg_fr_init(tp_pg *g);
void tp__pg_fr_fini(tp_pg *g);
// A collective was issued (queued or about to run): records it.
void tp__pg_fr_issue(tp_pg *g, tp_work *wk);
void tp__pg_fr_run(tp_pg *g, const tp_work *wk, uint64_t seq);
void tp__pg_fr_end(tp_pg *g, const tp_work *wk, tp_status st);
// The entries (all, or those queued or running), one line each; malloc'd,
// NULL on ENOMEM.
char *tp__pg_fr_dump(tp_pg *g, bool in_flight_only);

// ---- pg_debug.c
// TP_DEBUG_COLLECTIVES: compares this collective across the members.
tp_status tp__pg_debug_check(tp_pg *g, const tp__coll_args *a, tp_reduce_op op,
                             uint64_t deadline, tp_error **err_p);
// The pipe engine's collective @what (@kind #@seq, issued at @start_ns) timed
// out with *@err_p: asks the other members which sequence number they
// reached (waiting at most TP__P2P_QUERY_MS, or a quarter of the
// timeout) and, if some never called it or did not answer, replaces
// *@err_p with an error naming them.
void tp__pg_blame_timeout(tp_pg *g, const char *kind, uint64_t seq,
                          uint64_t start_ns, const char *what,
                          tp_error **err_p);

#endif
