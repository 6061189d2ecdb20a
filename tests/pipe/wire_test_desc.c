// SPDX-License-Identifier: Apache-2.0
// wire_test_desc.c - wire_test's cases on the message descriptor
// (pipe/wire.h): round trips at the limits, every truncation, every bound
// + 1, overflowing length sums, the size bound, allocation failures while
// decoding; and tp_message_create/destroy.

#include <tpipe/pipe.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "tp_test.h"
#include "wire_test.h"

// ---- message descriptor ----

static const tp__pipe_limits test_limits = {
    .max_metadata = 4096,
    .max_payloads = 64,
    .max_tensors = 64,
    .max_buf_len = UINT64_C(1) << 40,
};

// A message with @np payloads, @nt tensors, @mlen bytes of metadata and
// per-tensor infos of growing length (wrapping at the bound).
static tp_message *
desc_make(uint32_t np, uint32_t nt, uint64_t mlen, tp__chan_info **infos_p)
{
    tp_message *msg = NULL;
    TP_CHECK_EQ(tp__message_create(np, nt, mlen, &msg), TP_OK);
    for (uint64_t i = 0; i < mlen; i++) {
        ((uint8_t *)msg->metadata)[i] = (uint8_t)(i * 13 + 1);
    }
    for (uint32_t i = 0; i < np; i++) {
        msg->payloads[i].len = (uint64_t)i * 1000 + 1;
    }
    tp__chan_info *infos = NULL;
    if (nt > 0) {
        infos = calloc(nt, sizeof(*infos));
        TP_CHECK(infos != NULL);
    }
    for (uint32_t i = 0; i < nt; i++) {
        msg->tensors[i].len = (UINT64_C(1) << 40) - i;
        infos[i].ci_len = (uint8_t)(i % (TP_WIRE_MAX_CHAN_INFO + 1));
        for (unsigned k = 0; k < infos[i].ci_len; k++) {
            infos[i].ci_bytes[k] = (uint8_t)(i + k);
        }
    }
    *infos_p = infos;
    return msg;
}

static void
desc_check_equal(const tp_message *a, const tp__chan_info *ai,
                 const tp_message *b, const tp__chan_info *bi)
{
    TP_CHECK_EQ(a->metadata_len, b->metadata_len);
    TP_CHECK_EQ(a->npayloads, b->npayloads);
    TP_CHECK_EQ(a->ntensors, b->ntensors);
    if (a->metadata_len > 0) {
        TP_CHECK(memcmp(a->metadata, b->metadata, a->metadata_len) == 0);
    } else {
        TP_CHECK(b->metadata == NULL);
    }
    for (uint32_t i = 0; i < a->npayloads; i++) {
        TP_CHECK(a->payloads[i].len == b->payloads[i].len);
        TP_CHECK(b->payloads[i].data == NULL);
        TP_CHECK(!b->payloads[i].pipe_owned);
    }
    for (uint32_t i = 0; i < a->ntensors; i++) {
        TP_CHECK(a->tensors[i].len == b->tensors[i].len);
        TP_CHECK(b->tensors[i].data == NULL);
        TP_CHECK_EQ(b->tensors[i].device.type, TP_DEVICE_CPU);
        TP_CHECK_EQ(b->tensors[i].device.index, 0);
        uint8_t l = ai != NULL ? ai[i].ci_len : 0;
        TP_CHECK_EQ(bi[i].ci_len, l);
        if (l > 0) {
            TP_CHECK(memcmp(ai[i].ci_bytes, bi[i].ci_bytes, l) == 0);
        }
    }
}

static uint8_t *
desc_encode_new(const tp_message *msg, const tp__chan_info *infos,
                uint64_t *size_p)
{
    uint64_t size = tp__desc_size(msg, infos);
    TP_CHECK(size >= 16);
    uint8_t *buf = malloc((size_t)size + 1);
    TP_CHECK(buf != NULL);
    TP_CHECK_EQ(tp__desc_encode(msg, infos, buf, size - 1), 0);
    TP_CHECK_EQ(tp__desc_encode(msg, infos, buf, size + 1), size);
    *size_p = size;
    return buf;
}

static void
desc_round_trip_one(uint32_t np, uint32_t nt, uint64_t mlen,
                    const tp__pipe_limits *lim)
{
    tp__chan_info *infos;
    tp_message *msg = desc_make(np, nt, mlen, &infos);
    uint64_t size;
    uint8_t *buf = desc_encode_new(msg, infos, &size);
    TP_CHECK(size <= tp__desc_max_size(lim));

    tp_message *got = NULL;
    tp__chan_info *got_infos = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__desc_decode(buf, size, lim, &got, &got_infos, &err), err);
    desc_check_equal(msg, infos, got, got_infos);
    if (nt == 0) {
        TP_CHECK(got_infos == NULL);
    }
    // The decoded message is the caller's: the pipe fills the buffers.
    for (uint32_t i = 0; i < got->npayloads; i++) {
        got->payloads[i].data = tp__alloc(16);
        got->payloads[i].pipe_owned = true;
    }
    tp_message_destroy(got);
    tp__free(got_infos);
    // infos_p may be NULL.
    TP_CHECK_OK(tp__desc_decode(buf, size, lim, &got, NULL, &err), err);
    tp_message_destroy(got);
    free(buf);
    free(infos);
    tp_message_destroy(msg);
}

void
desc_round_trips(void)
{
    desc_round_trip_one(0, 0, 0, &test_limits); // empty: the 16-byte header
    desc_round_trip_one(1, 0, 0, &test_limits);
    desc_round_trip_one(0, 1, 0, &test_limits);
    desc_round_trip_one(0, 0, 1, &test_limits);
    desc_round_trip_one(3, 5, 100, &test_limits);
    // Every count and the metadata at the limits, infos up to 32 bytes.
    desc_round_trip_one(test_limits.max_payloads, test_limits.max_tensors,
                        test_limits.max_metadata, &test_limits);

    // Buffers at max_buf_len, and a message of 0-length buffers.
    tp__pipe_limits lim = test_limits;
    lim.max_buf_len = UINT64_MAX / 4;
    tp_message *msg = NULL;
    TP_CHECK_EQ(tp_message_create(2, 2, &msg), TP_OK);
    for (int i = 0; i < 2; i++) {
        msg->payloads[i].len = lim.max_buf_len;
        msg->tensors[i].len = lim.max_buf_len;
    }
    uint64_t size;
    uint8_t *buf = desc_encode_new(msg, NULL, &size);
    TP_CHECK_EQ(size, 16 + 2 * 8 + 2 * 11);
    tp_message *got = NULL;
    tp__chan_info *gi = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__desc_decode(buf, size, &lim, &got, &gi, &err), err);
    desc_check_equal(msg, NULL, got, gi);
    tp_message_destroy(got);
    tp__free(gi);
    free(buf);
    tp_message_destroy(msg);
    check_no_leaks();
}

void
desc_encode_refuses_bad_fields(void)
{
    tp__chan_info *infos;
    uint8_t buf[256];
    tp_message *msg = desc_make(1, 2, 4, &infos);
    infos[1].ci_len = TP_WIRE_MAX_CHAN_INFO + 1;
    TP_CHECK_EQ(tp__desc_size(msg, infos), 0);
    TP_CHECK_EQ(tp__desc_encode(msg, infos, buf, sizeof(buf)), 0);
    infos[1].ci_len = TP_WIRE_MAX_CHAN_INFO;
    TP_CHECK(tp__desc_encode(msg, infos, buf, sizeof(buf)) > 0);
    void *md = msg->metadata;
    msg->metadata = NULL;
    TP_CHECK_EQ(tp__desc_encode(msg, infos, buf, sizeof(buf)), 0);
    msg->metadata = md;
    tp_msg_buf *t = msg->tensors;
    msg->tensors = NULL;
    TP_CHECK_EQ(tp__desc_encode(msg, infos, buf, sizeof(buf)), 0);
    msg->tensors = t;
    // NULL infos: every tensor has empty channel info.
    TP_CHECK_EQ(tp__desc_size(msg, NULL), 16 + 8 + 2 * 11 + 4);
    free(infos);
    tp_message_destroy(msg);
    check_no_leaks();
}

void
desc_every_truncation_fails(void)
{
    tp__chan_info *infos;
    tp_message *msg = desc_make(5, 40, 300, &infos);
    uint64_t size;
    uint8_t *buf = desc_encode_new(msg, infos, &size);
    tp_error *err = NULL;
    for (uint64_t n = 0; n < size; n++) {
        tp_message *got = (tp_message *)(uintptr_t)1;
        tp__chan_info *gi = (tp__chan_info *)(uintptr_t)1;
        EXPECT_PROTO(tp__desc_decode(buf, n, &test_limits, &got, &gi, &err),
                     err, "descriptor: truncated at byte");
        // Outputs are set only on success.
        TP_CHECK(got == (tp_message *)(uintptr_t)1);
        TP_CHECK(gi == (tp__chan_info *)(uintptr_t)1);
    }
    tp_message *got = NULL;
    EXPECT_PROTO(tp__desc_decode(buf, size - 1, &test_limits, &got, NULL, &err),
                 err, "(metadata, need 1 more bytes)");
    EXPECT_PROTO(
        tp__desc_decode(buf, 16 + 5 * 8 + 3, &test_limits, &got, NULL, &err),
        err, "(payload and tensor table, need");
    buf[size] = 0;
    EXPECT_PROTO(tp__desc_decode(buf, size + 1, &test_limits, &got, NULL, &err),
                 err, "descriptor: 1 trailing bytes after byte");
    free(buf);
    free(infos);
    tp_message_destroy(msg);
    check_no_leaks();
}

// A descriptor built by hand: header, then @np payload lengths of @plen,
// then @nt tensors of @tlen with @dev (index 0) and @info_len, then @mlen
// bytes.
static void
raw_desc(raw *r, uint64_t mlen, uint32_t np, uint32_t nt, uint64_t plen,
         uint64_t tlen, unsigned dev, unsigned info_len)
{
    r->n = 0;
    raw_u64(r, mlen);
    raw_u32(r, np);
    raw_u32(r, nt);
    for (uint32_t i = 0; i < np; i++) {
        raw_u64(r, plen);
    }
    for (uint32_t i = 0; i < nt; i++) {
        raw_u64(r, tlen);
        raw_u8(r, dev);
        raw_u8(r, 0); // device index
        raw_u8(r, info_len);
        for (unsigned k = 0; k < info_len; k++) {
            raw_u8(r, k);
        }
    }
    for (uint64_t i = 0; i < mlen; i++) {
        raw_u8(r, (unsigned)i);
    }
}

#define EXPECT_DESC_PROTO(lim, needle)                                         \
    do {                                                                       \
        tp_message *m_ = NULL;                                                 \
        tp__chan_info *i_ = NULL;                                              \
        tp_error *e_ = NULL;                                                   \
        EXPECT_PROTO(tp__desc_decode(rb.b, rb.n, (lim), &m_, &i_, &e_), e_,    \
                     (needle));                                                \
        TP_CHECK(m_ == NULL && i_ == NULL);                                    \
    } while (0)

#define EXPECT_DESC_OK(lim)                                                    \
    do {                                                                       \
        tp_message *m_ = NULL;                                                 \
        tp__chan_info *i_ = NULL;                                              \
        tp_error *e_ = NULL;                                                   \
        TP_CHECK_OK(tp__desc_decode(rb.b, rb.n, (lim), &m_, &i_, &e_), e_);    \
        tp_message_destroy(m_);                                                \
        tp__free(i_);                                                          \
    } while (0)

void
desc_rejects_each_bound_plus_one(void)
{
    tp__pipe_limits lim = {.max_metadata = 100,
                           .max_payloads = 4,
                           .max_tensors = 5,
                           .max_buf_len = 1000};
    raw_desc(&rb, 100, 4, 5, 1000, 1000, 0, TP_WIRE_MAX_CHAN_INFO);
    EXPECT_DESC_OK(&lim);

    raw_desc(&rb, 101, 0, 0, 0, 0, 0, 0);
    EXPECT_DESC_PROTO(&lim, "descriptor: metadata length 101 exceeds the "
                            "limit 100 (TP_PIPE_MAX_METADATA)");
    raw_desc(&rb, 0, 5, 0, 1, 0, 0, 0);
    EXPECT_DESC_PROTO(&lim, "descriptor: payload count 5 exceeds the limit 4 "
                            "(TP_PIPE_MAX_PAYLOADS)");
    raw_desc(&rb, 0, 0, 6, 0, 1, 0, 0);
    EXPECT_DESC_PROTO(&lim, "descriptor: tensor count 6 exceeds the limit 5 "
                            "(TP_PIPE_MAX_TENSORS)");
    raw_desc(&rb, 0, 1, 0, 1001, 0, 0, 0);
    EXPECT_DESC_PROTO(&lim, "descriptor: payload 0 length 1001 exceeds the "
                            "limit 1000 (TP_PIPE_MAX_BUF_BYTES)");
    raw_desc(&rb, 0, 0, 4, 0, 1000, 0, 0);
    tp__put_u64le(rb.b + 16 + 3 * 11, 9999999999u); // tensor 3
    EXPECT_DESC_PROTO(&lim, "descriptor: tensor 3 length 9999999999 exceeds "
                            "the limit 1000 (TP_PIPE_MAX_BUF_BYTES)");
    raw_desc(&rb, 0, 0, 1, 0, 1, 0, TP_WIRE_MAX_CHAN_INFO + 1);
    EXPECT_DESC_PROTO(&lim, "descriptor: tensor 0 channel info length 161 "
                            "exceeds the limit 160");
    raw_desc(&rb, 0, 0, 2, 0, 1, 2, 0);
    EXPECT_DESC_PROTO(&lim, "descriptor: tensor 0 device type 2 is not "
                            "supported (0 cpu, 1 cuda, 129 cuda staged)");
    // Bit 7 (staged) on a cpu tensor.
    raw_desc(&rb, 0, 0, 1, 0, 1, 0x80, 0);
    EXPECT_DESC_PROTO(&lim, "descriptor: tensor 0 device type 128 is not "
                            "supported");
    raw_desc(&rb, 0, 0, 1, 0, 1, TP_DEVICE_CPU, 0);
    rb.b[16 + 9] = 3; // cpu with index 3
    EXPECT_DESC_PROTO(&lim, "descriptor: tensor 0 cpu device index 3 is not 0");
    raw_desc(&rb, 0, 0, 1, 0, 1, TP_DEVICE_CUDA, 0);
    rb.b[16 + 9] = 7; // cuda:7, the sender's device
    {
        tp_message *m_ = NULL;
        tp__chan_info *i_ = NULL;
        tp_error *e_ = NULL;
        TP_CHECK_OK(tp__desc_decode(rb.b, rb.n, &lim, &m_, &i_, &e_), e_);
        TP_CHECK_EQ(m_->tensors[0].device.type, TP_DEVICE_CUDA);
        TP_CHECK_EQ(m_->tensors[0].device.index, 7);
        TP_CHECK_EQ(i_[0].ci_flags, 0);
        tp_message_destroy(m_);
        tp__free(i_);
    }
    // A cuda tensor staged although there is a device channel: 0x81.
    raw_desc(&rb, 0, 0, 1, 0, 1, 0x81, 0);
    {
        tp_message *m_ = NULL;
        tp__chan_info *i_ = NULL;
        tp_error *e_ = NULL;
        TP_CHECK_OK(tp__desc_decode(rb.b, rb.n, &lim, &m_, &i_, &e_), e_);
        TP_CHECK_EQ(m_->tensors[0].device.type, TP_DEVICE_CUDA);
        TP_CHECK_EQ(i_[0].ci_flags, TP_CHAN_INFO_STAGED);
        // And back: the flag is encoded into the same byte.
        uint8_t out[64];
        TP_CHECK_EQ(tp__desc_encode(m_, i_, out, sizeof(out)), rb.n);
        TP_CHECK(memcmp(out, rb.b, rb.n) == 0);
        tp_message_destroy(m_);
        tp__free(i_);
    }
    raw_desc(&rb, 0, 0, 1, 0, 1, 255, 0);
    EXPECT_DESC_PROTO(&lim, "device type 255");

    // Counts at UINT32_MAX with no table behind them: refused before any
    // loop or allocation.
    lim.max_payloads = UINT32_MAX;
    lim.max_tensors = UINT32_MAX;
    raw_desc(&rb, 0, 0, 0, 0, 0, 0, 0);
    tp__put_u32le(rb.b + 8, UINT32_MAX);
    tp__put_u32le(rb.b + 12, UINT32_MAX);
    EXPECT_DESC_PROTO(&lim, "(payload and tensor table, need 81604378605 more");
    // Metadata length near 2^64 with a huge limit: a truncation.
    lim.max_metadata = UINT64_MAX;
    raw_desc(&rb, 0, 0, 0, 0, 0, 0, 0);
    tp__put_u64le(rb.b, UINT64_MAX);
    EXPECT_DESC_PROTO(&lim, "(metadata, need 18446744073709551615 more");
    check_no_leaks();
}

void
desc_rejects_overflowing_sums(void)
{
    tp__pipe_limits lim = {.max_metadata = 0,
                           .max_payloads = 4,
                           .max_tensors = 4,
                           .max_buf_len = UINT64_MAX};
    // Three payloads of 2^63: the second brings the sum to 2^64.
    raw_desc(&rb, 0, 3, 0, UINT64_C(1) << 63, 0, 0, 0);
    EXPECT_DESC_PROTO(&lim, "descriptor: payload 1 length 9223372036854775808"
                            ": the total length of the message overflows");
    // Payload + tensor.
    raw_desc(&rb, 0, 1, 1, UINT64_MAX, 1, 0, 0);
    EXPECT_DESC_PROTO(&lim, "tensor 0 length 1: the total length");
    // Just fitting is fine.
    raw_desc(&rb, 0, 1, 1, UINT64_MAX - 1, 1, 0, 0);
    EXPECT_DESC_OK(&lim);
    check_no_leaks();
}

void
desc_max_size_saturates(void)
{
    TP_CHECK_EQ(tp__desc_max_size(&test_limits),
                16 + 64 * 8 + 64 * (11 + 160) + 4096);
    tp__pipe_limits zero = {0};
    TP_CHECK_EQ(tp__desc_max_size(&zero), 16);
    tp__pipe_limits big = {.max_metadata = UINT64_MAX - 10,
                           .max_payloads = UINT32_MAX,
                           .max_tensors = UINT32_MAX,
                           .max_buf_len = UINT64_MAX};
    TP_CHECK(tp__desc_max_size(&big) == UINT64_MAX);
    big.max_metadata = 0;
    TP_CHECK(tp__desc_max_size(&big) ==
             16 + (uint64_t)UINT32_MAX * 8 + (uint64_t)UINT32_MAX * 171);
}

// Decoding bad input allocates nothing (with err_p NULL, not even the
// error), and an allocation failure while decoding good input fails
// cleanly with TP_ENOMEM and leaks nothing (ASan checks).
void
desc_decode_allocation(void)
{
#if TP_HAVE_TEST_FAULTS
    tp__pipe_limits lim = test_limits;
    lim.max_payloads = UINT32_MAX;
    lim.max_tensors = UINT32_MAX;
    raw_desc(&rb, 0, 0, 0, 0, 0, 0, 0);
    tp__put_u32le(rb.b + 8, UINT32_MAX);
    tp__alloc_fail_after(0);
    tp_message *got = NULL;
    TP_CHECK_EQ(tp__desc_decode(rb.b, rb.n, &lim, &got, NULL, NULL), TP_EPROTO);
    TP_CHECK_EQ(tp__alloc_fail_after(0), 0);

    tp__chan_info *infos;
    tp_message *msg = desc_make(3, 4, 50, &infos);
    uint64_t size;
    uint8_t *buf = desc_encode_new(msg, infos, &size);
    for (long nth = 1;; nth++) {
        tp__chan_info *gi = NULL;
        tp_error *err = NULL;
        got = NULL;
        tp__alloc_fail_after(nth);
        tp_status st = tp__desc_decode(buf, size, &lim, &got, &gi, &err);
        tp__alloc_fail_after(0);
        if (st == TP_OK) {
            TP_CHECK(nth > 2); // the message and the infos
            desc_check_equal(msg, infos, got, gi);
            tp_message_destroy(got);
            tp__free(gi);
            break;
        }
        TP_CHECK_EQ(st, TP_ENOMEM);
        TP_CHECK(got == NULL && gi == NULL);
        TP_CHECK_EQ(tp_error_status(err), TP_ENOMEM);
        tp_error_unref(err);
        TP_CHECK(nth < 10);
    }
    free(buf);
    free(infos);
    tp_message_destroy(msg);
    check_no_leaks();
#else
    tp_test_skip("built without TP_TEST_FAULTS");
#endif
}

// ---- tp_message ----

void
message_create_destroy(void)
{
    tp_message *msg = NULL;
    TP_CHECK_EQ(tp_message_create(0, 0, &msg), TP_OK);
    TP_CHECK(msg->payloads == NULL && msg->tensors == NULL);
    TP_CHECK(msg->metadata == NULL && msg->metadata_len == 0);
    tp_message_destroy(msg);
    tp_message_destroy(NULL);
    TP_CHECK_EQ(tp_message_create(1, 1, NULL), TP_EINVAL);

    TP_CHECK_EQ(tp_message_create(3, 1000, &msg), TP_OK);
    TP_CHECK_EQ(msg->npayloads, 3);
    TP_CHECK_EQ(msg->ntensors, 1000);
    for (uint32_t i = 0; i < 3; i++) {
        TP_CHECK(msg->payloads[i].data == NULL);
        TP_CHECK_EQ(msg->payloads[i].len, 0);
        TP_CHECK(!msg->payloads[i].pipe_owned);
        TP_CHECK_EQ(msg->payloads[i].device.type, TP_DEVICE_CPU);
        TP_CHECK_EQ((uintptr_t)&msg->payloads[i] % _Alignof(tp_msg_buf), 0);
    }
    for (uint32_t i = 0; i < 1000; i++) {
        TP_CHECK(msg->tensors[i].data == NULL);
        TP_CHECK_EQ(msg->tensors[i].len, 0);
        TP_CHECK_EQ(msg->tensors[i].device.type, TP_DEVICE_CPU);
        TP_CHECK_EQ(msg->tensors[i].device.index, 0);
    }
    // Writable, disjoint arrays.
    msg->payloads[2].len = 5;
    msg->tensors[0].len = 6;
    TP_CHECK_EQ(msg->payloads[2].len, 5);
    // Pipe-owned buffers are freed, the caller's are not.
    static char mine[8];
    msg->payloads[0].data = tp__alloc(100);
    msg->payloads[0].pipe_owned = true;
    msg->payloads[1].data = mine;
    msg->tensors[999].data = tp__alloc(1);
    msg->tensors[999].pipe_owned = true;
    // The caller may point metadata at its own memory: not freed.
    msg->metadata = mine;
    msg->metadata_len = sizeof(mine);
    tp_message_destroy(msg);
    check_no_leaks();
}

void
message_owned_metadata(void)
{
    tp_message *msg = NULL;
    TP_CHECK_EQ(tp__message_create(2, 0, 1000, &msg), TP_OK);
    TP_CHECK(msg->metadata != NULL);
    TP_CHECK_EQ(msg->metadata_len, 1000);
    TP_CHECK(msg->tensors == NULL);
    memset(msg->metadata, 0xab, 1000);
    // Repointing the metadata does not make destroy free the wrong thing.
    static char other[4];
    msg->metadata = other;
    tp_message_destroy(msg);

    TP_CHECK_EQ(tp__message_create(0, 0, 0, &msg), TP_OK);
    TP_CHECK(msg->metadata == NULL);
    tp_message_destroy(msg);
    // Sizes beyond memory fail instead of wrapping.
    msg = NULL;
    TP_CHECK_EQ(tp__message_create(1, 1, UINT64_MAX - 8, &msg), TP_ENOMEM);
    TP_CHECK(msg == NULL);
#if TP_HAVE_TEST_FAULTS
    tp__alloc_fail_after(1);
    TP_CHECK_EQ(tp_message_create(1, 1, &msg), TP_ENOMEM);
    tp__alloc_fail_after(0);
    TP_CHECK(msg == NULL);
#endif
    check_no_leaks();
}
