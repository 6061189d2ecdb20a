// SPDX-License-Identifier: Apache-2.0
// wire_test.c - the pipe's wire format (pipe/wire.h): round trips of every
// body kind (empty, typical, every count and string at its bound), and
// rejection of malformed input: every truncation point of a valid
// encoding, every bound + 1, NUL inside strings, trailing bytes, bad frame
// headers, overflowing length sums. Also tp_message_create/destroy and the
// decoders' behaviour when allocations fail.

#include <tpipe/pipe.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "tp_test.h"

// The harness ends each case with _exit, which skips LeakSanitizer's
// exit-time check: cases that allocate call check_no_leaks at their end.
#if defined(__SANITIZE_ADDRESS__)
#define WIRE_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WIRE_TEST_LSAN 1
#endif
#endif
#ifdef WIRE_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

static void
check_no_leaks(void)
{
#ifdef WIRE_TEST_LSAN
    TP_CHECKF(__lsan_do_recoverable_leak_check() == 0, "memory leaked");
#endif
}

// Checks a decoder failed with TP_EPROTO and a message naming @needle.
#define EXPECT_PROTO(st, err, needle)                                          \
    do {                                                                       \
        tp_status s_ = (st);                                                   \
        TP_CHECKF(s_ == TP_EPROTO, "status %s, expected TP_EPROTO",            \
                  tp_status_name(s_));                                         \
        TP_CHECK((err) != NULL);                                               \
        TP_CHECK_EQ(tp_error_status(err), TP_EPROTO);                          \
        TP_CHECK_STR_CONTAINS(tp_error_message(err), (needle));                \
        tp_error_unref(err);                                                   \
        (err) = NULL;                                                          \
    } while (0)

// ---- a raw byte builder for hand-made (often malformed) bodies ----

typedef struct raw {
    uint8_t b[1 << 17];
    size_t n;
} raw;

static void
raw_u8(raw *r, unsigned v)
{
    TP_CHECK(r->n + 1 <= sizeof(r->b));
    r->b[r->n++] = (uint8_t)v;
}

static void
raw_u16(raw *r, unsigned v)
{
    TP_CHECK(r->n + 2 <= sizeof(r->b));
    tp__put_u16le(r->b + r->n, (uint16_t)v);
    r->n += 2;
}

static void
raw_u32(raw *r, uint32_t v)
{
    TP_CHECK(r->n + 4 <= sizeof(r->b));
    tp__put_u32le(r->b + r->n, v);
    r->n += 4;
}

static void
raw_u64(raw *r, uint64_t v)
{
    TP_CHECK(r->n + 8 <= sizeof(r->b));
    tp__put_u64le(r->b + r->n, v);
    r->n += 8;
}

// A string of @n bytes with a @width-byte length prefix (the bytes are
// 'a'.. unless @s is given).
static void
raw_str(raw *r, int width, const char *s, size_t n)
{
    if (width == 1) {
        raw_u8(r, (unsigned)n);
    } else {
        raw_u16(r, (unsigned)n);
    }
    for (size_t i = 0; i < n; i++) {
        raw_u8(r, s != NULL ? (uint8_t)s[i] : (uint8_t)('a' + i % 26));
    }
}

// Fills @dst (capacity @cap) with @n non-NUL bytes, including high ones.
static void
fill_str(char *dst, size_t cap, size_t n, unsigned seed)
{
    TP_CHECK(n < cap);
    for (size_t i = 0; i < n; i++) {
        dst[i] = (char)(1 + (seed * 31 + i * 7) % 255);
    }
    dst[n] = '\0';
}

// ---- frame header ----

static void
frame_hdr_round_trip(void)
{
    for (unsigned type = TP_FRAME_BROCHURE; type <= TP_FRAME_ACK; type++) {
        tp__frame_hdr h = {(uint8_t)type, TP_PIPE_WIRE_VERSION, 0xdeadbeefu,
                           UINT64_C(0x0123456789abcdef)};
        uint8_t out[TP_FRAME_HDR_LEN];
        tp__frame_hdr_encode(out, &h);
        TP_CHECK_EQ(out[0], type);
        TP_CHECK_EQ(out[1], TP_PIPE_WIRE_VERSION);
        TP_CHECK_EQ(out[2], 0);
        TP_CHECK_EQ(out[3], 0);
        TP_CHECK_EQ(tp__get_u32le(out + 4), 0xdeadbeefu);
        TP_CHECK(tp__get_u64le(out + 8) == UINT64_C(0x0123456789abcdef));
        tp__frame_hdr d;
        tp_error *err = NULL;
        TP_CHECK_OK(tp__frame_hdr_decode(out, &d, &err), err);
        TP_CHECK_EQ(d.fh_type, type);
        TP_CHECK_EQ(d.fh_version, TP_PIPE_WIRE_VERSION);
        TP_CHECK_EQ(d.fh_aux, 0xdeadbeefu);
        TP_CHECK(d.fh_body_len == UINT64_C(0x0123456789abcdef));
    }
}

static void
frame_hdr_rejects(void)
{
    tp__frame_hdr h = {TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, 0, 10};
    uint8_t good[TP_FRAME_HDR_LEN];
    uint8_t bad[TP_FRAME_HDR_LEN];
    tp__frame_hdr_encode(good, &h);
    tp__frame_hdr d = {0};
    tp_error *err = NULL;

    static const unsigned versions[] = {0, 1, 2, 4,
                                        255}; // 2: no device channel
    for (size_t i = 0; i < TP_ARRAY_LEN(versions); i++) {
        memcpy(bad, good, sizeof(bad));
        bad[1] = (uint8_t)versions[i];
        EXPECT_PROTO(tp__frame_hdr_decode(bad, &d, &err), err, "version");
    }
    static const unsigned types[] = {0, 6, 255};
    for (size_t i = 0; i < TP_ARRAY_LEN(types); i++) {
        memcpy(bad, good, sizeof(bad));
        bad[0] = (uint8_t)types[i];
        EXPECT_PROTO(tp__frame_hdr_decode(bad, &d, &err), err, "type");
    }
    for (int at = 2; at <= 3; at++) {
        memcpy(bad, good, sizeof(bad));
        bad[at] = 1;
        EXPECT_PROTO(tp__frame_hdr_decode(bad, &d, &err), err, "reserved");
    }
    // Nothing was written on failure; a NULL err_p is fine.
    TP_CHECK_EQ(d.fh_type, 0);
    memcpy(bad, good, sizeof(bad));
    bad[1] = 9;
    TP_CHECK_EQ(tp__frame_hdr_decode(bad, &d, NULL), TP_EPROTO);
    check_no_leaks();
}

// ---- brochure ----

static tp__brochure brochure_in;
static tp__brochure brochure_out;
static uint8_t body[1 << 17];

static void
brochure_typical(tp__brochure *b)
{
    memset(b, 0, sizeof(*b));
    strcpy(b->b_ctxname, "worker0");
    b->b_ntransports = 2;
    strcpy(b->b_transports[0].be_name, "shm");
    strcpy(b->b_transports[0].be_domain, "boot-id:1234");
    strcpy(b->b_transports[0].be_addr, "shm://tpipe-1");
    strcpy(b->b_transports[1].be_name, "tcp");
    strcpy(b->b_transports[1].be_addr, "tcp://127.0.0.1:5000");
    b->b_nchannels = 3;
    strcpy(b->b_channels[0].be_name, "cma");
    strcpy(b->b_channels[0].be_domain, "host:abc/uid:0");
    strcpy(b->b_channels[1].be_name, "mpt");
    strcpy(b->b_channels[2].be_name, "basic");
}

static void
brochure_max(tp__brochure *b)
{
    memset(b, 0, sizeof(*b));
    fill_str(b->b_ctxname, sizeof(b->b_ctxname), TP_WIRE_MAX_CTXNAME, 1);
    b->b_ntransports = TP_WIRE_MAX_BACKENDS;
    b->b_nchannels = TP_WIRE_MAX_BACKENDS;
    for (unsigned i = 0; i < TP_WIRE_MAX_BACKENDS; i++) {
        tp__brochure_entry *t = &b->b_transports[i];
        fill_str(t->be_name, sizeof(t->be_name), TP_WIRE_MAX_NAME, i);
        fill_str(t->be_domain, sizeof(t->be_domain), TP_WIRE_MAX_DOMAIN, i + 1);
        fill_str(t->be_addr, sizeof(t->be_addr), TP_WIRE_MAX_ADDR, i + 2);
        tp__brochure_entry *c = &b->b_channels[i];
        fill_str(c->be_name, sizeof(c->be_name), TP_WIRE_MAX_NAME, i + 3);
        fill_str(c->be_domain, sizeof(c->be_domain), TP_WIRE_MAX_DOMAIN, i + 4);
    }
}

static size_t
brochure_round_trip_one(const tp__brochure *b)
{
    size_t size = tp__brochure_size(b);
    TP_CHECK(size > 0);
    TP_CHECK(size <= TP_WIRE_MAX_HANDSHAKE);
    // One byte short: nothing written.
    TP_CHECK_EQ(tp__brochure_encode(b, body, size - 1), 0);
    TP_CHECK_EQ(tp__brochure_encode(b, body, sizeof(body)), size);
    tp_error *err = NULL;
    memset(&brochure_out, 0x55, sizeof(brochure_out));
    TP_CHECK_OK(tp__brochure_decode(body, size, &brochure_out, &err), err);
    TP_CHECK(memcmp(b, &brochure_out, sizeof(*b)) == 0);
    return size;
}

static void
brochure_round_trips(void)
{
    // Empty: no backends, empty name.
    memset(&brochure_in, 0, sizeof(brochure_in));
    TP_CHECK_EQ(brochure_round_trip_one(&brochure_in), 5);
    brochure_typical(&brochure_in);
    brochure_round_trip_one(&brochure_in);
    TP_CHECK(strcmp(brochure_out.b_transports[1].be_addr,
                    "tcp://127.0.0.1:5000") == 0);
    TP_CHECK(strcmp(brochure_out.b_channels[2].be_name, "basic") == 0);
    TP_CHECK_EQ(brochure_out.b_channels[0].be_addr[0], 0);
    brochure_max(&brochure_in);
    size_t size = brochure_round_trip_one(&brochure_in);
    TP_CHECK_EQ(
        size,
        5 + TP_WIRE_MAX_CTXNAME +
            TP_WIRE_MAX_BACKENDS *
                (5 + TP_WIRE_MAX_NAME + TP_WIRE_MAX_DOMAIN + TP_WIRE_MAX_ADDR) +
            TP_WIRE_MAX_BACKENDS * (3 + TP_WIRE_MAX_NAME + TP_WIRE_MAX_DOMAIN));
}

static void
brochure_encode_refuses_bad_fields(void)
{
    brochure_typical(&brochure_in);
    brochure_in.b_ntransports = TP_WIRE_MAX_BACKENDS + 1;
    TP_CHECK_EQ(tp__brochure_size(&brochure_in), 0);
    TP_CHECK_EQ(tp__brochure_encode(&brochure_in, body, sizeof(body)), 0);
    brochure_typical(&brochure_in);
    brochure_in.b_nchannels = TP_WIRE_MAX_BACKENDS + 1;
    TP_CHECK_EQ(tp__brochure_encode(&brochure_in, body, sizeof(body)), 0);
    // A string not terminated inside its array breaks its bound.
    brochure_typical(&brochure_in);
    memset(brochure_in.b_transports[1].be_name, 'x',
           sizeof(brochure_in.b_transports[1].be_name));
    TP_CHECK_EQ(tp__brochure_encode(&brochure_in, body, sizeof(body)), 0);
    brochure_typical(&brochure_in);
    memset(brochure_in.b_ctxname, 'x', sizeof(brochure_in.b_ctxname));
    TP_CHECK_EQ(tp__brochure_encode(&brochure_in, body, sizeof(body)), 0);
    brochure_typical(&brochure_in);
    memset(brochure_in.b_channels[2].be_domain, 'x',
           sizeof(brochure_in.b_channels[2].be_domain));
    TP_CHECK_EQ(tp__brochure_encode(&brochure_in, body, sizeof(body)), 0);
}

static void
brochure_every_truncation_fails(void)
{
    tp_error *err = NULL;
    brochure_max(&brochure_in);
    size_t size = tp__brochure_encode(&brochure_in, body, sizeof(body));
    TP_CHECK(size > 0);
    for (size_t n = 0; n < size; n++) {
        memset(&brochure_out, 0x55, sizeof(brochure_out));
        EXPECT_PROTO(tp__brochure_decode(body, n, &brochure_out, &err), err,
                     "brochure: truncated at byte");
        // The output is left zeroed, not half-decoded.
        TP_CHECK_EQ(brochure_out.b_ntransports, 0);
        TP_CHECK_EQ(brochure_out.b_ctxname[0], 0);
    }
    // A message names the field.
    EXPECT_PROTO(tp__brochure_decode(
                     body, 5 + TP_WIRE_MAX_CTXNAME + 1 + TP_WIRE_MAX_NAME + 10,
                     &brochure_out, &err),
                 err, "(transport 0 domain, need ");
    // Trailing bytes.
    body[size] = 0;
    EXPECT_PROTO(tp__brochure_decode(body, size + 1, &brochure_out, &err), err,
                 "1 trailing bytes");
    // NULL input with length 0 is a truncation, not a crash.
    EXPECT_PROTO(tp__brochure_decode(NULL, 0, &brochure_out, &err), err,
                 "transport count");
    check_no_leaks();
}

// Writes a brochure body with one transport and one channel; each
// argument is a length (the bytes are filled in), so callers can push one
// past its bound.
static void
raw_brochure(raw *r, unsigned nt, unsigned nc, size_t ctx, size_t tname,
             size_t tdom, size_t taddr, size_t cname, size_t cdom)
{
    r->n = 0;
    raw_u16(r, nt);
    raw_u16(r, nc);
    raw_str(r, 1, NULL, ctx);
    for (unsigned i = 0; i < nt && i < 1; i++) {
        raw_str(r, 1, NULL, tname);
        raw_str(r, 2, NULL, tdom);
        raw_str(r, 2, NULL, taddr);
    }
    for (unsigned i = 0; i < nc && i < 1; i++) {
        raw_str(r, 1, NULL, cname);
        raw_str(r, 2, NULL, cdom);
    }
}

static raw rb;

static void
brochure_rejects_each_bound_plus_one(void)
{
    tp_error *err = NULL;
    const size_t N = TP_WIRE_MAX_NAME, D = TP_WIRE_MAX_DOMAIN,
                 A = TP_WIRE_MAX_ADDR, C = TP_WIRE_MAX_CTXNAME;
    // At the bounds: fine.
    raw_brochure(&rb, 1, 1, C, N, D, A, N, D);
    TP_CHECK_OK(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err);

    raw_brochure(&rb, TP_WIRE_MAX_BACKENDS + 1, 0, 1, 1, 1, 1, 1, 1);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "brochure: transport count 17 exceeds the limit 16");
    raw_brochure(&rb, 0, TP_WIRE_MAX_BACKENDS + 1, 1, 1, 1, 1, 1, 1);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "channel count 17 exceeds");
    raw_brochure(&rb, 0, 0, 0xffff, 0, 0, 0, 0, 0); // u8 prefix: 0xff
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "ctxname length 255 exceeds the limit 127");
    raw_brochure(&rb, 0, 0, C + 1, 0, 0, 0, 0, 0);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "ctxname length 128 exceeds the limit 127");
    raw_brochure(&rb, 1, 1, C, N + 1, D, A, N, D);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "transport 0 name length 32 exceeds the limit 31");
    raw_brochure(&rb, 1, 1, C, N, D + 1, A, N, D);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "transport 0 domain length 256 exceeds the limit 255");
    raw_brochure(&rb, 1, 1, C, N, D, A + 1, N, D);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "transport 0 addr length 256 exceeds the limit 255");
    raw_brochure(&rb, 1, 1, C, N, D, A, N + 1, D);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "channel 0 name length 32 exceeds");
    raw_brochure(&rb, 1, 1, C, N, D, A, N, D + 1);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "channel 0 domain length 256 exceeds");
    // A huge length prefix with no bytes behind it.
    rb.n = 0;
    raw_u16(&rb, 1);
    raw_u16(&rb, 0);
    raw_str(&rb, 1, NULL, 0);
    raw_str(&rb, 1, NULL, 3);
    raw_u16(&rb, 200);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "(transport 0 domain, need 200 more bytes)");
}

static void
brochure_rejects_nul_in_strings(void)
{
    tp_error *err = NULL;
    rb.n = 0;
    raw_u16(&rb, 0);
    raw_u16(&rb, 0);
    raw_str(&rb, 1, "a\0b", 3);
    EXPECT_PROTO(tp__brochure_decode(rb.b, rb.n, &brochure_out, &err), err,
                 "ctxname contains a NUL byte at offset 1");

    // Put a NUL into each string of a valid encoding in turn.
    brochure_typical(&brochure_in);
    size_t size = tp__brochure_encode(&brochure_in, body, sizeof(body));
    // ctxname "worker0" starts at byte 5: its first byte.
    body[5] = 0;
    EXPECT_PROTO(tp__brochure_decode(body, size, &brochure_out, &err), err,
                 "ctxname contains a NUL byte at offset 0");
    tp__brochure_encode(&brochure_in, body, sizeof(body));
    // Transport 0: name "shm" at 5+7+1, domain "boot-id:1234" after it.
    size_t dom = 5 + 7 + 1 + 3 + 2;
    body[dom + 4] = 0;
    EXPECT_PROTO(tp__brochure_decode(body, size, &brochure_out, &err), err,
                 "transport 0 domain contains a NUL byte at offset 4");
    tp__brochure_encode(&brochure_in, body, sizeof(body));
    size_t addr = dom + 12 + 2;
    body[addr + 12] = 0; // last byte of "shm://tpipe-1"
    EXPECT_PROTO(tp__brochure_decode(body, size, &brochure_out, &err), err,
                 "transport 0 addr contains a NUL byte at offset 12");
    // The body ends with channel 2's name "basic" and its empty domain (a
    // 2-byte zero prefix), so size - 3 is the 'c'.
    tp__brochure_encode(&brochure_in, body, sizeof(body));
    body[size - 3] = 0;
    EXPECT_PROTO(tp__brochure_decode(body, size, &brochure_out, &err), err,
                 "channel 2 name contains a NUL byte at offset 4");
}

// ---- answer ----

static tp__answer answer_in;
static tp__answer answer_out;

static void
answer_refused(tp__answer *a)
{
    memset(a, 0, sizeof(*a));
    strcpy(a->a_ctxname, "server");
    strcpy(a->a_reason, "no common channel (peer offers: cma; we have: xth)");
}

static void
answer_typical(tp__answer *a)
{
    memset(a, 0, sizeof(*a));
    a->a_accepted = true;
    strcpy(a->a_ctxname, "server");
    strcpy(a->a_transport, "tcp");
    a->a_transport_reg_id = 0;
    strcpy(a->a_channel, "mpt");
    a->a_nconns = 2;
    strcpy(a->a_conns[0].ac_addr, "tcp://127.0.0.1:4000");
    a->a_conns[0].ac_reg_id = 7;
    strcpy(a->a_conns[1].ac_addr, "tcp://127.0.0.1:4000");
    a->a_conns[1].ac_reg_id = UINT64_MAX;
    strcpy(a->a_dchannel, "cuda_ipc");
    a->a_dnconns = 1;
    strcpy(a->a_conns[2].ac_addr, "tcp://127.0.0.1:4000");
    a->a_conns[2].ac_reg_id = 9;
}

static void
answer_max(tp__answer *a)
{
    memset(a, 0, sizeof(*a));
    a->a_accepted = true;
    fill_str(a->a_ctxname, sizeof(a->a_ctxname), TP_WIRE_MAX_CTXNAME, 1);
    fill_str(a->a_reason, sizeof(a->a_reason), TP_WIRE_MAX_REASON, 2);
    fill_str(a->a_transport, sizeof(a->a_transport), TP_WIRE_MAX_NAME, 3);
    fill_str(a->a_transport_addr, sizeof(a->a_transport_addr), TP_WIRE_MAX_ADDR,
             4);
    a->a_transport_reg_id = UINT64_C(0x8000000000000001);
    fill_str(a->a_channel, sizeof(a->a_channel), TP_WIRE_MAX_NAME, 5);
    a->a_nconns = TP_WIRE_MAX_CONNS;
    for (unsigned i = 0; i < TP_WIRE_MAX_CONNS; i++) {
        fill_str(a->a_conns[i].ac_addr, sizeof(a->a_conns[i].ac_addr),
                 TP_WIRE_MAX_ADDR, 6 + i);
        a->a_conns[i].ac_reg_id = 1 + i * UINT64_C(0x0101010101);
    }
    // A device channel, without conns: all 64 are the channel's.
    fill_str(a->a_dchannel, sizeof(a->a_dchannel), TP_WIRE_MAX_NAME, 7);
}

static size_t
answer_round_trip_one(const tp__answer *a)
{
    size_t size = tp__answer_size(a);
    TP_CHECK(size > 0);
    TP_CHECK(size <= TP_WIRE_MAX_HANDSHAKE);
    TP_CHECK_EQ(tp__answer_encode(a, body, size - 1), 0);
    TP_CHECK_EQ(tp__answer_encode(a, body, sizeof(body)), size);
    tp_error *err = NULL;
    memset(&answer_out, 0x55, sizeof(answer_out));
    TP_CHECK_OK(tp__answer_decode(body, size, &answer_out, &err), err);
    TP_CHECK(memcmp(a, &answer_out, sizeof(*a)) == 0);
    return size;
}

static void
answer_round_trips(void)
{
    memset(&answer_in, 0, sizeof(answer_in));
    TP_CHECK_EQ(answer_round_trip_one(&answer_in), 4); // refused, empty
    answer_refused(&answer_in);
    answer_round_trip_one(&answer_in);
    // A refusal carries no choice: fields set anyway are not sent.
    strcpy(answer_in.a_transport, "tcp");
    answer_in.a_nconns = 3;
    size_t size = tp__answer_encode(&answer_in, body, sizeof(body));
    tp_error *err = NULL;
    TP_CHECK_OK(tp__answer_decode(body, size, &answer_out, &err), err);
    TP_CHECK_EQ(answer_out.a_nconns, 0);
    TP_CHECK_EQ(answer_out.a_transport[0], 0);

    // Accepted with nothing extra: empty names, no conns.
    memset(&answer_in, 0, sizeof(answer_in));
    answer_in.a_accepted = true;
    TP_CHECK_EQ(answer_round_trip_one(&answer_in),
                4 + 1 + 2 + 8 + 1 + 2 + 1 + 2);
    answer_typical(&answer_in);
    answer_round_trip_one(&answer_in);
    TP_CHECK(answer_out.a_conns[1].ac_reg_id == UINT64_MAX);
    TP_CHECK_EQ(answer_out.a_nconns, 2);
    TP_CHECK(strcmp(answer_out.a_dchannel, "cuda_ipc") == 0);
    TP_CHECK_EQ(answer_out.a_dnconns, 1);
    TP_CHECK(answer_out.a_conns[2].ac_reg_id == 9);
    answer_max(&answer_in);
    // The largest answer (docs/pipe-wire.md).
    TP_CHECK_EQ(answer_round_trip_one(&answer_in), 18479);
}

static void
answer_encode_refuses_bad_fields(void)
{
    answer_typical(&answer_in);
    answer_in.a_nconns = TP_WIRE_MAX_CONNS + 1;
    TP_CHECK_EQ(tp__answer_encode(&answer_in, body, sizeof(body)), 0);
    answer_typical(&answer_in);
    answer_in.a_conns[1].ac_reg_id = 0;
    TP_CHECK_EQ(tp__answer_encode(&answer_in, body, sizeof(body)), 0);
    answer_typical(&answer_in);
    memset(answer_in.a_reason, 'r', sizeof(answer_in.a_reason));
    TP_CHECK_EQ(tp__answer_encode(&answer_in, body, sizeof(body)), 0);
    answer_typical(&answer_in);
    memset(answer_in.a_channel, 'c', sizeof(answer_in.a_channel));
    TP_CHECK_EQ(tp__answer_encode(&answer_in, body, sizeof(body)), 0);
}

static void
answer_every_truncation_fails(void)
{
    tp_error *err = NULL;
    void (*makers[])(tp__answer *) = {answer_refused, answer_typical,
                                      answer_max};
    for (size_t m = 0; m < TP_ARRAY_LEN(makers); m++) {
        makers[m](&answer_in);
        size_t size = tp__answer_encode(&answer_in, body, sizeof(body));
        TP_CHECK(size > 0);
        for (size_t n = 0; n < size; n++) {
            memset(&answer_out, 0x55, sizeof(answer_out));
            EXPECT_PROTO(tp__answer_decode(body, n, &answer_out, &err), err,
                         "answer: truncated at byte");
            TP_CHECK_EQ(answer_out.a_nconns, 0);
        }
        body[size] = 0xff;
        EXPECT_PROTO(tp__answer_decode(body, size + 1, &answer_out, &err), err,
                     "answer: 1 trailing bytes");
    }
}

static void
answer_rejects_bad_fields(void)
{
    tp_error *err = NULL;
    answer_typical(&answer_in);
    size_t size = tp__answer_encode(&answer_in, body, sizeof(body));
    body[0] = 2;
    EXPECT_PROTO(tp__answer_decode(body, size, &answer_out, &err), err,
                 "answer: accepted is 2, expected 0 or 1");

    // Device conn 0 reg id 0 (the last 8 bytes of the body).
    tp__answer_encode(&answer_in, body, sizeof(body));
    memset(body + size - 8, 0, 8);
    EXPECT_PROTO(tp__answer_decode(body, size, &answer_out, &err), err,
                 "answer: device conn 0 reg id is 0");

    // Bounds + 1, built by hand.
    const size_t N = TP_WIRE_MAX_NAME, A = TP_WIRE_MAX_ADDR;
    struct {
        size_t ctx, reason, tname, taddr, cname;
        unsigned nconns;
        size_t caddr;
        size_t dname;
        unsigned dnconns;
        const char *needle;
    } cases[] = {
        {TP_WIRE_MAX_CTXNAME, TP_WIRE_MAX_REASON, N, A, N,
         TP_WIRE_MAX_CONNS - 1, A, N, 1, NULL},
        {TP_WIRE_MAX_CTXNAME + 1, 0, 1, 1, 1, 0, 1, 0, 0,
         "ctxname length 128 exceeds the limit 127"},
        {1, 0, N + 1, 1, 1, 0, 1, 0, 0, "transport name length 32 exceeds"},
        {1, 0, 1, A + 1, 1, 0, 1, 0, 0, "transport addr length 256 exceeds"},
        {1, 0, 1, 1, N + 1, 0, 1, 0, 0, "channel name length 32 exceeds"},
        {1, 0, 1, 1, 1, TP_WIRE_MAX_CONNS + 1, 1, 0, 0,
         "conn count 65 exceeds the limit 64"},
        {1, 0, 1, 1, 1, 2, A + 1, 0, 0, "conn 0 addr length 256 exceeds"},
        {1, 0, 1, 1, 1, 0, 1, N + 1, 0,
         "device channel name length 32 exceeds"},
        {1, 0, 1, 1, 1, TP_WIRE_MAX_CONNS, 1, 1, 1,
         "device conn count 1 exceeds the limit 0 (64 in all)"},
        {1, 0, 1, 1, 1, 1, 1, 0, 1,
         "answer: 1 device conns without a device channel"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        rb.n = 0;
        raw_u8(&rb, 1);
        raw_str(&rb, 1, NULL, cases[i].ctx);
        raw_str(&rb, 2, NULL, cases[i].reason);
        raw_str(&rb, 1, NULL, cases[i].tname);
        raw_str(&rb, 2, NULL, cases[i].taddr);
        raw_u64(&rb, 0);
        raw_str(&rb, 1, NULL, cases[i].cname);
        raw_u16(&rb, cases[i].nconns);
        for (unsigned c = 0; c < cases[i].nconns; c++) {
            raw_str(&rb, 2, NULL, cases[i].caddr);
            raw_u64(&rb, c + 1);
        }
        raw_str(&rb, 1, NULL, cases[i].dname);
        raw_u16(&rb, cases[i].dnconns);
        for (unsigned c = 0; c < cases[i].dnconns; c++) {
            raw_str(&rb, 2, NULL, 1);
            raw_u64(&rb, c + 1);
        }
        if (cases[i].needle == NULL) {
            TP_CHECK_OK(tp__answer_decode(rb.b, rb.n, &answer_out, &err), err);
        } else {
            EXPECT_PROTO(tp__answer_decode(rb.b, rb.n, &answer_out, &err), err,
                         cases[i].needle);
        }
    }
    // A reason one byte above its bound.
    rb.n = 0;
    raw_u8(&rb, 0);
    raw_str(&rb, 1, NULL, 1);
    raw_str(&rb, 2, NULL, TP_WIRE_MAX_REASON + 1);
    EXPECT_PROTO(tp__answer_decode(rb.b, rb.n, &answer_out, &err), err,
                 "reason length 1024 exceeds the limit 1023");

    // NUL inside the reason and the channel name.
    rb.n = 0;
    raw_u8(&rb, 0);
    raw_str(&rb, 1, "x", 1);
    raw_str(&rb, 2, "bad\0reason", 10);
    EXPECT_PROTO(tp__answer_decode(rb.b, rb.n, &answer_out, &err), err,
                 "answer: reason contains a NUL byte at offset 3");
    rb.n = 0;
    raw_u8(&rb, 1);
    raw_str(&rb, 1, "x", 1);
    raw_str(&rb, 2, "", 0);
    raw_str(&rb, 1, "tcp", 3);
    raw_str(&rb, 2, "", 0);
    raw_u64(&rb, 0);
    raw_str(&rb, 1, "\0pt", 3);
    raw_u16(&rb, 0);
    EXPECT_PROTO(tp__answer_decode(rb.b, rb.n, &answer_out, &err), err,
                 "channel name contains a NUL byte at offset 0");
    check_no_leaks();
}

// ---- join ----

static void
join_round_trip_and_rejects(void)
{
    uint8_t out[TP_JOIN_LEN + 1];
    uint64_t reg = 0;
    uint16_t idx = 0;
    tp_error *err = NULL;
    tp__join_encode(UINT64_C(0xfedcba9876543210), 63, out);
    TP_CHECK_OK(tp__join_decode(out, TP_JOIN_LEN, &reg, &idx, &err), err);
    TP_CHECK(reg == UINT64_C(0xfedcba9876543210));
    TP_CHECK_EQ(idx, 63);
    tp__join_encode(1, UINT16_MAX, out);
    TP_CHECK_OK(tp__join_decode(out, TP_JOIN_LEN, &reg, &idx, &err), err);
    TP_CHECK_EQ(reg, 1);
    TP_CHECK_EQ(idx, UINT16_MAX);

    for (size_t n = 0; n < TP_JOIN_LEN; n++) {
        reg = 42;
        EXPECT_PROTO(tp__join_decode(out, n, &reg, &idx, &err), err,
                     "join: truncated at byte");
        TP_CHECK_EQ(reg, 42); // untouched on failure
    }
    out[TP_JOIN_LEN] = 0;
    EXPECT_PROTO(tp__join_decode(out, TP_JOIN_LEN + 1, &reg, &idx, &err), err,
                 "join: 1 trailing bytes after byte 10");
    tp__join_encode(0, 1, out);
    EXPECT_PROTO(tp__join_decode(out, TP_JOIN_LEN, &reg, &idx, &err), err,
                 "join: reg id is 0");
    TP_CHECK_EQ(reg, 42);
    check_no_leaks();
}

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

static void
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

static void
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

static void
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

static void
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

static void
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

static void
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
static void
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

static void
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

static void
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

static const tp_test_case cases[] = {
    TP_TEST_CASE(frame_hdr_round_trip),
    TP_TEST_CASE(frame_hdr_rejects),
    TP_TEST_CASE(brochure_round_trips),
    TP_TEST_CASE(brochure_encode_refuses_bad_fields),
    TP_TEST_CASE(brochure_every_truncation_fails),
    TP_TEST_CASE(brochure_rejects_each_bound_plus_one),
    TP_TEST_CASE(brochure_rejects_nul_in_strings),
    TP_TEST_CASE(answer_round_trips),
    TP_TEST_CASE(answer_encode_refuses_bad_fields),
    TP_TEST_CASE(answer_every_truncation_fails),
    TP_TEST_CASE(answer_rejects_bad_fields),
    TP_TEST_CASE(join_round_trip_and_rejects),
    TP_TEST_CASE(desc_round_trips),
    TP_TEST_CASE(desc_encode_refuses_bad_fields),
    TP_TEST_CASE(desc_every_truncation_fails),
    TP_TEST_CASE(desc_rejects_each_bound_plus_one),
    TP_TEST_CASE(desc_rejects_overflowing_sums),
    TP_TEST_CASE(desc_max_size_saturates),
    TP_TEST_CASE(desc_decode_allocation),
    TP_TEST_CASE(message_create_destroy),
    TP_TEST_CASE(message_owned_metadata),
};

TP_TEST_MAIN(cases)
