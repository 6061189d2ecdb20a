// SPDX-License-Identifier: Apache-2.0
// data.c - the data sets of tp_train: IDX files (Fashion-MNIST's format,
// gzip-compressed or not), CSV, and a synthetic set; batches as tensors.
//
// IDX (http://yann.lecun.com/exdb/mnist/): a big-endian header, then the
// bytes. Images: magic 0x00000803 (u8, 3 dims), count, rows, cols, then
// count*rows*cols pixels. Labels: magic 0x00000801 (u8, 1 dim), count,
// then count labels. Every field is checked against the file's size and
// the other file, and an error names the file and the field.

#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if TR_HAVE_ZLIB
#include <zlib.h>
#endif

#include "train.h"

// Larger inputs are refused (a corrupt or hostile gzip could inflate
// without end).
#define DATA_MAX_BYTES   ((size_t)4 << 30)
#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u

static tp_status data_error(tp_error **err_p, tp_status st, const char *fmt,
                            ...) __attribute__((format(printf, 3, 4)));

static tp_status
data_error(tp_error **err_p, tp_status st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (err_p != NULL) {
        *err_p = tp_error_create(st, NULL, "%s", msg);
    }
    return st;
}

uint64_t
tr_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A float in [0, 1) from the stream in *@s.
static float
rng_unit(uint64_t *s)
{
    return (float)(tr_rng_next(s) >> 40) / (float)(1u << 24);
}

static tp_status
data_alloc(tr_data *d, int64_t n, int64_t dim, tp_error **err_p)
{
    memset(d, 0, sizeof(*d));
    d->x = malloc((size_t)(n > 0 ? n : 1) * (size_t)dim * sizeof(float));
    d->y = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (d->x == NULL || d->y == NULL) {
        free(d->x);
        free(d->y);
        d->x = NULL;
        d->y = NULL;
        return data_error(
            err_p, TP_ENOMEM,
            "no memory for %" PRId64 " samples of %" PRId64 " floats", n, dim);
    }
    d->n = n;
    d->dim = dim;
    d->owned = true;
    return TP_OK;
}

void
tr_data_fini(tr_data *d)
{
    if (d != NULL && d->owned) {
        free(d->x);
        free(d->y);
    }
    if (d != NULL) {
        memset(d, 0, sizeof(*d));
    }
}

void
tr_data_slice(const tr_data *d, int64_t lo, int64_t n, tr_data *out)
{
    *out = *d;
    out->owned = false;
    out->x = d->x + lo * d->dim;
    out->y = d->y + lo;
    out->n = n;
}

// ---- reading files -------------------------------------------------------

// Grows the buffer to at least @need bytes (doubling), within the limit.
static tp_status
buf_reserve(uint8_t **buf, size_t *cap, size_t need, const char *path,
            tp_error **err_p)
{
    if (need <= *cap) {
        return TP_OK;
    }
    if (need > DATA_MAX_BYTES) {
        return data_error(err_p, TP_EINVAL,
                          "%s: larger than %zu bytes (uncompressed): not a "
                          "data file of this size",
                          path, DATA_MAX_BYTES);
    }
    size_t ncap = *cap ? *cap : (size_t)1 << 20;
    while (ncap < need) {
        ncap *= 2;
    }
    uint8_t *nb = realloc(*buf, ncap);
    if (nb == NULL) {
        return data_error(err_p, TP_ENOMEM, "%s: no memory for %zu bytes", path,
                          ncap);
    }
    *buf = nb;
    *cap = ncap;
    return TP_OK;
}

#if !TR_HAVE_ZLIB
static bool
path_is_gzip(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char m[2] = {0, 0};
    bool gz =
        f != NULL && fread(m, 1, 2, f) == 2 && m[0] == 0x1f && m[1] == 0x8b;
    if (f != NULL) {
        fclose(f);
    }
    return gz;
}
#endif

tp_status
tr_file_read(const char *path, uint8_t **buf_p, size_t *len_p, tp_error **err_p)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return data_error(err_p, errno == ENOENT ? TP_ENOENT : TP_EIO, "%s: %s",
                          path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        return data_error(err_p, TP_EINVAL, "%s: not a regular file", path);
    }
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    tp_status st = TP_OK;
#if TR_HAVE_ZLIB
    // gzread passes a file that is not gzip through unchanged.
    gzFile gz = gzopen(path, "rb");
    if (gz == NULL) {
        return data_error(err_p, TP_EIO, "%s: %s", path,
                          errno ? strerror(errno) : "cannot open");
    }
    gzbuffer(gz, 1 << 17);
    for (;;) {
        if ((st = buf_reserve(&buf, &cap, len + (1 << 20), path, err_p)) !=
            TP_OK) {
            break;
        }
        int r = gzread(gz, buf + len, (unsigned)(cap - len));
        if (r < 0) {
            int zerr = 0;
            const char *m = gzerror(gz, &zerr);
            st = data_error(err_p, TP_EINVAL,
                            "%s: corrupt gzip data after %zu bytes: %s", path,
                            len, m);
            break;
        }
        if (r == 0) {
            break;
        }
        len += (size_t)r;
    }
    if (st == TP_OK) {
        int zerr = 0;
        const char *m = gzerror(gz, &zerr);
        if (zerr != Z_OK) {
            st = data_error(err_p, TP_EINVAL,
                            "%s: truncated or corrupt gzip data after %zu "
                            "bytes: %s",
                            path, len, m);
        }
    }
    int cr = gzclose_r(gz);
    if (st == TP_OK && cr != Z_OK) {
        st = data_error(err_p, TP_EINVAL,
                        "%s: truncated gzip data (the stream ends early, "
                        "after %zu bytes)",
                        path, len);
    }
#else
    if (path_is_gzip(path)) {
        return data_error(err_p, TP_ENOTSUP,
                          "%s is gzip-compressed and tp_train was built "
                          "without zlib: gunzip it (keep the name without "
                          ".gz), or install zlib1g-dev and rebuild",
                          path);
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return data_error(err_p, TP_EIO, "%s: %s", path, strerror(errno));
    }
    for (;;) {
        if ((st = buf_reserve(&buf, &cap, len + (1 << 20), path, err_p)) !=
            TP_OK) {
            break;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) {
                st = data_error(err_p, TP_EIO, "%s: read error", path);
            }
            break;
        }
    }
    fclose(f);
#endif
    if (st != TP_OK) {
        free(buf);
        return st;
    }
    *buf_p = buf;
    *len_p = len;
    return TP_OK;
}

// ---- IDX -------------------------------------------------------------------

static uint32_t
be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           (uint32_t)p[3];
}

// Checks an IDX header: @magic, then @ndims sizes; fills @dims.
static tp_status
idx_header(const char *name, const uint8_t *b, size_t len, uint32_t magic,
           int ndims, uint32_t *dims, tp_error **err_p)
{
    size_t hdr = 4 + 4 * (size_t)ndims;
    if (len < hdr) {
        return data_error(err_p, TP_EINVAL,
                          "%s: truncated IDX header: %zu bytes, want %zu", name,
                          len, hdr);
    }
    uint32_t m = be32(b);
    if (m != magic) {
        const char *what = magic == IDX_MAGIC_IMAGES ? "images (idx3-ubyte)"
                                                     : "labels (idx1-ubyte)";
        if ((m >> 16) == 0 && ((m >> 8) & 0xff) >= 0x08 &&
            ((m >> 8) & 0xff) <= 0x0e) {
            return data_error(err_p, TP_EINVAL,
                              "%s: IDX magic 0x%08x (type 0x%02x, %u dims), "
                              "want 0x%08x: not a file of u8 %s",
                              name, m, (m >> 8) & 0xff, m & 0xff, magic, what);
        }
        return data_error(err_p, TP_EINVAL,
                          "%s: bad magic 0x%08x, want 0x%08x: not an IDX file "
                          "of %s",
                          name, m, magic, what);
    }
    for (int i = 0; i < ndims; i++) {
        dims[i] = be32(b + 4 + 4 * i);
    }
    return TP_OK;
}

tp_status
tr_idx_parse(const char *iname, const uint8_t *img, size_t ilen,
             const char *lname, const uint8_t *lab, size_t llen, tr_data *d,
             tp_error **err_p)
{
    uint32_t id[3], ld[1];
    tp_status st = idx_header(iname, img, ilen, IDX_MAGIC_IMAGES, 3, id, err_p);
    if (st == TP_OK) {
        st = idx_header(lname, lab, llen, IDX_MAGIC_LABELS, 1, ld, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    uint32_t n = id[0], rows = id[1], cols = id[2];
    if (n == 0) {
        return data_error(err_p, TP_EINVAL, "%s: the header says 0 images",
                          iname);
    }
    if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096) {
        return data_error(err_p, TP_EINVAL,
                          "%s: image size %ux%u in the header is out of "
                          "range (1..4096)",
                          iname, rows, cols);
    }
    uint64_t dim = (uint64_t)rows * cols;
    uint64_t want = 16 + (uint64_t)n * dim;
    if (want > DATA_MAX_BYTES) {
        return data_error(err_p, TP_EINVAL,
                          "%s: the header says %u images of %ux%u (%" PRIu64
                          " bytes): too large",
                          iname, n, rows, cols, want);
    }
    if (ilen != want) {
        return data_error(err_p, TP_EINVAL,
                          "%s: %s: %zu bytes, but the header (%u images of "
                          "%ux%u) says %" PRIu64,
                          iname, ilen < want ? "truncated" : "trailing bytes",
                          ilen, n, rows, cols, want);
    }
    if (ld[0] != n) {
        return data_error(err_p, TP_EINVAL,
                          "%s has %u labels but %s has %u images: not a "
                          "matching pair",
                          lname, ld[0], iname, n);
    }
    if (llen != 8 + (uint64_t)n) {
        return data_error(
            err_p, TP_EINVAL,
            "%s: %s: %zu bytes, but the header (%u labels) says "
            "%" PRIu64,
            lname, llen < 8 + (uint64_t)n ? "truncated" : "trailing bytes",
            llen, n, 8 + (uint64_t)n);
    }
    if ((st = data_alloc(d, n, (int64_t)dim, err_p)) != TP_OK) {
        return st;
    }
    const uint8_t *px = img + 16;
    for (uint64_t i = 0; i < (uint64_t)n * dim; i++) {
        d->x[i] = (float)px[i] / 255.0f; // as the peer: x.astype(f32) / 255
    }
    int maxl = 0;
    for (uint32_t i = 0; i < n; i++) {
        d->y[i] = lab[8 + i];
        maxl = lab[8 + i] > maxl ? lab[8 + i] : maxl;
    }
    d->nclasses = maxl + 1;
    snprintf(d->name, sizeof(d->name), "%s", iname);
    return TP_OK;
}

tp_status
tr_idx_load(const char *images, const char *labels, tr_data *d,
            tp_error **err_p)
{
    uint8_t *img = NULL, *lab = NULL;
    size_t ilen = 0, llen = 0;
    tp_status st = tr_file_read(images, &img, &ilen, err_p);
    if (st == TP_OK) {
        st = tr_file_read(labels, &lab, &llen, err_p);
    }
    if (st == TP_OK) {
        st = tr_idx_parse(images, img, ilen, labels, lab, llen, d, err_p);
    }
    free(img);
    free(lab);
    return st;
}

// Finds "<dir>/<kind>-<what>-idx<k>-ubyte" (or ".idx<k>-ubyte", MNIST's
// original spelling), with or without ".gz"; false if none exists.
static bool
idx_find(const char *dir, const char *kind, const char *what, int k, char *path,
         size_t len)
{
    static const char *const forms[] = {
        "%s/%s-%s-idx%d-ubyte.gz", "%s/%s-%s-idx%d-ubyte",
        "%s/%s-%s.idx%d-ubyte.gz", "%s/%s-%s.idx%d-ubyte"};
    struct stat sb;
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        snprintf(path, len, forms[i], dir, kind, what, k);
        if (stat(path, &sb) == 0) {
            return true;
        }
    }
    snprintf(path, len, forms[1], dir, kind, what, k);
    return false;
}

static tp_status
idx_load_dir(const char *dir, const char *kind, tr_data *d, tp_error **err_p)
{
    char images[4096], labels[4096];
    bool hi = idx_find(dir, kind, "images", 3, images, sizeof(images));
    bool hl = idx_find(dir, kind, "labels", 1, labels, sizeof(labels));
    if (!hi || !hl) {
        return data_error(err_p, TP_ENOENT,
                          "no %s (or .gz) in %s: a data folder holds "
                          "train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                          "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte "
                          "(each gzip-compressed or not)",
                          hi ? labels : images, dir);
    }
    return tr_idx_load(images, labels, d, err_p);
}

// ---- CSV -------------------------------------------------------------------

tp_status
tr_csv_load(const char *path, tr_data *d, tp_error **err_p)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    tp_status st = tr_file_read(path, &buf, &len, err_p);
    if (st != TP_OK) {
        return st;
    }
    // Count rows and the columns of the first data row.
    char *text = realloc(buf, len + 1);
    if (text == NULL) {
        free(buf);
        return data_error(err_p, TP_ENOMEM, "%s: no memory", path);
    }
    text[len] = '\0';
    char *p = text;
    int64_t line = 1;
    if (*p != '\0' && !isdigit((unsigned char)*p)) {
        // A header ("label,pixel1,..." as in the Kaggle CSV files).
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : text + len;
        line++;
    }
    int64_t rows = 0, cols = 0;
    for (char *q = p; *q != '\0';) {
        char *e = strchr(q, '\n');
        size_t l = e != NULL ? (size_t)(e - q) : strlen(q);
        bool blank = true;
        int64_t c = 1;
        for (size_t i = 0; i < l; i++) {
            blank = blank && isspace((unsigned char)q[i]);
            c += q[i] == ',';
        }
        if (!blank) {
            if (rows == 0) {
                cols = c;
            }
            rows++;
        }
        q = e != NULL ? e + 1 : q + l;
    }
    if (rows == 0 || cols < 2) {
        free(text);
        return data_error(err_p, TP_EINVAL,
                          "%s: no data rows (want \"label,pixel,pixel,...\" "
                          "per line)",
                          path);
    }
    if ((st = data_alloc(d, rows, cols - 1, err_p)) != TP_OK) {
        free(text);
        return st;
    }
    int64_t r = 0, maxl = 0;
    while (*p != '\0' && st == TP_OK) {
        char *e = strchr(p, '\n');
        char *end_line = e != NULL ? e : p + strlen(p);
        bool blank = true;
        for (char *q = p; q < end_line; q++) {
            blank = blank && isspace((unsigned char)*q);
        }
        if (!blank) {
            char *q = p;
            for (int64_t c = 0; c < cols && st == TP_OK; c++) {
                char *next;
                errno = 0;
                double v = strtod(q, &next);
                if (next == q || errno != 0 || !isfinite(v)) {
                    st = data_error(err_p, TP_EINVAL,
                                    "%s:%" PRId64 ": column %" PRId64
                                    ": not a number",
                                    path, line, c + 1);
                    break;
                }
                while (*next == ' ' || *next == '\t' || *next == '\r') {
                    next++;
                }
                bool last = c == cols - 1;
                if ((!last && *next != ',') ||
                    (last && next != end_line && *next != '\n' &&
                     *next != '\0')) {
                    st = data_error(err_p, TP_EINVAL,
                                    "%s:%" PRId64 ": %s %" PRId64
                                    " columns (the first row has %" PRId64 ")",
                                    path, line, last ? "more than" : "only",
                                    last ? cols : c + 1, cols);
                    break;
                }
                if (c == 0) {
                    if (v != floor(v) || v < 0 || v > 255) {
                        st = data_error(err_p, TP_EINVAL,
                                        "%s:%" PRId64 ": label %g is not an "
                                        "integer in 0..255",
                                        path, line, v);
                        break;
                    }
                    d->y[r] = (int64_t)v;
                    maxl = d->y[r] > maxl ? d->y[r] : maxl;
                } else {
                    d->x[r * d->dim + c - 1] = (float)v / 255.0f;
                }
                q = next + (last ? 0 : 1);
            }
            r++;
        }
        line++;
        p = e != NULL ? e + 1 : end_line;
    }
    free(text);
    if (st != TP_OK) {
        tr_data_fini(d);
        return st;
    }
    d->nclasses = (int)maxl + 1;
    snprintf(d->name, sizeof(d->name), "%s", path);
    return TP_OK;
}

// ---- synthetic -------------------------------------------------------------

tp_status
tr_synthetic(int64_t n, uint64_t seed, tr_data *d, tp_error **err_p)
{
    enum { SIDE = 28, DIM = SIDE * SIDE, CLASSES = 10 };
    tp_status st = data_alloc(d, n, DIM, err_p);
    if (st != TP_OK) {
        return st;
    }
    // Class prototypes: the same for every seed (one task), so that a
    // test set drawn with another seed is the same problem.
    static float proto[CLASSES][DIM];
    uint64_t ps = 0x5eed;
    for (int c = 0; c < CLASSES; c++) {
        for (int i = 0; i < DIM; i++) {
            proto[c][i] = rng_unit(&ps) < 0.3f ? 0.6f + 0.4f * rng_unit(&ps)
                                               : 0.1f * rng_unit(&ps);
        }
    }
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
    for (int64_t r = 0; r < n; r++) {
        int c = (int)(tr_rng_next(&s) % CLASSES);
        d->y[r] = c;
        for (int i = 0; i < DIM; i++) {
            float v = proto[c][i] + 0.5f * (rng_unit(&s) - 0.5f);
            d->x[r * DIM + i] = v < 0 ? 0 : v > 1 ? 1 : v;
        }
    }
    d->nclasses = CLASSES;
    snprintf(d->name, sizeof(d->name), "synthetic (%" PRId64 " samples)", n);
    return TP_OK;
}

// ---- the data a run uses ---------------------------------------------------

tp_status
tr_data_load(const tr_options *o, tr_data *train_p, tr_data *test_p,
             tp_error **err_p)
{
    tr_data train = {0}, test = {0};
    tp_status st = TP_OK;
    if (o->synthetic > 0) {
        int64_t nt = o->synthetic / 5 > 100 ? o->synthetic / 5 : 100;
        st = tr_synthetic(train_p != NULL ? o->synthetic : 0, 1, &train, err_p);
        if (st == TP_OK) {
            st = tr_synthetic(test_p != NULL ? nt : 0, 2, &test, err_p);
        }
    } else if (o->csv != NULL) {
        st = tr_csv_load(o->csv, &train, err_p);
        if (st == TP_OK && o->test_csv != NULL) {
            st = tr_csv_load(o->test_csv, &test, err_p);
        } else if (st == TP_OK) {
            // No test file: the last tenth of the rows is held out.
            int64_t nt = train.n / 10;
            if (nt == 0) {
                st = data_error(err_p, TP_EINVAL,
                                "%s: too few rows (%" PRId64
                                ") to hold out a tenth as the test set: "
                                "give --test-csv",
                                o->csv, train.n);
            } else if ((st = data_alloc(&test, nt, train.dim, err_p)) ==
                       TP_OK) {
                train.n -= nt;
                memcpy(test.x, train.x + train.n * train.dim,
                       (size_t)(nt * train.dim) * sizeof(float));
                memcpy(test.y, train.y + train.n, (size_t)nt * sizeof(int64_t));
                test.nclasses = train.nclasses;
                snprintf(test.name, sizeof(test.name),
                         "%s (its last %" PRId64 " rows)", o->csv, nt);
            }
        }
    } else {
        const char *dir = o->data_dir != NULL ? o->data_dir : TR_FASHION_DIR;
        struct stat sb;
        if (o->data_dir == NULL && stat(dir, &sb) != 0) {
            return data_error(err_p, TP_ENOENT,
                              "no training data: %s is missing; install "
                              "Fashion-MNIST with `apt-get install "
                              "dataset-fashion-mnist`, or pass --data DIR, "
                              "--csv FILE or --synthetic N",
                              dir);
        }
        if (train_p != NULL) {
            st = idx_load_dir(dir, "train", &train, err_p);
        }
        if (st == TP_OK && test_p != NULL) {
            st = idx_load_dir(dir, "t10k", &test, err_p);
        }
        train.fashion = o->data_dir == NULL;
        test.fashion = o->data_dir == NULL;
    }
    if (st == TP_OK && train.x != NULL && test.x != NULL &&
        train.dim != test.dim) {
        st = data_error(err_p, TP_EINVAL,
                        "%s has %" PRId64
                        " values per sample but %s has %" PRId64,
                        train.name, train.dim, test.name, test.dim);
    }
    if (st != TP_OK) {
        tr_data_fini(&train);
        tr_data_fini(&test);
        return st;
    }
    int nc = train.nclasses > test.nclasses ? train.nclasses : test.nclasses;
    train.nclasses = nc;
    test.nclasses = nc;
    if (train_p != NULL) {
        *train_p = train;
    } else {
        tr_data_fini(&train);
    }
    if (test_p != NULL) {
        *test_p = test;
    } else {
        tr_data_fini(&test);
    }
    return TP_OK;
}

// ---- batches ---------------------------------------------------------------

tp_status
tr_batch(const tr_data *d, const int64_t *idx, int64_t n, tp_tensor **x_p,
         tp_tensor **y_p, tp_error **err_p)
{
    int64_t xs[2] = {n, d->dim};
    tp_tensor *x = NULL, *y = NULL;
    tp_status st = tp_tensor_empty(TP_F32, 2, xs, &x, err_p);
    if (st == TP_OK) {
        st = tp_tensor_empty(TP_I64, 1, &n, &y, err_p);
    }
    if (st != TP_OK) {
        tp_tensor_unref(x);
        return st;
    }
    float *xp = tp_tensor_data(x);
    int64_t *yp = tp_tensor_data(y);
    for (int64_t i = 0; i < n; i++) {
        memcpy(xp + i * d->dim, d->x + idx[i] * d->dim,
               (size_t)d->dim * sizeof(float));
        yp[i] = d->y[idx[i]];
    }
    *x_p = x;
    *y_p = y;
    return TP_OK;
}
