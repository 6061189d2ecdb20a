// SPDX-License-Identifier: Apache-2.0
// train.h - what the files of tp_train share: options, data sets, the MLP,
// the training loop and the three modes (docs/training.md).
//
//   data.c   IDX (gzip or plain), CSV and synthetic data; batches
//   model.c  the MLP (parameters, init, forward, evaluation, save/compare)
//   local.c  one process with a local optimizer (the reference)
//   ddp.c    data parallel: a replica per rank, bucketed all_reduce
//   ps.c     parameter server: RPC, distributed autograd and optimizer
//   main.c   options, the training loop with its progress lines, summary
#ifndef TP_TRAIN_H
#define TP_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/tpipe.h>

// The most linear layers of the MLP (hidden layers + 1).
#define TR_MAX_LAYERS 8
// Where Debian's dataset-fashion-mnist puts the IDX files.
#define TR_FASHION_DIR "/usr/share/datasets/fashion-mnist"
// The README table's MLP figure, printed beside ours for reference.
#define TR_REF_NAME "MLP 256-128-100"
#define TR_REF_ACC  0.8833

typedef enum tr_mode {
    TR_MODE_LOCAL = 0,
    TR_MODE_PS = 1,
    TR_MODE_DDP = 2,
} tr_mode;

// ---- options (main.c) ----------------------------------------------------

typedef struct tr_options {
    tr_mode mode;
    int epochs;
    int64_t batch;
    double lr;
    tp_optim_kind optim;
    double momentum;
    uint64_t seed;
    int64_t limit; // training samples used in all (0: every one)
    int nlayers;   // linear layers (hidden layers + 1)
    int64_t hidden[TR_MAX_LAYERS - 1];
    int workers; // trainers (ps) or ranks (ddp); 0: from the launcher
    const char *data_dir;
    const char *csv;
    const char *test_csv;
    int64_t synthetic;        // > 0: this many synthetic training samples
    bool shuffle;             // reshuffle each epoch (the peer does not)
    int threads;              // compute threads per process (ops)
    int64_t bucket_bytes;     // ddp: gradient bucket capacity
    bool overlap;             // ddp: all_reduce from the backward hook
    double progress_s;        // a progress line at most this often (0: off)
    const char *save_params;  // write the final parameters here
    const char *check_params; // compare the final parameters with this
    double tol;               // ... to this absolute tolerance
    int64_t timeout_ms;       // RPC and collective deadline
} tr_options;

// ---- data (data.c) ---------------------------------------------------------

// A labelled data set: @n rows of @dim floats (pixels scaled to [0, 1])
// and @n labels in [0, @nclasses). @name says where it came from.
typedef struct tr_data {
    int64_t n;
    int64_t dim;
    int nclasses;
    float *x;
    int64_t *y;
    bool owned;   // x and y are freed by tr_data_fini (false for a slice)
    bool fashion; // Fashion-MNIST (the benchmark reference applies)
    char name[256];
} tr_data;

// tr_data_load - the training and/or test set that @o names: --data DIR,
// --csv FILE [--test-csv FILE], --synthetic N, else Debian's package.
// Either output may be NULL (not loaded). On failure the error says what
// to install or pass.
tp_status tr_data_load(const tr_options *o, tr_data *train_p, tr_data *test_p,
                       tp_error **err_p);
// tr_idx_load - an IDX image file (idx3, u8) and its label file (idx1),
// each gzip-compressed or not; every header field is checked.
tp_status tr_idx_load(const char *images, const char *labels, tr_data *d,
                      tp_error **err_p);
// tr_idx_parse - as tr_idx_load on contents already read (@iname and
// @lname name them in errors).
tp_status tr_idx_parse(const char *iname, const uint8_t *img, size_t ilen,
                       const char *lname, const uint8_t *lab, size_t llen,
                       tr_data *d, tp_error **err_p);
// tr_file_read - the whole contents of @path, gunzipped when it is gzip
// (with zlib), in *@buf_p (free()) and *@len_p.
tp_status tr_file_read(const char *path, uint8_t **buf_p, size_t *len_p,
                       tp_error **err_p);
// tr_csv_load - rows "label,pixel,pixel,..." (pixels 0..255); a first line
// that does not start with a digit is a header and skipped.
tp_status tr_csv_load(const char *path, tr_data *d, tp_error **err_p);
// tr_synthetic - @n samples of 28x28 "images": 10 classes, each a fixed
// random pattern plus noise (learnable), the same for every @seed user.
tp_status tr_synthetic(int64_t n, uint64_t seed, tr_data *d, tp_error **err_p);
// tr_data_slice - rows [@lo, @lo + @n) of @d as a view (no copy).
void tr_data_slice(const tr_data *d, int64_t lo, int64_t n, tr_data *out);
// tr_data_fini - frees what @d owns; a zeroed tr_data is fine.
void tr_data_fini(tr_data *d);
// tr_batch - rows @idx[0..@n) of @d as tensors: x [n, dim] f32 and y [n]
// i64 (new references).
tp_status tr_batch(const tr_data *d, const int64_t *idx, int64_t n,
                   tp_tensor **x_p, tp_tensor **y_p, tp_error **err_p);
// tr_rng_next - splitmix64: the next number of the stream in *@s.
uint64_t tr_rng_next(uint64_t *s);

// ---- the model (model.c)
// -----------------------------------------------------

// An MLP: @nlayers linear layers dims[0] -> dims[1] -> ... -> dims[nlayers]
// with ReLU between them. Parameters: w_i [dims[i], dims[i+1]] and b_i
// [dims[i+1]], in the order w0 b0 w1 b1 ...: f32 leaves requiring grad.
typedef struct tr_model {
    int nlayers;
    int64_t dims[TR_MAX_LAYERS + 1];
    int nparams;
    tp_tensor *params[2 * TR_MAX_LAYERS];
} tr_model;

// tr_model_init - PyTorch's nn.Linear init: every weight and bias uniform
// in (-1/sqrt(in), 1/sqrt(in)), drawn from a generator seeded with @seed.
tp_status tr_model_init(tr_model *m, int nlayers, const int64_t *dims,
                        uint64_t seed, tp_error **err_p);
void tr_model_fini(tr_model *m);
// tr_model_numel - the number of parameter elements.
int64_t tr_model_numel(const tr_model *m);
// tr_forward - the logits of @x [B, dims[0]] with the parameters @params
// (w0 b0 w1 b1 ...), recorded by autograd while grad mode is on.
tp_status tr_forward(tp_tensor *const *params, int nlayers, tp_tensor *x,
                     tp_tensor **logits_p, tp_error **err_p);
// tr_correct - how many rows of @logits [B, C] have their largest entry at
// the label in @y (the argmax is computed here).
int64_t tr_correct(tp_tensor *logits, tp_tensor *y);
// tr_evaluate - accuracy and mean cross entropy of @params on @d (grad
// mode off, in chunks).
tp_status tr_evaluate(tp_tensor *const *params, int nlayers, const tr_data *d,
                      double *acc_p, double *loss_p, tp_error **err_p);
// tr_params_save - the parameters as a little file: "TPTRAIN1", the
// count, then per tensor its numel (u64) and float32s (host order).
tp_status tr_params_save(const char *path, tp_tensor *const *params, int n,
                         tp_error **err_p);
// tr_params_compare - the largest |difference| between @params and the
// file @path written by tr_params_save (shapes must match).
tp_status tr_params_compare(const char *path, tp_tensor *const *params, int n,
                            double *maxdiff_p, tp_error **err_p);
// tr_params_max_diff - the largest |a[i] - b[i]| over @n floats.
double tr_max_diff(const float *a, const float *b, int64_t n);

// ---- training loop and results (main.c)
// --------------------------------------

// tr_step_fn - one optimizer step on batch (@x, @y): the batch's loss and
// how many rows the model (before the step) got right.
typedef tp_status (*tr_step_fn)(void *arg, tp_tensor *x, tp_tensor *y,
                                double *loss_p, int64_t *correct_p,
                                tp_error **err_p);

// What a trainer did: samples trained, seconds, the loss of its last batch
// (the peer's final_loss) and the last epoch's training accuracy.
typedef struct tr_stats {
    int64_t samples;
    double seconds;
    double loss;
    double train_acc;
} tr_stats;

// tr_train_loop - the epochs over @shard in batches of o->batch (the last
// partial batch is dropped, as the peer does; reshuffled with --shuffle),
// calling @step for each, with a line per epoch (and progress lines)
// prefixed with @who.
tp_status tr_train_loop(const tr_options *o, const tr_data *shard,
                        tr_step_fn step, void *arg, const char *who,
                        tr_stats *st_p, tp_error **err_p);
// tr_report - the final lines of a run, printed by one process: test
// accuracy on @test beside the benchmark table's figure (Fashion-MNIST),
// the parameter check (--check-params) and save (--save-params), and the
// machine-readable "result:" line. @st holds the trainers' totals
// (samples, the slowest one's seconds). Returns the exit status.
int tr_report(const tr_options *o, const char *who, const tr_data *test,
              int workers, const tr_stats *st, tp_tensor *const *params,
              int nlayers);
// tr_now - monotonic seconds.
double tr_now(void);
// tr_optim_options - the tp_optim_options of --optim, --lr, --momentum.
void tr_optim_options(const tr_options *o, tp_optim_options *oo);
// tr_model_dims - dims[] of the MLP for @o on data of @dim inputs and
// @nclasses outputs; returns the number of layers.
int tr_model_dims(const tr_options *o, int64_t dim, int nclasses,
                  int64_t *dims);

// ---- modes -----------------------------------------------------------------

// Each returns the process's exit status, after printing what failed.
int tr_run_local(const tr_options *o);
int tr_run_ddp(const tr_options *o);
int tr_run_ps(const tr_options *o);

// tr_fail - prints "tp_train: @who: @what: <message> (<status>)" to
// stderr, drops @err and returns 1.
int tr_fail(const char *who, const char *what, tp_status st, tp_error *err);

#endif
