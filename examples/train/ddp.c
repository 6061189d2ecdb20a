// SPDX-License-Identifier: Apache-2.0
// ddp.c - --mode ddp: data parallel, as PyTorch's DistributedDataParallel.
// Every rank of `tpipe run -n W` holds a replica of the MLP (same seed,
// then rank 0's parameters broadcast to be sure), trains on its shard of
// the data, and averages the gradients with all_reduce before each
// optimizer step, so the replicas stay equal.
//
// Gradients travel in buckets, as DDP's: the parameters in reverse order
// (the order backward finishes them), packed into flat f32 buffers of
// about --bucket-kb (1 MiB; a parameter larger than that gets a bucket of
// its own). With the engine's on_leaf_grad hook, a leaf's gradient is
// copied into its bucket as soon as it is final, and a full bucket's
// all_reduce (avg) starts at once, asynchronously, while backward goes on
// computing the other gradients; the step waits for them all and copies
// the averages back into .grad.

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#define DDP_MAX_PARAMS (2 * TR_MAX_LAYERS)

typedef struct ddp_bucket {
    tp_tensor *flat;   // f32 [numel]: the bucket's gradients, packed
    int nparams;       // its parameters
    int ready;         // ... whose gradient is in flat in this pass
    tp_work *work;     // the pending all_reduce, NULL if none
    tp_tensor *direct; // a lone parameter's gradient, reduced in place
} ddp_bucket;

typedef struct ddp_ctx {
    const tr_options *o;
    tr_model *model;
    tp_optim *opt;
    tp_pg *pg;
    int nbuckets;
    ddp_bucket buckets[DDP_MAX_PARAMS];
    int bucket_of[DDP_MAX_PARAMS];      // parameter -> bucket
    tp_tensor *view_of[DDP_MAX_PARAMS]; // parameter-shaped view of flat
    bool copied[DDP_MAX_PARAMS];        // in this pass
    tp_error *hook_err;                 // the first failure inside the hook
    tp_status hook_st;
} ddp_ctx;

// Lays the parameters out in buckets, last parameter first.
static tp_status
ddp_buckets_init(ddp_ctx *c, tp_error **err_p)
{
    tr_model *m = c->model;
    int64_t numel[DDP_MAX_PARAMS + 1] = {0};
    int b = -1;
    int64_t used = 0;
    for (int i = m->nparams - 1; i >= 0; i--) {
        int64_t n = tp_tensor_numel(m->params[i]);
        if (b < 0 || (used > 0 && (used + n) * (int64_t)sizeof(float) >
                                      c->o->bucket_bytes)) {
            b++;
            used = 0;
        }
        c->bucket_of[i] = b;
        c->buckets[b].nparams++;
        used += n;
        numel[b] = used;
    }
    c->nbuckets = b + 1;
    int64_t off[DDP_MAX_PARAMS] = {0};
    tp_status st = TP_OK;
    for (int k = 0; k < c->nbuckets && st == TP_OK; k++) {
        st = tp_tensor_zeros(TP_F32, 1, &numel[k], &c->buckets[k].flat, err_p);
    }
    for (int i = m->nparams - 1; i >= 0 && st == TP_OK; i--) {
        ddp_bucket *bk = &c->buckets[c->bucket_of[i]];
        int64_t n = tp_tensor_numel(m->params[i]);
        tp_tensor *slice = NULL;
        st = tp_tensor_narrow(bk->flat, 0, off[c->bucket_of[i]], n, &slice,
                              err_p);
        if (st == TP_OK) {
            st = tp_tensor_reshape(slice, tp_tensor_ndim(m->params[i]),
                                   tp_tensor_shape(m->params[i]),
                                   &c->view_of[i], err_p);
        }
        tp_tensor_unref(slice);
        off[c->bucket_of[i]] += n;
    }
    return st;
}

static void
ddp_buckets_fini(ddp_ctx *c)
{
    for (int i = 0; i < DDP_MAX_PARAMS; i++) {
        tp_tensor_unref(c->view_of[i]);
        c->view_of[i] = NULL;
    }
    for (int k = 0; k < c->nbuckets; k++) {
        tp_work_free(c->buckets[k].work);
        tp_tensor_unref(c->buckets[k].flat);
        tp_tensor_unref(c->buckets[k].direct);
    }
    tp_error_unref(c->hook_err);
    c->nbuckets = 0;
}

// Copies parameter @i's gradient (zeros if it got none) into its bucket;
// when the bucket is complete, starts its all_reduce. A bucket of one
// parameter (one larger than the bucket size) is reduced in place in the
// gradient itself, which the engine no longer touches (no copies).
static tp_status
ddp_grad_ready(ddp_ctx *c, int i, tp_tensor *grad, tp_error **err_p)
{
    if (c->copied[i]) {
        return TP_OK;
    }
    ddp_bucket *bk = &c->buckets[c->bucket_of[i]];
    tp_status st = TP_OK;
    c->copied[i] = true;
    if (bk->nparams == 1 && grad != NULL && tp_tensor_is_contiguous(grad) &&
        tp_tensor_dtype(grad) == TP_F32) {
        bk->direct = tp_tensor_ref(grad);
        return tp_pg_all_reduce(c->pg, grad, TP_REDUCE_AVG, &bk->work, err_p);
    }
    if (grad != NULL) {
        st = tp_tensor_copy(c->view_of[i], grad, err_p);
    } else {
        tp_tensor *z = NULL;
        int64_t one = 1;
        st = tp_tensor_zeros(TP_F32, 1, &one, &z, err_p);
        if (st == TP_OK) {
            st = tp_tensor_copy(c->view_of[i], z, err_p);
        }
        tp_tensor_unref(z);
    }
    if (st == TP_OK && ++bk->ready == bk->nparams) {
        st = tp_pg_all_reduce(c->pg, bk->flat, TP_REDUCE_AVG, &bk->work, err_p);
    }
    return st;
}

// tp_leaf_grad_cb: a parameter's gradient is final (during backward).
static void
ddp_on_leaf_grad(tp_tensor *leaf, tp_tensor *grad, void *arg)
{
    ddp_ctx *c = arg;
    for (int i = 0; i < c->model->nparams; i++) {
        if (c->model->params[i] == leaf) {
            tp_error *err = NULL;
            tp_status st = ddp_grad_ready(c, i, grad, &err);
            if (st != TP_OK && c->hook_st == TP_OK) {
                c->hook_st = st;
                c->hook_err = err;
            } else {
                tp_error_unref(err);
            }
            return;
        }
    }
}

// Every bucket's all_reduce started and finished; the averages back in
// .grad.
static tp_status
ddp_sync_grads(ddp_ctx *c, tp_error **err_p)
{
    tr_model *m = c->model;
    tp_status st = TP_OK;
    // Parameters the hook did not see (no hook, or no gradient), in the
    // bucket order every rank uses.
    for (int i = m->nparams - 1; i >= 0 && st == TP_OK; i--) {
        st = ddp_grad_ready(c, i, tp_tensor_grad(m->params[i]), err_p);
    }
    for (int k = 0; k < c->nbuckets; k++) {
        ddp_bucket *bk = &c->buckets[k];
        if (bk->work != NULL) {
            tp_error *e = NULL;
            tp_status ws = tp_work_wait(bk->work, 0, &e);
            if (ws != TP_OK && st == TP_OK) {
                st = ws;
                *err_p = e;
            } else {
                tp_error_unref(e);
            }
            tp_work_free(bk->work);
            bk->work = NULL;
        }
        bk->ready = 0;
    }
    for (int i = 0; i < m->nparams; i++) {
        ddp_bucket *bk = &c->buckets[c->bucket_of[i]];
        tp_tensor *g = tp_tensor_grad(m->params[i]);
        if (st == TP_OK && g != NULL && bk->direct == NULL) {
            st = tp_tensor_copy(g, c->view_of[i], err_p);
        }
        c->copied[i] = false;
    }
    for (int k = 0; k < c->nbuckets; k++) {
        tp_tensor_unref(c->buckets[k].direct);
        c->buckets[k].direct = NULL;
    }
    return st;
}

static tp_status
ddp_step(void *arg, tp_tensor *x, tp_tensor *y, double *loss_p,
         int64_t *correct_p, tp_error **err_p)
{
    ddp_ctx *c = arg;
    tp_tensor *logits = NULL, *loss = NULL;
    tp_optim_zero_grad(c->opt);
    tp_status st =
        tr_forward(c->model->params, c->model->nlayers, x, &logits, err_p);
    if (st == TP_OK) {
        st = tp_cross_entropy(logits, y, &loss, err_p);
    }
    if (st == TP_OK) {
        // With the hook, buckets start reducing during the pass.
        tp_backward_options bo;
        tp_backward_options_init(&bo);
        if (c->o->overlap) {
            bo.on_leaf_grad = ddp_on_leaf_grad;
            bo.on_leaf_grad_arg = c;
        }
        tp_backward_root root = {.tensor = loss};
        st = tp_backward_run(&bo, 1, &root, err_p);
    }
    if (st == TP_OK && c->hook_st != TP_OK) {
        st = c->hook_st;
        *err_p = c->hook_err;
        c->hook_st = TP_OK;
        c->hook_err = NULL;
    }
    // Whatever happened, every started all_reduce is waited for.
    tp_error *serr = NULL;
    tp_status sst = ddp_sync_grads(c, st == TP_OK ? err_p : &serr);
    tp_error_unref(serr);
    if (st == TP_OK) {
        st = sst;
    }
    if (st == TP_OK) {
        st = tp_optim_step(c->opt, NULL, err_p);
    }
    if (st == TP_OK) {
        tp_tensor_item(loss, 0, loss_p);
        *correct_p = tr_correct(logits, y);
    }
    tp_tensor_unref(loss);
    tp_tensor_unref(logits);
    return st;
}

// Rank 0's parameters to every rank (before training), or, with @check,
// the largest difference of each rank's parameters from rank 0's.
static tp_status
ddp_params_from_root(ddp_ctx *c, bool check, double *maxdiff_p,
                     tp_error **err_p)
{
    tr_model *m = c->model;
    tp_status st = TP_OK;
    double worst = 0;
    for (int i = 0; i < m->nparams && st == TP_OK; i++) {
        if (!check) {
            st = tp_pg_broadcast(c->pg, m->params[i], 0, NULL, err_p);
            continue;
        }
        tp_tensor *root = NULL;
        st = tp_tensor_clone(m->params[i], &root, err_p);
        if (st == TP_OK) {
            st = tp_pg_broadcast(c->pg, root, 0, NULL, err_p);
        }
        if (st == TP_OK) {
            double d =
                tr_max_diff(tp_tensor_data(root), tp_tensor_data(m->params[i]),
                            tp_tensor_numel(root));
            worst = d > worst ? d : worst;
        }
        tp_tensor_unref(root);
    }
    if (st == TP_OK && check) {
        int64_t one = 1;
        tp_tensor *t = NULL;
        st = tp_tensor_full(TP_F64, 1, &one, worst, &t, err_p);
        if (st == TP_OK) {
            st = tp_pg_all_reduce(c->pg, t, TP_REDUCE_MAX, NULL, err_p);
        }
        if (st == TP_OK) {
            tp_tensor_item(t, 0, maxdiff_p);
        }
        tp_tensor_unref(t);
    }
    return st;
}

// The job's totals: samples summed, seconds of the slowest rank, loss and
// training accuracy averaged.
static tp_status
ddp_totals(ddp_ctx *c, tr_stats *st_io, tp_error **err_p)
{
    int64_t four = 4, one = 1;
    tp_tensor *sum = NULL, *max = NULL;
    tp_status st = tp_tensor_empty(TP_F64, 1, &four, &sum, err_p);
    if (st == TP_OK) {
        st = tp_tensor_full(TP_F64, 1, &one, st_io->seconds, &max, err_p);
    }
    if (st == TP_OK) {
        double *s = tp_tensor_data(sum);
        s[0] = (double)st_io->samples;
        s[1] = st_io->loss;
        s[2] = st_io->train_acc;
        s[3] = 1;
        st = tp_pg_all_reduce(c->pg, sum, TP_REDUCE_SUM, NULL, err_p);
    }
    if (st == TP_OK) {
        st = tp_pg_all_reduce(c->pg, max, TP_REDUCE_MAX, NULL, err_p);
    }
    if (st == TP_OK) {
        const double *s = tp_tensor_data(sum);
        st_io->samples = (int64_t)s[0];
        st_io->loss = s[1] / s[3];
        st_io->train_acc = s[2] / s[3];
        tp_tensor_item(max, 0, &st_io->seconds);
    }
    tp_tensor_unref(sum);
    tp_tensor_unref(max);
    return st;
}

int
tr_run_ddp(const tr_options *o)
{
    char who[32] = "ddp";
    tp_error *err = NULL;
    tp_pg_options po;
    tp_pg_options_init(&po);
    po.timeout_ms = o->timeout_ms;
    tp_pg *pg = NULL;
    tp_status st = tp_pg_init("env://", -1, -1, &po, &pg, &err);
    if (st != TP_OK) {
        return tr_fail(who, "joining the process group", st, err);
    }
    int rank = tp_pg_rank(pg), world = tp_pg_size(pg);
    snprintf(who, sizeof(who), "ddp rank %d", rank);
    tr_data train = {0}, test = {0};
    tr_model model = {0};
    ddp_ctx c = {.o = o, .model = &model, .pg = pg};
    int rc = 1;
    st = tr_data_load(o, &train, rank == 0 ? &test : NULL, &err);
    if (st != TP_OK) {
        tr_fail(who, "loading the data", st, err);
        goto out_pg;
    }
    int64_t total = o->limit > 0 && o->limit < train.n ? o->limit : train.n;
    int64_t n = total / world;
    tr_data shard;
    tr_data_slice(&train, rank * n, n, &shard);
    int64_t dims[TR_MAX_LAYERS + 1];
    int nl = tr_model_dims(o, train.dim, train.nclasses, dims);
    tp_optim_options oo;
    tr_optim_options(o, &oo);
    if ((st = tr_model_init(&model, nl, dims, o->seed, &err)) != TP_OK ||
        (st = ddp_params_from_root(&c, false, NULL, &err)) != TP_OK ||
        (st = ddp_buckets_init(&c, &err)) != TP_OK ||
        (st = tp_optim_create(&oo, (size_t)model.nparams, model.params, &c.opt,
                              &err)) != TP_OK) {
        tr_fail(who, "setting up the replica", st, err);
        goto out_model;
    }
    if (rank == 0) {
        printf("%s: %d ranks (collectives: %s), %" PRId64
               " samples each of %s, MLP",
               who, world, tp_pg_engine(pg), n, train.name);
        for (int l = 0; l <= nl; l++) {
            printf("%s%" PRId64, l ? "-" : " ", dims[l]);
        }
        printf(", %s lr %g, batch %" PRId64 ", %d gradient bucket(s) of "
               "<= %" PRId64 " KiB, all_reduce %s backward, %d thread(s) "
               "per rank\n",
               tp_optim_kind_name(o->optim), oo.lr, o->batch, c.nbuckets,
               o->bucket_bytes / 1024, o->overlap ? "during" : "after",
               o->threads);
        fflush(stdout);
    }
    // Start together, as the peer (dist.barrier before its clock).
    if ((st = tp_pg_barrier(pg, NULL, &err)) != TP_OK) {
        tr_fail(who, "barrier", st, err);
        goto out_model;
    }
    tr_stats stats;
    st = tr_train_loop(o, &shard, ddp_step, &c, who, &stats, &err);
    if (st != TP_OK) {
        tr_fail(who, "training", st, err);
        goto out_model;
    }
    double diff = 0;
    if ((st = ddp_params_from_root(&c, true, &diff, &err)) != TP_OK ||
        (st = ddp_totals(&c, &stats, &err)) != TP_OK) {
        tr_fail(who, "comparing the replicas", st, err);
        goto out_model;
    }
    printf("%s: replicas %s: max |diff| from rank 0's parameters %.3g over "
           "%d ranks\n",
           who, diff == 0 ? "equal" : "DIFFER", diff, world);
    rc = diff == 0 ? 0 : 1;
    if (rank == 0 && rc == 0) {
        rc = tr_report(o, who, &test, world, &stats, model.params, nl);
    }
out_model:
    tp_optim_destroy(c.opt);
    ddp_buckets_fini(&c);
    tr_model_fini(&model);
    tr_data_fini(&train);
    tr_data_fini(&test);
out_pg:
    tp_pg_destroy(pg);
    return rc;
}
