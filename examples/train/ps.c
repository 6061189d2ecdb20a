// SPDX-License-Identifier: Apache-2.0
// ps.c - --mode ps: a parameter server, as PyTorch's RPC tutorial (and
// ../shared/peers/torch_train_bench.py --mode ps). Under `tpipe run -n
// W+1`, rank 0 ("ps") holds the MLP as a remote object; ranks 1..W
// ("trainer<r>") train on disjoint shards of the data. Each step of a
// trainer:
//
//   tp_dist_autograd_context_create            (with ...context() as cid)
//   logits = tp_remote_call(model, "forward", batch)     (rpc_sync)
//   loss = tp_cross_entropy(logits, labels)    (here, on the trainer)
//   tp_dist_autograd_backward(cid, loss)       (the server's part runs there)
//   tp_dist_optim_step(cid)                    (DistributedOptimizer.step)
//   tp_dist_autograd_context_release
//
// "forward" runs on the server with the trainer's context current, so its
// ops record a local graph and the logits, which require grad, record a
// send function there and a recv function here: backward crosses back to
// the server through them. The gradients land in the context's map on
// the server, where the DistributedOptimizer's SGD there applies them.
//
// Like the peer, a trainer holds the server's lock from its forward to
// its step: a step of another trainer in between would change, in place,
// weights that this trainer's pending backward saved. The peer takes the
// lock with an RPC of its own before the forward; here the forward takes
// it ("forward" with the byte 'L': it waits on the server until the lock
// is free, so the batch travels while the other trainer still steps), and
// "release" gives it back after the step; the release is not waited for
// until the trainer's next step, so it costs a message but no round trip.
// The trainers' steps thus run one at a time on the server, as the peer's.
//
// Methods of the remote type "tp_train.mlp" (registered on every rank):
//   forward     tensor x [B, D] -> tensor logits [B, C] (the caller must
//               hold the lock, or send the byte 'L' to wait for it and
//               take it first)
//   release     gives the lock back
//   parameters  -> one RRef per parameter (tp_rref_create of args holding
//               the parameter tensor), for tp_dist_optim_create
//   done        a trainer's totals (samples, seconds, loss, accuracy)
// Functions (plain RPCs):
//   tp_train.ps_model    -> the model's RRef (waits until it exists)
//   tp_train.ps_barrier  returns when every trainer has called it
// The server then evaluates the test set with its parameters and prints
// the job's result line.

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train.h"

#define PS_TYPE    "tp_train.mlp"
#define PS_GET     "tp_train.ps_model"
#define PS_BARRIER "tp_train.ps_barrier"
#define PS_NAME    "ps"

// The object's constructor arguments: int64 values (the job runs one
// binary on one host): nlayers, seed, trainers, timeout_ms, dims[0..n].
enum { CFG_NLAYERS, CFG_SEED, CFG_TRAINERS, CFG_TIMEOUT, CFG_DIMS };

typedef struct ps_model {
    tr_model model;
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    int holder;   // rank holding the step lock, -1 if none
    int trainers; // expected at the barrier and done
    int arrived;
    int done;
    tr_stats total; // summed; seconds: the slowest trainer's
    int64_t timeout_ms;
    int nrefs;
    tp_rref *refs[2 * TR_MAX_LAYERS]; // made by the first "parameters"
} ps_model;

// The server's handle on its object, for the functions.
typedef struct ps_slot {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    tp_rref *model;  // NULL until created
    ps_model *state; // its object
} ps_slot;

static ps_slot ps_the_slot = {PTHREAD_MUTEX_INITIALIZER,
                              PTHREAD_COND_INITIALIZER, NULL, NULL};

static tp_status ps_err(tp_error **err_p, tp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tp_status
ps_err(tp_error **err_p, tp_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    *err_p = tp_error_create(st, NULL, "%s", msg);
    return st;
}

static struct timespec
ps_deadline(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

// Waits on @cv until *@flag_fn says so, at most @ms; false on timeout.
static bool
ps_wait(pthread_cond_t *cv, pthread_mutex_t *mtx, int64_t ms,
        bool (*ready)(void *), void *arg)
{
    struct timespec dl = ps_deadline(ms);
    while (!ready(arg)) {
        if (pthread_cond_timedwait(cv, mtx, &dl) == ETIMEDOUT && !ready(arg)) {
            return false;
        }
    }
    return true;
}

// ---- the remote type
// ---------------------------------------------------------

static tp_status
ps_create(const tp_rpc_call_info *call, const tp_args *in, void *arg,
          void **state_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    size_t len = 0;
    const int64_t *cfg = tp_args_bytes(in, &len);
    int64_t v[CFG_DIMS + TR_MAX_LAYERS + 1];
    if (len < CFG_DIMS * sizeof(int64_t) || len > sizeof(v)) {
        return ps_err(err_p, TP_EINVAL, "%s: bad configuration (%d bytes)",
                      PS_TYPE, (int)len);
    }
    memcpy(v, cfg, len);
    int nl = (int)v[CFG_NLAYERS];
    if (nl < 1 || nl > TR_MAX_LAYERS ||
        len != (CFG_DIMS + (size_t)nl + 1) * sizeof(int64_t)) {
        return ps_err(err_p, TP_EINVAL, "%s: bad configuration (%d layers)",
                      PS_TYPE, nl);
    }
    ps_model *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return ps_err(err_p, TP_ENOMEM, "%s: no memory", PS_TYPE);
    }
    tp_status st = tr_model_init(&s->model, nl, v + CFG_DIMS,
                                 (uint64_t)v[CFG_SEED], err_p);
    if (st != TP_OK) {
        free(s);
        return st;
    }
    pthread_mutex_init(&s->mtx, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->holder = -1;
    s->trainers = (int)v[CFG_TRAINERS];
    s->timeout_ms = v[CFG_TIMEOUT];
    *state_p = s;
    return TP_OK;
}

static void
ps_destroy(void *state, void *arg)
{
    (void)arg;
    ps_model *s = state;
    for (int i = 0; i < s->nrefs; i++) {
        tp_rref_unref(s->refs[i]);
    }
    tr_model_fini(&s->model);
    pthread_mutex_destroy(&s->mtx);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static bool
lock_free(void *arg)
{
    return ((ps_model *)arg)->holder < 0;
}

static tp_status
ps_forward(const tp_rpc_call_info *call, void *state, const tp_args *in,
           void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    ps_model *s = state;
    tp_tensor *x = tp_args_ntensors(in) == 1 ? tp_args_tensor(in, 0) : NULL;
    if (x == NULL || tp_tensor_ndim(x) != 2 ||
        tp_tensor_size(x, 1) != s->model.dims[0]) {
        return ps_err(err_p, TP_EINVAL,
                      "forward from %s: want one tensor [batch, %d]",
                      call->caller->name, (int)s->model.dims[0]);
    }
    size_t nb = 0;
    const char *b = tp_args_bytes(in, &nb);
    bool take = nb == 1 && b[0] == 'L';
    pthread_mutex_lock(&s->mtx);
    bool got = !take || ps_wait(&s->cv, &s->mtx, s->timeout_ms, lock_free, s);
    if (take && got) {
        s->holder = call->caller->rank;
    }
    int holder = s->holder;
    pthread_mutex_unlock(&s->mtx);
    if (!got) {
        return ps_err(err_p, TP_ETIMEDOUT,
                      "forward from %s: the lock is still held by rank %d "
                      "after %" PRId64 " ms",
                      call->caller->name, holder, s->timeout_ms);
    }
    if (holder != call->caller->rank) {
        return ps_err(err_p, TP_EINVAL,
                      "forward from %s: send 'L' to take the lock first "
                      "(it is held by rank %d)",
                      call->caller->name, holder);
    }
    tp_tensor *logits = NULL;
    tp_status st =
        tr_forward(s->model.params, s->model.nlayers, x, &logits, err_p);
    if (st == TP_OK && (st = tp_args_create(NULL, 0, out_p)) == TP_OK &&
        (st = tp_args_add_tensor(*out_p, logits)) != TP_OK) {
        tp_args_unref(*out_p);
    }
    tp_tensor_unref(logits);
    return st;
}

static tp_status
ps_release(const tp_rpc_call_info *call, void *state, const tp_args *in,
           void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)in;
    (void)arg;
    (void)out_p;
    ps_model *s = state;
    pthread_mutex_lock(&s->mtx);
    bool mine = s->holder == call->caller->rank;
    if (mine) {
        s->holder = -1;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mtx);
    if (!mine) {
        return ps_err(err_p, TP_EINVAL,
                      "release from %s: it does not hold the lock (%d)",
                      call->caller->name, s->holder);
    }
    return TP_OK;
}

static tp_status
ps_parameters(const tp_rpc_call_info *call, void *state, const tp_args *in,
              void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)in;
    (void)arg;
    ps_model *s = state;
    tp_status st = TP_OK;
    pthread_mutex_lock(&s->mtx);
    // One RRef per parameter, each owning args that hold the parameter
    // tensor itself (the leaf the gradients are keyed by).
    for (int i = s->nrefs; i < s->model.nparams && st == TP_OK; i++) {
        tp_args *v = NULL;
        st = tp_args_create(NULL, 0, &v);
        if (st == TP_OK) {
            st = tp_args_add_tensor(v, s->model.params[i]);
        }
        if (st == TP_OK) {
            st = tp_rref_create(call->agent, v, &s->refs[i], err_p);
        }
        if (st == TP_OK) {
            s->nrefs++;
        }
        tp_args_unref(v);
    }
    tp_args *out = NULL;
    if (st == TP_OK) {
        st = tp_args_create(NULL, 0, &out);
    }
    for (int i = 0; i < s->nrefs && st == TP_OK; i++) {
        st = tp_args_add_rref(out, s->refs[i]); // takes its own handle
    }
    pthread_mutex_unlock(&s->mtx);
    if (st != TP_OK) {
        tp_args_unref(out);
        if (*err_p == NULL) {
            *err_p = tp_error_create(st, NULL, "parameters for %s",
                                     call->caller->name);
        }
        return st;
    }
    *out_p = out;
    return TP_OK;
}

static bool
all_arrived(void *arg)
{
    ps_model *s = arg;
    return s->arrived >= s->trainers;
}

// The server's object, waiting until it exists; NULL after 60 s.
static ps_model *
ps_state(ps_slot *slot, tp_rref **ref_p)
{
    pthread_mutex_lock(&slot->mtx);
    struct timespec dl = ps_deadline(60000);
    while (slot->model == NULL &&
           pthread_cond_timedwait(&slot->cv, &slot->mtx, &dl) != ETIMEDOUT) {
    }
    ps_model *s = slot->state;
    if (ref_p != NULL) {
        *ref_p = slot->model != NULL ? tp_rref_ref(slot->model) : NULL;
    }
    pthread_mutex_unlock(&slot->mtx);
    return s;
}

// "tp_train.ps_barrier": returns once every trainer has called it.
static tp_status
ps_barrier(const tp_rpc_call_info *call, const tp_args *in, void *arg,
           tp_args **out_p, tp_error **err_p)
{
    (void)in;
    (void)out_p;
    tp_rref *ref = NULL; // keeps the object while this waits
    ps_model *s = ps_state(arg, &ref);
    if (ref == NULL) {
        return ps_err(err_p, TP_ENOENT, "%s: no model on %s", PS_BARRIER,
                      PS_NAME);
    }
    pthread_mutex_lock(&s->mtx);
    s->arrived++;
    pthread_cond_broadcast(&s->cv);
    bool ok = ps_wait(&s->cv, &s->mtx, s->timeout_ms, all_arrived, s);
    int arrived = s->arrived;
    pthread_mutex_unlock(&s->mtx);
    tp_rref_unref(ref);
    if (!ok) {
        return ps_err(err_p, TP_ETIMEDOUT,
                      "barrier (%s): only %d trainer(s) arrived",
                      call->caller->name, arrived);
    }
    return TP_OK;
}

static tp_status
ps_done(const tp_rpc_call_info *call, void *state, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    (void)out_p;
    ps_model *s = state;
    size_t len = 0;
    const void *b = tp_args_bytes(in, &len);
    tr_stats t;
    if (len != sizeof(t)) {
        return ps_err(err_p, TP_EINVAL, "done from %s: %d bytes",
                      call->caller->name, (int)len);
    }
    memcpy(&t, b, sizeof(t));
    pthread_mutex_lock(&s->mtx);
    s->total.samples += t.samples;
    s->total.seconds =
        t.seconds > s->total.seconds ? t.seconds : s->total.seconds;
    s->total.loss += t.loss / s->trainers;
    s->total.train_acc += t.train_acc / s->trainers;
    s->done++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mtx);
    return TP_OK;
}

static const tp_remote_method ps_methods[] = {
    {"forward", ps_forward},
    {"release", ps_release},
    {"parameters", ps_parameters},
    {"done", ps_done},
};

// "tp_train.ps_model": the RRef of the server's model (waits for it).
static tp_status
ps_get_model(const tp_rpc_call_info *call, const tp_args *in, void *arg,
             tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    tp_rref *r = NULL;
    ps_state(arg, &r);
    if (r == NULL) {
        return ps_err(err_p, TP_ENOENT,
                      "%s: %s serves no model (yet or any "
                      "more)",
                      PS_GET, PS_NAME);
    }
    // The args take a handle of their own (as tp_args_add_tensor takes
    // a reference): ours goes.
    tp_args *out = NULL;
    tp_status st = tp_args_create(NULL, 0, &out);
    if (st == TP_OK) {
        st = tp_args_add_rref(out, r);
    }
    tp_rref_unref(r);
    if (st != TP_OK) {
        tp_args_unref(out);
        return st;
    }
    *out_p = out;
    return TP_OK;
}

// ---- the server ----------------------------------------------------------

static bool
all_done(void *arg)
{
    ps_model *s = arg;
    return s->done >= s->trainers;
}

static int
ps_serve(const tr_options *o, tp_agent *agent, int trainers)
{
    const char *who = "ps";
    tp_error *err = NULL;
    tr_data test = {0};
    tp_status st = tr_data_load(o, NULL, &test, &err);
    if (st != TP_OK) {
        return tr_fail(who, "loading the test data", st, err);
    }
    int64_t cfg[CFG_DIMS + TR_MAX_LAYERS + 1];
    int nl = tr_model_dims(o, test.dim, test.nclasses, cfg + CFG_DIMS);
    cfg[CFG_NLAYERS] = nl;
    cfg[CFG_SEED] = (int64_t)o->seed;
    cfg[CFG_TRAINERS] = trainers;
    cfg[CFG_TIMEOUT] = o->timeout_ms;
    tp_args *in = NULL;
    tp_rref *model = NULL;
    void *state = NULL;
    int rc = 1;
    st =
        tp_args_create(cfg, (CFG_DIMS + (size_t)nl + 1) * sizeof(int64_t), &in);
    if (st == TP_OK) {
        st = tp_remote_create(agent, PS_NAME, PS_TYPE, in, o->timeout_ms,
                              &model, &err);
    }
    tp_args_unref(in);
    if (st == TP_OK) {
        st = tp_rref_local_object(model, o->timeout_ms, &state, &err);
    }
    if (st != TP_OK) {
        tr_fail(who, "creating the model", st, err);
        goto out;
    }
    ps_model *s = state;
    printf("%s: serving an MLP", who);
    for (int l = 0; l <= nl; l++) {
        printf("%s%" PRId64, l ? "-" : " ", s->model.dims[l]);
    }
    printf(" (%" PRId64 " parameters) to %d trainer(s), %d thread(s)\n",
           tr_model_numel(&s->model), trainers, o->threads);
    fflush(stdout);
    pthread_mutex_lock(&ps_the_slot.mtx);
    ps_the_slot.model = tp_rref_ref(model);
    ps_the_slot.state = s;
    pthread_cond_broadcast(&ps_the_slot.cv);
    pthread_mutex_unlock(&ps_the_slot.mtx);

    // Until every trainer is done (a trainer that fails ends the job
    // through the launcher).
    pthread_mutex_lock(&s->mtx);
    while (!ps_wait(&s->cv, &s->mtx, 1000, all_done, s)) {
    }
    tr_stats total = s->total;
    pthread_mutex_unlock(&s->mtx);
    rc = tr_report(o, who, &test, trainers, &total, s->model.params, nl);
out:
    pthread_mutex_lock(&ps_the_slot.mtx);
    tp_rref_unref(ps_the_slot.model);
    ps_the_slot.model = NULL;
    ps_the_slot.state = NULL;
    pthread_mutex_unlock(&ps_the_slot.mtx);
    tp_rref_unref(model);
    tr_data_fini(&test);
    return rc;
}

// ---- a trainer -----------------------------------------------------------

typedef struct ps_trainer {
    tp_agent *agent;
    tp_rref *model;
    tp_dist_optim *opt;
    tp_future *release; // the last step's "release", or NULL
    int64_t timeout_ms;
} ps_trainer;

static tp_status
ps_step(void *arg, tp_tensor *x, tp_tensor *y, double *loss_p,
        int64_t *correct_p, tp_error **err_p)
{
    ps_trainer *t = arg;
    tp_status st = TP_OK;
    if (t->release != NULL) {
        st = tp_rpc_wait(t->release, t->timeout_ms, NULL, err_p);
        tp_future_unref(t->release);
        t->release = NULL;
        if (st != TP_OK) {
            return st;
        }
    }
    int64_t cid = -1;
    tp_args *in = NULL, *out = NULL;
    tp_tensor *loss = NULL;
    if ((st = tp_dist_autograd_context_create(t->agent, &cid, err_p)) !=
        TP_OK) {
        return st; // the lock is not taken yet
    }
    st = tp_args_create("L", 1, &in); // take the lock, then forward
    if (st == TP_OK) {
        st = tp_args_add_tensor(in, x);
    }
    if (st == TP_OK) {
        st =
            tp_remote_call(t->model, "forward", in, t->timeout_ms, &out, err_p);
    }
    tp_tensor *logits = NULL;
    if (st == TP_OK) {
        logits = tp_args_ntensors(out) == 1 ? tp_args_tensor(out, 0) : NULL;
        if (logits == NULL) {
            *err_p = tp_error_create(TP_EPROTO, NULL, "forward: no logits");
            st = TP_EPROTO;
        }
    }
    if (st == TP_OK) {
        st = tp_cross_entropy(logits, y, &loss, err_p);
    }
    if (st == TP_OK) {
        st = tp_dist_autograd_backward(t->agent, cid, 1, &loss, false, err_p);
    }
    if (st == TP_OK) {
        st = tp_dist_optim_step(t->opt, cid, t->timeout_ms, err_p);
    }
    if (st == TP_OK) {
        tp_tensor_item(loss, 0, loss_p);
        *correct_p = tr_correct(logits, y);
    }
    tp_tensor_unref(loss);
    tp_args_unref(out);
    tp_args_unref(in);
    tp_dist_autograd_context_release(t->agent, cid, NULL);
    t->release = tp_remote_call_async(t->model, "release", NULL, t->timeout_ms);
    return st;
}

static int
ps_train(const tr_options *o, tp_agent *agent, int rank, int trainers)
{
    char who[32];
    snprintf(who, sizeof(who), "trainer%d", rank);
    tp_error *err = NULL;
    tr_data train = {0};
    tp_status st = tr_data_load(o, &train, NULL, &err);
    if (st != TP_OK) {
        return tr_fail(who, "loading the data", st, err);
    }
    int64_t total = o->limit > 0 && o->limit < train.n ? o->limit : train.n;
    int64_t n = total / trainers;
    tr_data shard;
    tr_data_slice(&train, (rank - 1) * n, n, &shard);
    ps_trainer t = {.agent = agent, .timeout_ms = o->timeout_ms};
    tp_args *out = NULL;
    tp_rref *refs[2 * TR_MAX_LAYERS];
    size_t nrefs = 0;
    int rc = 1;
    tp_optim_options oo;
    tr_optim_options(o, &oo);
    // The model's RRef, then its parameters' (a fork of each to here).
    st = tp_rpc_sync(agent, PS_NAME, PS_GET, NULL, o->timeout_ms, &out, &err);
    if (st == TP_OK) {
        t.model = tp_rref_ref(tp_args_rref(out, 0));
        tp_args_unref(out);
        out = NULL;
        st = tp_remote_call(t.model, "parameters", NULL, o->timeout_ms, &out,
                            &err);
    }
    if (st == TP_OK) {
        nrefs = tp_args_nrrefs(out);
        for (size_t i = 0; i < nrefs && i < 2 * TR_MAX_LAYERS; i++) {
            refs[i] = tp_args_rref(out, i);
        }
        st = tp_dist_optim_create(agent, &oo, nrefs, refs, o->timeout_ms,
                                  &t.opt, &err);
    }
    if (st == TP_OK) {
        if (rank == 1) {
            printf("%s: %d trainer(s), %" PRId64 " samples each of %s; %s "
                   "lr %g, batch %" PRId64 ", %zu parameter RRefs on %s\n",
                   who, trainers, n, train.name, tp_optim_kind_name(o->optim),
                   oo.lr, o->batch, nrefs, PS_NAME);
            fflush(stdout);
        }
        // Start together, as the peer (an RPC barrier of the trainers).
        st = tp_rpc_sync(agent, PS_NAME, PS_BARRIER, NULL, o->timeout_ms, NULL,
                         &err);
    }
    if (st != TP_OK) {
        tr_fail(who, "setting up", st, err);
        goto out;
    }
    tr_stats stats;
    st = tr_train_loop(o, &shard, ps_step, &t, who, &stats, &err);
    if (st == TP_OK && t.release != NULL) {
        st = tp_rpc_wait(t.release, o->timeout_ms, NULL, &err);
    }
    if (st != TP_OK) {
        tr_fail(who, "training", st, err);
        goto out;
    }
    tp_args *in = NULL;
    st = tp_args_create(&stats, sizeof(stats), &in);
    if (st == TP_OK) {
        st = tp_remote_call(t.model, "done", in, o->timeout_ms, NULL, &err);
    }
    tp_args_unref(in);
    if (st != TP_OK) {
        tr_fail(who, "reporting", st, err);
        goto out;
    }
    rc = 0;
out:
    tp_future_unref(t.release);
    tp_dist_optim_destroy(t.opt);
    tp_args_unref(out);
    tp_rref_unref(t.model);
    tr_data_fini(&train);
    return rc;
}

int
tr_run_ps(const tr_options *o)
{
    tp_error *err = NULL;
    tp_remote_type type = {
        .size = sizeof(type),
        .name = PS_TYPE,
        .create = ps_create,
        .destroy = ps_destroy,
        .methods = ps_methods,
        .nmethods = sizeof(ps_methods) / sizeof(ps_methods[0]),
    };
    tp_status st = tp_remote_type_register(&type, &err);
    if (st == TP_OK) {
        st = tp_rpc_register(PS_GET, ps_get_model, &ps_the_slot, &err);
    }
    if (st == TP_OK) {
        st = tp_rpc_register(PS_BARRIER, ps_barrier, &ps_the_slot, &err);
    }
    if (st != TP_OK) {
        return tr_fail("ps", "registering", st, err);
    }
    const char *r = getenv("RANK");
    int rank = r != NULL ? atoi(r) : 0;
    char name[32];
    if (rank == 0) {
        snprintf(name, sizeof(name), "%s", PS_NAME);
    } else {
        snprintf(name, sizeof(name), "trainer%d", rank);
    }
    tp_agent_options ao;
    tp_agent_options_init(&ao);
    ao.rpc_timeout_ms = o->timeout_ms;
    tp_agent *agent = NULL;
    st = tp_rpc_init(name, -1, -1, &ao, &agent, &err);
    if (st != TP_OK) {
        return tr_fail(name, "joining the RPC job", st, err);
    }
    int world = tp_rpc_world_size(agent);
    int rc;
    if (world < 2) {
        fprintf(stderr, "tp_train: --mode ps needs a server and at least "
                        "one trainer: tpipe run -n 2 or more\n");
        rc = 2;
    } else if (rank == 0) {
        rc = ps_serve(o, agent, world - 1);
    } else {
        rc = ps_train(o, agent, rank, world - 1);
    }
    st = tp_rpc_shutdown(agent, rc == 0, &err);
    if (st != TP_OK && rc == 0) {
        rc = tr_fail(name, "shutdown", st, err);
    } else {
        tp_error_unref(err);
    }
    return rc;
}
