// SPDX-License-Identifier: Apache-2.0
// local.c - --mode local: one process trains the MLP with a local
// optimizer (optim.h) over .grad. It is also the reference of the
// parameter-server mode: with one trainer, the same seed and data, both
// make the same updates in the same order (tests/tools/train_test.sh).

#include <inttypes.h>
#include <stdio.h>

#include "train.h"

typedef struct local_ctx {
    tr_model *model;
    tp_optim *opt;
} local_ctx;

// One step: forward, cross entropy, backward into .grad, optimizer step.
static tp_status
local_step(void *arg, tp_tensor *x, tp_tensor *y, double *loss_p,
           int64_t *correct_p, tp_error **err_p)
{
    local_ctx *c = arg;
    tp_tensor *logits = NULL, *loss = NULL;
    tp_optim_zero_grad(c->opt);
    tp_status st =
        tr_forward(c->model->params, c->model->nlayers, x, &logits, err_p);
    if (st == TP_OK) {
        st = tp_cross_entropy(logits, y, &loss, err_p);
    }
    if (st == TP_OK) {
        st = tp_backward(1, &loss, NULL, false, err_p);
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

int
tr_run_local(const tr_options *o)
{
    const char *who = "local";
    tp_error *err = NULL;
    tr_data train = {0}, test = {0};
    tp_status st = tr_data_load(o, &train, &test, &err);
    if (st != TP_OK) {
        return tr_fail(who, "loading the data", st, err);
    }
    tr_data shard;
    tr_data_slice(&train, 0,
                  o->limit > 0 && o->limit < train.n ? o->limit : train.n,
                  &shard);
    int64_t dims[TR_MAX_LAYERS + 1];
    int nl = tr_model_dims(o, train.dim, train.nclasses, dims);
    tr_model model;
    local_ctx c = {.model = &model};
    tp_optim_options oo;
    tr_optim_options(o, &oo);
    int rc = 1;
    st = tr_model_init(&model, nl, dims, o->seed, &err);
    if (st != TP_OK) {
        tr_fail(who, "model", st, err);
        goto out_data;
    }
    st =
        tp_optim_create(&oo, (size_t)model.nparams, model.params, &c.opt, &err);
    if (st != TP_OK) {
        tr_fail(who, "optimizer", st, err);
        goto out_model;
    }
    printf("%s: %" PRId64 " training samples of %s, MLP %" PRId64, who, shard.n,
           train.name, dims[0]);
    for (int l = 1; l <= nl; l++) {
        printf("-%" PRId64, dims[l]);
    }
    printf(" (%" PRId64 " parameters), %s lr %g, batch %" PRId64
           ", %d epoch(s), %d thread(s)\n",
           tr_model_numel(&model), tp_optim_kind_name(o->optim), oo.lr,
           o->batch, o->epochs, o->threads);
    tr_stats stats;
    st = tr_train_loop(o, &shard, local_step, &c, who, &stats, &err);
    if (st != TP_OK) {
        tr_fail(who, "training", st, err);
        goto out_optim;
    }
    rc = tr_report(o, who, &test, 1, &stats, model.params, nl);
out_optim:
    tp_optim_destroy(c.opt);
out_model:
    tr_model_fini(&model);
out_data:
    tr_data_fini(&train);
    tr_data_fini(&test);
    return rc;
}
