// SPDX-License-Identifier: Apache-2.0
// wire_test_handshake.c - wire_test's cases on the handshake bodies
// (pipe/wire.h): the brochure and the answer round trip at every bound and
// reject every truncation, every bound + 1, NUL inside strings and trailing
// bytes.

#include <tpipe/pipe.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "tp_test.h"
#include "wire_test.h"

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

void
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

void
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

void
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

void
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

void
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

void
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

void
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

void
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

void
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
