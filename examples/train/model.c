// SPDX-License-Identifier: Apache-2.0
// model.c - the MLP of tp_train, made of autograd ops: linear layers
// (tp_matmul + tp_add of the bias) with tp_relu between them. Its
// parameters are leaf tensors that require grad, so tp_backward (local),
// tp_dist_autograd_backward (parameter server) and the DDP hook all see
// them as the leaves of the graph.

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#define PARAMS_MAGIC "TPTRAIN1"
// Rows per forward in tr_evaluate.
#define EVAL_CHUNK 2000

tp_status
tr_model_init(tr_model *m, int nlayers, const int64_t *dims, uint64_t seed,
              tp_error **err_p)
{
    memset(m, 0, sizeof(*m));
    if (nlayers < 1 || nlayers > TR_MAX_LAYERS) {
        *err_p = tp_error_create(TP_EINVAL, NULL, "%d layers: 1..%d", nlayers,
                                 TR_MAX_LAYERS);
        return TP_EINVAL;
    }
    tp_generator *g = NULL;
    tp_status st = tp_generator_create(seed, &g);
    if (st != TP_OK) {
        *err_p = tp_error_create(st, NULL, "generator");
        return st;
    }
    m->nlayers = nlayers;
    memcpy(m->dims, dims, (size_t)(nlayers + 1) * sizeof(int64_t));
    // nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) on the
    // weight is uniform(-1/sqrt(in), 1/sqrt(in)), and so is the bias.
    // Drawn in PyTorch's order: weight, then bias, layer by layer.
    for (int l = 0; l < nlayers && st == TP_OK; l++) {
        double bound = 1.0 / sqrt((double)dims[l]);
        int64_t ws[2] = {dims[l], dims[l + 1]}, bs[1] = {dims[l + 1]};
        for (int k = 0; k < 2 && st == TP_OK; k++) {
            tp_tensor **t = &m->params[m->nparams];
            st = tp_tensor_rand(TP_F32, k == 0 ? 2 : 1, k == 0 ? ws : bs,
                                -bound, bound, g, t, err_p);
            if (st == TP_OK) {
                m->nparams++;
                st = tp_tensor_set_requires_grad(*t, true, err_p);
            }
        }
    }
    tp_generator_destroy(g);
    if (st != TP_OK) {
        tr_model_fini(m);
    }
    return st;
}

void
tr_model_fini(tr_model *m)
{
    for (int i = 0; i < m->nparams; i++) {
        tp_tensor_unref(m->params[i]);
    }
    memset(m, 0, sizeof(*m));
}

int64_t
tr_model_numel(const tr_model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->nparams; i++) {
        n += tp_tensor_numel(m->params[i]);
    }
    return n;
}

tp_status
tr_forward(tp_tensor *const *params, int nlayers, tp_tensor *x,
           tp_tensor **logits_p, tp_error **err_p)
{
    tp_tensor *h = tp_tensor_ref(x);
    tp_status st = TP_OK;
    for (int l = 0; l < nlayers && st == TP_OK; l++) {
        tp_tensor *mm = NULL, *lin = NULL;
        st = tp_matmul(h, params[2 * l], &mm, err_p);
        if (st == TP_OK) {
            st = tp_add(mm, params[2 * l + 1], &lin, err_p);
        }
        tp_tensor_unref(mm);
        tp_tensor_unref(h);
        h = NULL;
        if (st == TP_OK && l + 1 < nlayers) {
            st = tp_relu(lin, &h, err_p);
            tp_tensor_unref(lin);
        } else {
            h = lin;
        }
    }
    if (st != TP_OK) {
        tp_tensor_unref(h);
        return st;
    }
    *logits_p = h;
    return TP_OK;
}

int64_t
tr_correct(tp_tensor *logits, tp_tensor *y)
{
    // Autograd has no argmax: read the rows (contiguous f32).
    tp_tensor *c = NULL;
    bool prev = tp_grad_mode_set(false);
    tp_status st = tp_tensor_contiguous(logits, &c, NULL);
    tp_grad_mode_set(prev);
    if (st != TP_OK) {
        return 0;
    }
    int64_t rows = tp_tensor_size(c, 0), cols = tp_tensor_size(c, 1);
    const float *p = tp_tensor_data(c);
    const int64_t *yp = tp_tensor_data(y);
    int64_t right = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t best = 0;
        for (int64_t k = 1; k < cols; k++) {
            if (p[r * cols + k] > p[r * cols + best]) {
                best = k;
            }
        }
        right += best == yp[r];
    }
    tp_tensor_unref(c);
    return right;
}

tp_status
tr_evaluate(tp_tensor *const *params, int nlayers, const tr_data *d,
            double *acc_p, double *loss_p, tp_error **err_p)
{
    bool prev = tp_grad_mode_set(false);
    int64_t right = 0;
    double loss = 0;
    tp_status st = TP_OK;
    int64_t *idx = malloc((size_t)EVAL_CHUNK * sizeof(int64_t));
    if (idx == NULL) {
        tp_grad_mode_set(prev);
        *err_p = tp_error_create(TP_ENOMEM, NULL, "evaluate");
        return TP_ENOMEM;
    }
    for (int64_t lo = 0; lo < d->n && st == TP_OK; lo += EVAL_CHUNK) {
        int64_t n = d->n - lo < EVAL_CHUNK ? d->n - lo : EVAL_CHUNK;
        tp_tensor *x = NULL, *y = NULL, *logits = NULL, *l = NULL;
        for (int64_t i = 0; i < n; i++) {
            idx[i] = lo + i;
        }
        st = tr_batch(d, idx, n, &x, &y, err_p);
        if (st == TP_OK) {
            st = tr_forward(params, nlayers, x, &logits, err_p);
        }
        if (st == TP_OK) {
            st = tp_cross_entropy(logits, y, &l, err_p);
        }
        if (st == TP_OK) {
            double v = 0;
            tp_tensor_item(l, 0, &v);
            loss += v * (double)n;
            right += tr_correct(logits, y);
        }
        tp_tensor_unref(l);
        tp_tensor_unref(logits);
        tp_tensor_unref(x);
        tp_tensor_unref(y);
    }
    free(idx);
    tp_grad_mode_set(prev);
    if (st != TP_OK) {
        return st;
    }
    *acc_p = d->n > 0 ? (double)right / (double)d->n : 0;
    if (loss_p != NULL) {
        *loss_p = d->n > 0 ? loss / (double)d->n : 0;
    }
    return TP_OK;
}

double
tr_max_diff(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double dd = fabs((double)a[i] - (double)b[i]);
        if (!(dd <= m)) { // NaN counts as a difference
            m = isnan(dd) ? INFINITY : dd;
        }
    }
    return m;
}

tp_status
tr_params_save(const char *path, tp_tensor *const *params, int n,
               tp_error **err_p)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        *err_p = tp_error_create(TP_EIO, NULL, "%s: cannot create", path);
        return TP_EIO;
    }
    uint64_t cnt = (uint64_t)n;
    bool ok = fwrite(PARAMS_MAGIC, 1, 8, f) == 8 &&
              fwrite(&cnt, sizeof(cnt), 1, f) == 1;
    for (int i = 0; i < n && ok; i++) {
        uint64_t numel = (uint64_t)tp_tensor_numel(params[i]);
        ok =
            fwrite(&numel, sizeof(numel), 1, f) == 1 &&
            fwrite(tp_tensor_data(params[i]), sizeof(float), numel, f) == numel;
    }
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        *err_p = tp_error_create(TP_EIO, NULL, "%s: write failed", path);
        return TP_EIO;
    }
    return TP_OK;
}

tp_status
tr_params_compare(const char *path, tp_tensor *const *params, int n,
                  double *maxdiff_p, tp_error **err_p)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    tp_status st = tr_file_read(path, &buf, &len, err_p);
    if (st != TP_OK) {
        return st;
    }
    size_t off = 16;
    uint64_t cnt = 0;
    if (len < off || memcmp(buf, PARAMS_MAGIC, 8) != 0) {
        st = TP_EINVAL;
    } else {
        memcpy(&cnt, buf + 8, sizeof(cnt));
        st = cnt == (uint64_t)n ? TP_OK : TP_EINVAL;
    }
    double m = 0;
    for (int i = 0; i < n && st == TP_OK; i++) {
        uint64_t numel = 0;
        if (len - off < 8) {
            st = TP_EINVAL;
            break;
        }
        memcpy(&numel, buf + off, 8);
        off += 8;
        if (numel != (uint64_t)tp_tensor_numel(params[i]) ||
            (len - off) / sizeof(float) < numel) {
            st = TP_EINVAL;
            break;
        }
        float *tmp = malloc(numel * sizeof(float) + 1);
        if (tmp == NULL) {
            st = TP_ENOMEM;
            break;
        }
        memcpy(tmp, buf + off, numel * sizeof(float));
        off += numel * sizeof(float);
        double dd = tr_max_diff(tmp, tp_tensor_data(params[i]), (int64_t)numel);
        m = dd > m ? dd : m;
        free(tmp);
    }
    free(buf);
    if (st != TP_OK) {
        *err_p = tp_error_create(st, NULL,
                                 "%s: not the parameters of this model (a "
                                 "file of tp_train --save-params with the "
                                 "same --hidden and data)",
                                 path);
        return st;
    }
    *maxdiff_p = m;
    return TP_OK;
}
