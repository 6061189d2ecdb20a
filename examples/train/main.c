// SPDX-License-Identifier: Apache-2.0
// main.c - tp_train: an MLP trained on Fashion-MNIST (or your data) in one
// process, data parallel, or with a parameter server (docs/training.md).
//
//   tp_train --mode local
//   tpipe run -n 3 tp_train --mode ps      (rank 0 serves, 1..2 train)
//   tpipe run -n 2 tp_train --mode ddp
//   tp_train --mode ps --workers 2         (starts the 3 processes itself)
//
// This file: the options, the training loop shared by the three modes
// (its progress lines), the final report and, with --workers outside a
// launcher, the processes of the job.

#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "train.h"

static const char usage_text[] =
    "usage: tp_train [options]\n"
    "  An MLP (784-512-10, ReLU, cross entropy) trained with SGD on\n"
    "  Fashion-MNIST (Debian's dataset-fashion-mnist), or on your data.\n"
    "  --mode local|ps|ddp  one process; parameter server (rank 0 serves,\n"
    "                       the others train; under `tpipe run -n W+1`);\n"
    "                       data parallel (every rank; `tpipe run -n W`)\n"
    "  --workers W          trainers (ps) or ranks (ddp); outside a\n"
    "                       launcher tp_train starts the processes itself\n"
    "  --epochs N (1)  --batch N (64)  --lr X (0.05)  --seed N (0)\n"
    "  --optim sgd|adam|adamw|adagrad|rmsprop (sgd)  --momentum X (0)\n"
    "  --hidden LIST        hidden layer sizes, e.g. 512 or 256,128,100;\n"
    "                       0 for none (512)\n"
    "  --limit N            train on the first N samples only (all)\n"
    "  --shuffle            reshuffle each shard every epoch (off, as the\n"
    "                       PyTorch peer)\n"
    "  --data DIR           IDX files: train-images-idx3-ubyte,\n"
    "                       train-labels-idx1-ubyte, t10k-* (gz or not)\n"
    "  --csv FILE           rows \"label,pixel,...\" (pixels 0..255; a\n"
    "                       header line is skipped); --test-csv FILE, else\n"
    "                       the last tenth of the rows is the test set\n"
    "  --synthetic N        N generated 28x28 samples of 10 classes\n"
    "  --threads N          compute threads per process, for the library's\n"
    "                       kernels and OpenBLAS (default: the cores: all\n"
    "                       for local and the ps server, 1 for a ps\n"
    "                       trainer, cores / ranks for ddp)\n"
    "  --bucket-kb N        ddp: gradient bucket size (1024)\n"
    "  --no-overlap         ddp: all_reduce after backward, not during\n"
    "  --progress S         a progress line every S seconds (5; 0: off)\n"
    "  --save-params FILE   write the final parameters\n"
    "  --check-params FILE  compare them with FILE (--tol, 1e-5); exit 1\n"
    "                       if they differ more\n"
    "  --timeout-ms N       RPC / collective deadline (120000)\n";

int
tr_fail(const char *who, const char *what, tp_status st, tp_error *err)
{
    fprintf(stderr, "tp_train: %s: %s: %s (%s)\n", who, what,
            err != NULL ? tp_error_message(err) : tp_status_describe(st),
            tp_status_name(st));
    tp_error_unref(err);
    return 1;
}

double
tr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void
tr_optim_options(const tr_options *o, tp_optim_options *oo)
{
    tp_optim_options_init(oo, o->optim);
    if (!isnan(o->lr)) {
        oo->lr = o->lr;
    }
    oo->momentum = o->momentum;
}

int
tr_model_dims(const tr_options *o, int64_t dim, int nclasses, int64_t *dims)
{
    dims[0] = dim;
    for (int i = 0; i + 1 < o->nlayers; i++) {
        dims[i + 1] = o->hidden[i];
    }
    dims[o->nlayers] = nclasses;
    return o->nlayers;
}

// ---- the training loop
// -------------------------------------------------------

static void
fmt_duration(double s, char *buf, size_t len)
{
    if (s >= 90) {
        snprintf(buf, len, "%.0f min %02.0f s", floor(s / 60),
                 fmod(round(s), 60));
    } else {
        snprintf(buf, len, "%.1f s", s);
    }
}

tp_status
tr_train_loop(const tr_options *o, const tr_data *shard, tr_step_fn step,
              void *arg, const char *who, tr_stats *st_p, tp_error **err_p)
{
    int64_t nb = shard->n / o->batch; // the peer drops the last partial one
    int64_t *idx =
        malloc((size_t)(shard->n > 0 ? shard->n : 1) * sizeof(int64_t));
    if (idx == NULL) {
        *err_p = tp_error_create(TP_ENOMEM, NULL, "batch indices");
        return TP_ENOMEM;
    }
    for (int64_t i = 0; i < shard->n; i++) {
        idx[i] = i;
    }
    uint64_t rng = o->seed * 7919 + 17;
    tr_stats st = {0};
    tp_status rc = TP_OK;
    double t0 = tr_now(), next_progress = t0 + o->progress_s;
    int64_t total = nb * o->epochs;
    for (int e = 0; e < o->epochs && rc == TP_OK; e++) {
        if (o->shuffle) {
            for (int64_t i = shard->n - 1; i > 0; i--) {
                int64_t j = (int64_t)(tr_rng_next(&rng) % (uint64_t)(i + 1));
                int64_t t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
            }
        }
        double te = tr_now(), loss_sum = 0;
        int64_t right = 0;
        for (int64_t b = 0; b < nb && rc == TP_OK; b++) {
            tp_tensor *x = NULL, *y = NULL;
            double loss = 0;
            int64_t ok = 0;
            rc = tr_batch(shard, idx + b * o->batch, o->batch, &x, &y, err_p);
            if (rc == TP_OK) {
                rc = step(arg, x, y, &loss, &ok, err_p);
            }
            tp_tensor_unref(x);
            tp_tensor_unref(y);
            loss_sum += loss;
            right += ok;
            st.loss = loss; // the last batch's, as the peer's final_loss
            double now = tr_now();
            if (o->progress_s > 0 && now >= next_progress && rc == TP_OK) {
                int64_t done = e * nb + b + 1;
                double rate = (double)(done * o->batch) / (now - t0);
                char left[32];
                fmt_duration((double)((total - done) * o->batch) / rate, left,
                             sizeof(left));
                printf("%s: epoch %d/%d %3.0f%%: loss %.4f, train acc %.4f, "
                       "%.0f samples/s, %s left\n",
                       who, e + 1, o->epochs, 100.0 * (double)(b + 1) / nb,
                       loss_sum / (double)(b + 1),
                       (double)right / (double)((b + 1) * o->batch), rate,
                       left);
                fflush(stdout);
                next_progress = now + o->progress_s;
            }
        }
        if (rc != TP_OK) {
            break;
        }
        double now = tr_now();
        st.samples += nb * o->batch;
        double mean = nb > 0 ? loss_sum / (double)nb : 0;
        st.train_acc = nb > 0 ? (double)right / (double)(nb * o->batch) : 0;
        double rate = (double)st.samples / (now - t0);
        char left[32];
        fmt_duration((double)((o->epochs - e - 1) * nb * o->batch) / rate, left,
                     sizeof(left));
        printf("%s: epoch %d/%d: loss %.4f, train acc %.4f, %" PRId64
               " samples in %.2f s (%.0f samples/s), %s left\n",
               who, e + 1, o->epochs, mean, st.train_acc, nb * o->batch,
               now - te, (double)(nb * o->batch) / (now - te), left);
        fflush(stdout);
    }
    st.seconds = tr_now() - t0;
    free(idx);
    if (rc == TP_OK) {
        *st_p = st;
    }
    return rc;
}

int
tr_report(const tr_options *o, const char *who, const tr_data *test,
          int workers, const tr_stats *st, tp_tensor *const *params,
          int nlayers)
{
    tp_error *err = NULL;
    double acc = 0, tloss = 0;
    tp_status rc = tr_evaluate(params, nlayers, test, &acc, &tloss, &err);
    if (rc != TP_OK) {
        return tr_fail(who, "evaluating on the test set", rc, err);
    }
    printf("%s: test accuracy %.4f (loss %.4f) on %" PRId64 " samples of %s\n",
           who, acc, tloss, test->n, test->name);
    if (test->fashion) {
        printf("%s: for reference, the data set's benchmark table (README): "
               "%s, %.4f test accuracy\n",
               who, TR_REF_NAME, TR_REF_ACC);
    }
    int status = 0;
    if (o->check_params != NULL) {
        double diff = 0;
        rc = tr_params_compare(o->check_params, params, 2 * nlayers, &diff,
                               &err);
        if (rc != TP_OK) {
            return tr_fail(who, "--check-params", rc, err);
        }
        bool ok = diff <= o->tol;
        printf("%s: parameters %s %s: max |diff| %.3g (tolerance %.3g)\n", who,
               ok ? "match" : "DIFFER from", o->check_params, diff, o->tol);
        status = ok ? 0 : 1;
    }
    if (o->save_params != NULL) {
        rc = tr_params_save(o->save_params, params, 2 * nlayers, &err);
        if (rc != TP_OK) {
            return tr_fail(who, "--save-params", rc, err);
        }
        printf("%s: parameters saved to %s\n", who, o->save_params);
    }
    static const char *const modes[] = {"local", "ps", "ddp"};
    printf("result: mode=%s workers=%d batch=%" PRId64
           " epochs=%d samples=%" PRId64
           " seconds=%.3f samples_per_s=%.0f test_acc=%.4f "
           "final_loss=%.4f train_acc=%.4f\n",
           modes[o->mode], workers, o->batch, o->epochs, st->samples,
           st->seconds,
           st->seconds > 0 ? (double)st->samples / st->seconds : 0.0, acc,
           st->loss, st->train_acc);
    fflush(stdout);
    return status;
}

// ---- options -------------------------------------------------------------

static int
bad_option(const char *opt, const char *val, const char *why)
{
    fprintf(stderr, "tp_train: %s %s: %s (see tp_train --help)\n", opt, val,
            why);
    return 2;
}

static bool
parse_i64(const char *s, int64_t lo, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || x < lo) {
        return false;
    }
    *v = x;
    return true;
}

static int
parse_hidden(tr_options *o, const char *s)
{
    o->nlayers = 1;
    if (strcmp(s, "0") == 0 || *s == '\0') {
        return 0;
    }
    const char *p = s;
    while (*p != '\0') {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 20) || errno != 0 ||
            (*end != ',' && *end != '\0')) {
            return bad_option("--hidden", s,
                              "want sizes like 512 or 256,128,100");
        }
        if (o->nlayers == TR_MAX_LAYERS) {
            return bad_option("--hidden", s, "too many layers");
        }
        o->hidden[o->nlayers - 1] = v;
        o->nlayers++;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static int
parse_options(int argc, char **argv, tr_options *o)
{
    enum {
        O_MODE = 256,
        O_WORKERS,
        O_EPOCHS,
        O_BATCH,
        O_LR,
        O_OPTIM,
        O_MOMENTUM,
        O_SEED,
        O_LIMIT,
        O_HIDDEN,
        O_DATA,
        O_CSV,
        O_TEST_CSV,
        O_SYNTH,
        O_SHUFFLE,
        O_THREADS,
        O_BUCKET,
        O_NO_OVERLAP,
        O_PROGRESS,
        O_SAVE,
        O_CHECK,
        O_TOL,
        O_TIMEOUT,
        O_HELP,
    };
    static const struct option opts[] = {
        {"mode", required_argument, NULL, O_MODE},
        {"workers", required_argument, NULL, O_WORKERS},
        {"epochs", required_argument, NULL, O_EPOCHS},
        {"batch", required_argument, NULL, O_BATCH},
        {"lr", required_argument, NULL, O_LR},
        {"optim", required_argument, NULL, O_OPTIM},
        {"momentum", required_argument, NULL, O_MOMENTUM},
        {"seed", required_argument, NULL, O_SEED},
        {"limit", required_argument, NULL, O_LIMIT},
        {"hidden", required_argument, NULL, O_HIDDEN},
        {"data", required_argument, NULL, O_DATA},
        {"csv", required_argument, NULL, O_CSV},
        {"test-csv", required_argument, NULL, O_TEST_CSV},
        {"synthetic", required_argument, NULL, O_SYNTH},
        {"shuffle", no_argument, NULL, O_SHUFFLE},
        {"threads", required_argument, NULL, O_THREADS},
        {"bucket-kb", required_argument, NULL, O_BUCKET},
        {"no-overlap", no_argument, NULL, O_NO_OVERLAP},
        {"progress", required_argument, NULL, O_PROGRESS},
        {"save-params", required_argument, NULL, O_SAVE},
        {"check-params", required_argument, NULL, O_CHECK},
        {"tol", required_argument, NULL, O_TOL},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    static const char *const optims[] = {"sgd", "adagrad", "adam", "adamw",
                                         "rmsprop"};
    int c, rc = 0;
    int64_t v = 0;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *name = optind > 0 ? argv[optind - 1] : "";
        char *end = NULL;
        switch (c) {
        case O_MODE:
            if (strcmp(optarg, "local") == 0) {
                o->mode = TR_MODE_LOCAL;
            } else if (strcmp(optarg, "ps") == 0) {
                o->mode = TR_MODE_PS;
            } else if (strcmp(optarg, "ddp") == 0) {
                o->mode = TR_MODE_DDP;
            } else {
                rc = bad_option("--mode", optarg, "want local, ps or ddp");
            }
            break;
        case O_WORKERS:
        case O_EPOCHS:
        case O_BATCH:
        case O_THREADS:
            if (!parse_i64(optarg, 1, &v) || v > 1 << 20) {
                rc = bad_option(name, optarg, "want a positive integer");
            } else if (c == O_WORKERS) {
                o->workers = (int)v;
            } else if (c == O_EPOCHS) {
                o->epochs = (int)v;
            } else if (c == O_BATCH) {
                o->batch = v;
            } else {
                o->threads = (int)v;
            }
            break;
        case O_LIMIT:
        case O_SYNTH:
        case O_SEED:
        case O_BUCKET:
        case O_TIMEOUT:
            if (!parse_i64(optarg, c == O_SYNTH ? 1 : 0, &v)) {
                rc = bad_option(name, optarg, "want an integer >= 0");
            } else if (c == O_LIMIT) {
                o->limit = v;
            } else if (c == O_SYNTH) {
                o->synthetic = v;
            } else if (c == O_SEED) {
                o->seed = (uint64_t)v;
            } else if (c == O_BUCKET) {
                o->bucket_bytes = v * 1024;
            } else {
                o->timeout_ms = v;
            }
            break;
        case O_LR:
        case O_MOMENTUM:
        case O_PROGRESS:
        case O_TOL: {
            double d = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(d >= 0) || isinf(d)) {
                rc = bad_option(name, optarg, "want a number >= 0");
            } else if (c == O_LR) {
                o->lr = d;
            } else if (c == O_MOMENTUM) {
                o->momentum = d;
            } else if (c == O_PROGRESS) {
                o->progress_s = d;
            } else {
                o->tol = d;
            }
            break;
        }
        case O_OPTIM: {
            size_t i = 0, n = sizeof(optims) / sizeof(optims[0]);
            while (i < n && strcmp(optarg, optims[i]) != 0) {
                i++;
            }
            if (i == n) {
                rc = bad_option("--optim", optarg,
                                "want sgd, adam, adamw, adagrad or rmsprop");
            } else {
                o->optim = (tp_optim_kind)i;
            }
            break;
        }
        case O_HIDDEN:
            rc = parse_hidden(o, optarg);
            break;
        case O_DATA:
            o->data_dir = optarg;
            break;
        case O_CSV:
            o->csv = optarg;
            break;
        case O_TEST_CSV:
            o->test_csv = optarg;
            break;
        case O_SHUFFLE:
            o->shuffle = true;
            break;
        case O_NO_OVERLAP:
            o->overlap = false;
            break;
        case O_SAVE:
            o->save_params = optarg;
            break;
        case O_CHECK:
            o->check_params = optarg;
            break;
        case O_HELP:
            fputs(usage_text, stdout);
            exit(0);
        default:
            fprintf(stderr,
                    "tp_train: unknown option or missing value: %s\n"
                    "%s",
                    name, usage_text);
            rc = 2;
        }
    }
    if (rc == 0 && optind < argc) {
        rc = bad_option("", argv[optind], "unexpected argument");
    }
    int given = (o->data_dir != NULL) + (o->csv != NULL) + (o->synthetic > 0);
    if (rc == 0 && given > 1) {
        fprintf(stderr, "tp_train: give one of --data, --csv, --synthetic\n");
        rc = 2;
    }
    if (rc == 0 && o->test_csv != NULL && o->csv == NULL) {
        rc = bad_option("--test-csv", o->test_csv, "needs --csv");
    }
    if (rc == 0 && isnan(o->lr) && o->optim == TP_OPTIM_SGD) {
        o->lr = 0.05; // the peer's
    }
    return rc;
}

// ---- the job's processes (--workers outside a launcher)
// ----------------------

static unsigned
free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0) {
        port = ntohs(sa.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

// Starts @world copies of this program with the launcher's variables set
// and waits for them; when one fails, the others are stopped. Returns the
// exit status of the job.
static int
spawn_job(char **argv, int world)
{
    unsigned port = free_port();
    if (port == 0) {
        fprintf(stderr, "tp_train: no free port on 127.0.0.1\n");
        return 1;
    }
    pid_t pids[1024];
    if (world > (int)(sizeof(pids) / sizeof(pids[0]))) {
        fprintf(stderr, "tp_train: --workers: too many\n");
        return 2;
    }
    char buf[32];
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(buf, sizeof(buf), "%u", port);
    setenv("MASTER_PORT", buf, 1);
    snprintf(buf, sizeof(buf), "%d", world);
    setenv("WORLD_SIZE", buf, 1);
    int started = 0, status = 0;
    for (int r = 0; r < world; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            snprintf(buf, sizeof(buf), "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            execv("/proc/self/exe", argv);
            fprintf(stderr, "tp_train: exec: %s\n", strerror(errno));
            _exit(127);
        }
        if (pid < 0) {
            fprintf(stderr, "tp_train: fork: %s\n", strerror(errno));
            status = 1;
            break;
        }
        pids[started++] = pid;
    }
    int left = started;
    if (status != 0) {
        for (int i = 0; i < started; i++) {
            kill(pids[i], SIGTERM);
        }
    }
    while (left > 0) {
        int ws = 0;
        pid_t pid = wait(&ws);
        if (pid < 0) {
            break;
        }
        left--;
        int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        if (code != 0 && status == 0) {
            status = code;
            for (int i = 0; i < started; i++) {
                if (pids[i] != pid) {
                    kill(pids[i], SIGTERM);
                }
            }
        }
    }
    return status;
}

// The threads of this process (--threads, else by mode and rank): the
// peer's processes compute with one torch thread each, but OpenBLAS,
// which torch does not limit, uses every core in each of them; here a
// process gets its share of the cores instead.
static int
threads_for(const tr_options *o)
{
    if (o->threads > 0) {
        return o->threads;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = ncpu > 0 ? (int)(ncpu < 64 ? ncpu : 64) : 1;
    const char *lw = getenv("LOCAL_WORLD_SIZE");
    const char *r = getenv("RANK");
    int local = lw != NULL && atoi(lw) > 0 ? atoi(lw) : 1;
    switch (o->mode) {
    case TR_MODE_DDP:
        return cores / local > 1 ? cores / local : 1;
    case TR_MODE_PS:
        // The server computes every step (one at a time, under the
        // lock) while the trainers wait for it.
        return r != NULL && atoi(r) != 0 ? 1 : cores;
    default:
        return cores;
    }
}

// OpenBLAS's thread count, if OpenBLAS is in the process (it is when the
// library was built with it): looked up at run time, as threadpoolctl
// does, so that tp_train links against tpipe only.
static void
blas_threads_set(int n)
{
    void *sym = dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
    if (sym != NULL) {
        void (*fn)(int);
        memcpy(&fn, &sym, sizeof(fn));
        fn(n);
    }
}

int
main(int argc, char **argv)
{
    tr_options o = {
        .mode = TR_MODE_LOCAL,
        .epochs = 1,
        .batch = 64,
        .lr = NAN,
        .optim = TP_OPTIM_SGD,
        .nlayers = 2,
        .hidden = {512},
        .threads = 0,
        .bucket_bytes = 1 << 20,
        .overlap = true,
        .progress_s = 5,
        .tol = 1e-5,
        .timeout_ms = 120000,
    };
    int rc = parse_options(argc, argv, &o);
    if (rc != 0) {
        return rc;
    }
    const char *ws = getenv("WORLD_SIZE");
    int world = ws != NULL ? atoi(ws) : 0;
    if (o.mode == TR_MODE_LOCAL) {
        if (world > 1) {
            fprintf(stderr,
                    "tp_train: --mode local runs in one process, "
                    "not under a launcher of %d\n",
                    world);
            return 2;
        }
    } else if (ws == NULL || getenv("RANK") == NULL) {
        if (o.workers == 0) {
            fprintf(stderr,
                    "tp_train: --mode %s: run it under `tpipe run -n N` "
                    "(RANK and WORLD_SIZE are not set), or give --workers "
                    "W\n",
                    o.mode == TR_MODE_PS ? "ps" : "ddp");
            return 2;
        }
        return spawn_job(argv, o.workers + (o.mode == TR_MODE_PS ? 1 : 0));
    } else if (o.workers != 0 &&
               o.workers + (o.mode == TR_MODE_PS ? 1 : 0) != world) {
        fprintf(stderr,
                "tp_train: --workers %d needs %d processes; the launcher "
                "started %d\n",
                o.workers, o.workers + (o.mode == TR_MODE_PS ? 1 : 0), world);
        return 2;
    }
    o.threads = threads_for(&o);
    tp_error *err = NULL;
    tp_status st = tp_compute_threads_set(o.threads, &err);
    if (st != TP_OK) {
        return tr_fail("main", "--threads", st, err);
    }
    blas_threads_set(o.threads);
    switch (o.mode) {
    case TR_MODE_PS:
        return tr_run_ps(&o);
    case TR_MODE_DDP:
        return tr_run_ddp(&o);
    default:
        return tr_run_local(&o);
    }
}
