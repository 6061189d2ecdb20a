// SPDX-License-Identifier: Apache-2.0
// data_test.c - tp_train's data.c: IDX parsing of good, truncated and
// corrupt files (every header field), gzip and plain files, CSV rows and
// the synthetic set.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if TR_HAVE_ZLIB
#include <zlib.h>
#endif

#include "tp_test.h"
#include "train.h"

enum { N = 3, R = 2, C = 2 };

static void
put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

// A valid pair of 3 images of 2x2 and their labels.
static void
make_idx(uint8_t *img, size_t *ilen, uint8_t *lab, size_t *llen)
{
    put_be32(img, 0x803);
    put_be32(img + 4, N);
    put_be32(img + 8, R);
    put_be32(img + 12, C);
    for (int i = 0; i < N * R * C; i++) {
        img[16 + i] = (uint8_t)(i * 20);
    }
    *ilen = 16 + N * R * C;
    put_be32(lab, 0x801);
    put_be32(lab + 4, N);
    lab[8] = 2;
    lab[9] = 0;
    lab[10] = 1;
    *llen = 8 + N;
}

// Parses and expects failure with a message containing @want1 and @want2.
static void
expect_fail(const uint8_t *img, size_t ilen, const uint8_t *lab, size_t llen,
            const char *want1, const char *want2)
{
    tr_data d = {0};
    tp_error *err = NULL;
    tp_status st = tr_idx_parse("IMG", img, ilen, "LAB", lab, llen, &d, &err);
    TP_CHECKF(st != TP_OK, "parse succeeded; wanted \"%s\"", want1);
    const char *m = tp_error_message(err);
    TP_CHECKF(strstr(m, want1) != NULL && strstr(m, want2) != NULL,
              "message \"%s\" lacks \"%s\" / \"%s\"", m, want1, want2);
    tp_error_unref(err);
    TP_CHECK(d.x == NULL);
}

static void
test_idx_good(void)
{
    uint8_t img[64], lab[16];
    size_t il, ll;
    make_idx(img, &il, lab, &ll);
    tr_data d = {0};
    tp_error *err = NULL;
    TP_CHECK(tr_idx_parse("IMG", img, il, "LAB", lab, ll, &d, &err) == TP_OK);
    TP_CHECK(d.n == N && d.dim == R * C && d.nclasses == 3);
    TP_CHECK(d.y[0] == 2 && d.y[1] == 0 && d.y[2] == 1);
    TP_CHECK(d.x[0] == 0.0f && d.x[1] == 20.0f / 255.0f);
    TP_CHECK(d.x[N * R * C - 1] == (float)(11 * 20) / 255.0f);
    tr_data_fini(&d);
}

static void
test_idx_bad_headers(void)
{
    uint8_t img[64], lab[16];
    size_t il, ll;
    make_idx(img, &il, lab, &ll);
    // Header shorter than its fields.
    expect_fail(img, 10, lab, ll, "IMG", "truncated IDX header");
    expect_fail(img, il, lab, 5, "LAB", "truncated IDX header");
    // Wrong magics: swapped files, another element type, garbage.
    put_be32(img, 0x801); // a label file's magic
    expect_fail(img, il, lab, ll, "IMG", "0x00000801");
    put_be32(img, 0x0d03); // float32 images
    expect_fail(img, il, lab, ll, "IMG", "type 0x0d");
    put_be32(img, 0x12345678);
    expect_fail(img, il, lab, ll, "IMG", "bad magic");
    make_idx(img, &il, lab, &ll);
    put_be32(lab, 0x803);
    expect_fail(img, il, lab, ll, "LAB", "labels");
    // Zero and absurd sizes.
    make_idx(img, &il, lab, &ll);
    put_be32(img + 4, 0);
    expect_fail(img, il, lab, ll, "IMG", "0 images");
    make_idx(img, &il, lab, &ll);
    put_be32(img + 8, 0);
    expect_fail(img, il, lab, ll, "IMG", "out of range");
    put_be32(img + 8, 100000);
    expect_fail(img, il, lab, ll, "IMG", "out of range");
    make_idx(img, &il, lab, &ll);
    put_be32(img + 4, 0xffffffffu);
    put_be32(img + 8, 4096);
    put_be32(img + 12, 4096);
    expect_fail(img, il, lab, ll, "IMG", "too large");
}

static void
test_idx_sizes(void)
{
    uint8_t img[64], lab[16];
    size_t il, ll;
    make_idx(img, &il, lab, &ll);
    // Truncated data, trailing bytes.
    expect_fail(img, il - 1, lab, ll, "IMG", "truncated");
    expect_fail(img, il + 1, lab, ll, "IMG", "trailing bytes");
    expect_fail(img, il, lab, ll - 1, "LAB", "truncated");
    expect_fail(img, il, lab, ll + 1, "LAB", "trailing bytes");
    // Counts that disagree between the files.
    put_be32(lab + 4, N - 1);
    expect_fail(img, il, lab, ll - 1, "2 labels", "3 images");
}

// Writes @len bytes to a temporary file (gzip-compressed with @gz),
// optionally cut to @cut bytes; returns its path (free()).
static char *
write_tmp(const uint8_t *b, size_t len, bool gz, long cut)
{
    char *path = strdup("/tmp/tp_train_data_test.XXXXXX");
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    if (gz) {
#if TR_HAVE_ZLIB
        gzFile f = gzopen(path, "wb");
        TP_CHECK(f != NULL);
        TP_CHECK(gzwrite(f, b, (unsigned)len) == (int)len);
        TP_CHECK(gzclose(f) == Z_OK);
#endif
    } else {
        FILE *f = fopen(path, "wb");
        TP_CHECK(f != NULL && fwrite(b, 1, len, f) == len);
        fclose(f);
    }
    if (cut >= 0) {
        TP_CHECK(truncate(path, cut) == 0);
    }
    return path;
}

static void
test_idx_files(void)
{
    uint8_t img[64], lab[16];
    size_t il, ll;
    make_idx(img, &il, lab, &ll);
    tp_error *err = NULL;
    tr_data d = {0};
    // Plain files.
    char *pi = write_tmp(img, il, false, -1),
         *pl = write_tmp(lab, ll, false, -1);
    TP_CHECK(tr_idx_load(pi, pl, &d, &err) == TP_OK && d.n == N);
    tr_data_fini(&d);
    // A plain file cut short: named, "truncated".
    char *pt = write_tmp(img, il, false, (long)il - 3);
    TP_CHECK(tr_idx_load(pt, pl, &d, &err) != TP_OK);
    TP_CHECK(strstr(tp_error_message(err), pt) != NULL);
    TP_CHECK(strstr(tp_error_message(err), "truncated") != NULL);
    tp_error_unref(err);
    err = NULL;
    // A missing file.
    TP_CHECK(tr_idx_load("/nonexistent/x-idx3-ubyte", pl, &d, &err) ==
             TP_ENOENT);
    TP_CHECK(strstr(tp_error_message(err), "/nonexistent/x-idx3-ubyte"));
    tp_error_unref(err);
    err = NULL;
#if TR_HAVE_ZLIB
    // gzip files, whole and cut short (a truncated gzip stream).
    char *gi = write_tmp(img, il, true, -1), *gl = write_tmp(lab, ll, true, -1);
    TP_CHECK(tr_idx_load(gi, gl, &d, &err) == TP_OK && d.n == N);
    TP_CHECK(d.y[0] == 2);
    tr_data_fini(&d);
    char *gt = write_tmp(img, il, true, 25);
    TP_CHECK(tr_idx_load(gt, gl, &d, &err) != TP_OK);
    TP_CHECKF(strstr(tp_error_message(err), gt) != NULL, "%s",
              tp_error_message(err));
    tp_error_unref(err);
    err = NULL;
    // Garbage after the gzip magic: corrupt.
    uint8_t junk[64] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    memset(junk + 10, 0xa5, sizeof(junk) - 10);
    char *gj = write_tmp(junk, sizeof(junk), false, -1);
    TP_CHECK(tr_idx_load(gj, gl, &d, &err) != TP_OK);
    TP_CHECKF(strstr(tp_error_message(err), gj) != NULL &&
                  strstr(tp_error_message(err), "gzip") != NULL,
              "%s", tp_error_message(err));
    tp_error_unref(err);
    unlink(gi);
    unlink(gl);
    unlink(gt);
    unlink(gj);
    free(gi);
    free(gl);
    free(gt);
    free(gj);
#endif
    unlink(pi);
    unlink(pl);
    unlink(pt);
    free(pi);
    free(pl);
    free(pt);
}

static void
test_csv(void)
{
    const char *good = "label,p1,p2,p3\n1,0,255,51\n\n0, 10,20,30\r\n3,1,2,3";
    char *p = write_tmp((const uint8_t *)good, strlen(good), false, -1);
    tr_data d = {0};
    tp_error *err = NULL;
    TP_CHECK(tr_csv_load(p, &d, &err) == TP_OK);
    TP_CHECK(d.n == 3 && d.dim == 3 && d.nclasses == 4);
    TP_CHECK(d.y[0] == 1 && d.x[1] == 1.0f && d.x[2] == 0.2f);
    TP_CHECK(d.y[2] == 3);
    tr_data_fini(&d);
    unlink(p);
    free(p);
    static const char *const bad[][2] = {
        {"1,2,3\n1,2\n", ":2: only 2 columns"},
        {"1,2,3\n1,2,3,4\n", ":2: more than 3 columns"},
        {"1,2,x\n", ":1: column 3: not a number"},
        {"300,2,3\n", "label 300"},
        {"1.5,2,3\n", "label 1.5"},
        {"label,a,b\n", "no data rows"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = write_tmp((const uint8_t *)bad[i][0], strlen(bad[i][0]), false, -1);
        TP_CHECKF(tr_csv_load(p, &d, &err) != TP_OK, "case %zu", i);
        TP_CHECKF(strstr(tp_error_message(err), bad[i][1]) != NULL &&
                      strstr(tp_error_message(err), p) != NULL,
                  "case %zu: %s", i, tp_error_message(err));
        tp_error_unref(err);
        err = NULL;
        unlink(p);
        free(p);
    }
}

static void
test_synthetic(void)
{
    tr_data a = {0}, b = {0};
    tp_error *err = NULL;
    TP_CHECK(tr_synthetic(50, 1, &a, &err) == TP_OK);
    TP_CHECK(tr_synthetic(50, 1, &b, &err) == TP_OK);
    TP_CHECK(a.n == 50 && a.dim == 784 && a.nclasses == 10);
    TP_CHECK(memcmp(a.x, b.x, 50 * 784 * sizeof(float)) == 0);
    for (int64_t i = 0; i < 50 * 784; i++) {
        TP_CHECK(a.x[i] >= 0 && a.x[i] <= 1);
    }
    tr_data_fini(&a);
    tr_data_fini(&b);
}

static void
test_missing_package(void)
{
    tr_options o = {.data_dir = "/nonexistent-dir"};
    tr_data tr = {0}, te = {0};
    tp_error *err = NULL;
    TP_CHECK(tr_data_load(&o, &tr, &te, &err) == TP_ENOENT);
    TP_CHECKF(strstr(tp_error_message(err), "/nonexistent-dir") != NULL &&
                  strstr(tp_error_message(err), "train-images-idx3-ubyte"),
              "%s", tp_error_message(err));
    tp_error_unref(err);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_idx_good),
    TP_TEST_CASE(test_idx_bad_headers),
    TP_TEST_CASE(test_idx_sizes),
    TP_TEST_CASE(test_idx_files),
    TP_TEST_CASE(test_csv),
    TP_TEST_CASE(test_synthetic),
    TP_TEST_CASE(test_missing_package),
};

TP_TEST_MAIN(cases)
