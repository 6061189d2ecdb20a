// SPDX-License-Identifier: Apache-2.0
// wire.c - encoders and decoders of the pipe's wire format (pipe/wire.h,
// docs/pipe-wire.md).
//
// Decoders read through a wire_rd cursor: every read first checks that
// the bytes are there, so nothing past @len is ever touched, and every
// count, length and string is checked against its bound as soon as it is
// read, before anything is copied or allocated. The descriptor decoder
// parses twice: once to validate (no allocation), then, knowing the input
// is good, once more into the new message. Error messages name the body
// kind, the field (indices are 0-based) and what was wrong with it.

#include "pipe/wire.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/wire.h"

// ---- helpers ---------------------------------------------------------

static uint64_t
wire_sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t
wire_sat_mul(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

// The length of a NUL-terminated string stored in an array of @cap bytes,
// or @cap if it is not terminated there (a broken bound).
static size_t
wire_strlen(const char *s, size_t cap)
{
    const char *nul = memchr(s, 0, cap);
    return nul == NULL ? cap : (size_t)(nul - s);
}

// A field, named only when an error needs it: "ctxname", "transport 1
// domain", "conn 3 reg id".
typedef struct wire_field {
    const char *f_name;
    long f_idx; // -1: no index
    const char *f_sub;
} wire_field;

#define WIRE_FIELD(name)             ((wire_field){(name), -1, NULL})
#define WIRE_FIELD_I(name, idx, sub) ((wire_field){(name), (long)(idx), (sub)})

static void
wire_field_fmt(char *buf, size_t cap, wire_field f)
{
    if (f.f_idx < 0) {
        snprintf(buf, cap, "%s%s%s", f.f_name, f.f_sub ? " " : "",
                 f.f_sub ? f.f_sub : "");
    } else {
        snprintf(buf, cap, "%s %ld%s%s", f.f_name, f.f_idx, f.f_sub ? " " : "",
                 f.f_sub ? f.f_sub : "");
    }
}

typedef struct wire_rd {
    const uint8_t *r_in;
    uint64_t r_len;
    uint64_t r_off;
    const char *r_what; // "brochure", "answer", "join", "descriptor"
    tp_error **r_err_p;
} wire_rd;

static void
wire_rd_init(wire_rd *r, const char *what, const uint8_t *in, uint64_t len,
             tp_error **err_p)
{
    r->r_in = in;
    r->r_len = len;
    r->r_off = 0;
    r->r_what = what;
    r->r_err_p = err_p;
}

static tp_status wire_fail(wire_rd *r, const char *fmt, ...) TP_PRINTF(2, 3);

// Sets the error "<what>: <fmt>" and returns TP_EPROTO.
static tp_status
wire_fail(wire_rd *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return tp__error_set(r->r_err_p, TP_EPROTO, "%s: %s", r->r_what, msg);
}

// Checks that @n more bytes are there.
static bool
wire_need(wire_rd *r, uint64_t n, wire_field f)
{
    uint64_t left = r->r_len - r->r_off;
    if (n <= left) {
        return true;
    }
    char name[96];
    wire_field_fmt(name, sizeof(name), f);
    wire_fail(r,
              "truncated at byte %" PRIu64 " (%s, need %" PRIu64 " more bytes)",
              r->r_len, name, n - left);
    return false;
}

static bool
wire_u8(wire_rd *r, wire_field f, uint8_t *v_p)
{
    if (!wire_need(r, 1, f)) {
        return false;
    }
    *v_p = r->r_in[r->r_off];
    r->r_off += 1;
    return true;
}

static bool
wire_u16(wire_rd *r, wire_field f, uint16_t *v_p)
{
    if (!wire_need(r, 2, f)) {
        return false;
    }
    *v_p = tp__get_u16le(r->r_in + r->r_off);
    r->r_off += 2;
    return true;
}

static bool
wire_u32(wire_rd *r, wire_field f, uint32_t *v_p)
{
    if (!wire_need(r, 4, f)) {
        return false;
    }
    *v_p = tp__get_u32le(r->r_in + r->r_off);
    r->r_off += 4;
    return true;
}

static bool
wire_u64(wire_rd *r, wire_field f, uint64_t *v_p)
{
    if (!wire_need(r, 8, f)) {
        return false;
    }
    *v_p = tp__get_u64le(r->r_in + r->r_off);
    r->r_off += 8;
    return true;
}

// Reads a string with a @width-byte (1 or 2) length prefix, at most @max
// bytes and no NUL inside, into @out (capacity > @max), NUL-terminated.
static bool
wire_str(wire_rd *r, int width, size_t max, char *out, wire_field f)
{
    uint64_t n;
    if (width == 1) {
        uint8_t n8;
        if (!wire_u8(r, f, &n8)) {
            return false;
        }
        n = n8;
    } else {
        uint16_t n16;
        if (!wire_u16(r, f, &n16)) {
            return false;
        }
        n = n16;
    }
    char name[96];
    if (n > max) {
        wire_field_fmt(name, sizeof(name), f);
        wire_fail(r, "%s length %" PRIu64 " exceeds the limit %zu", name, n,
                  max);
        return false;
    }
    if (!wire_need(r, n, f)) {
        return false;
    }
    const uint8_t *s = r->r_in + r->r_off;
    const uint8_t *nul = memchr(s, 0, (size_t)n);
    if (nul != NULL) {
        wire_field_fmt(name, sizeof(name), f);
        wire_fail(r, "%s contains a NUL byte at offset %td", name, nul - s);
        return false;
    }
    memcpy(out, s, (size_t)n);
    out[n] = '\0';
    r->r_off += n;
    return true;
}

// Checks that the whole input was used.
static bool
wire_end(wire_rd *r)
{
    if (r->r_off == r->r_len) {
        return true;
    }
    wire_fail(r, "%" PRIu64 " trailing bytes after byte %" PRIu64,
              r->r_len - r->r_off, r->r_off);
    return false;
}

// The matching writer: callers check the total size first, so writes never
// overflow; the cursor asserts it anyway.
typedef struct wire_wr {
    uint8_t *w_out;
    uint64_t w_cap;
    uint64_t w_off;
} wire_wr;

static void
wire_put_u8(wire_wr *w, uint8_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 1);
    w->w_out[w->w_off++] = v;
}

static void
wire_put_u16(wire_wr *w, uint16_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 2);
    tp__put_u16le(w->w_out + w->w_off, v);
    w->w_off += 2;
}

static void
wire_put_u32(wire_wr *w, uint32_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 4);
    tp__put_u32le(w->w_out + w->w_off, v);
    w->w_off += 4;
}

static void
wire_put_u64(wire_wr *w, uint64_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 8);
    tp__put_u64le(w->w_out + w->w_off, v);
    w->w_off += 8;
}

static void
wire_put_bytes(wire_wr *w, const void *p, uint64_t n)
{
    TP_ASSERT(w->w_cap - w->w_off >= n);
    if (n > 0) {
        memcpy(w->w_out + w->w_off, p, (size_t)n);
    }
    w->w_off += n;
}

// Writes a length-prefixed string (already checked against its bound).
static void
wire_put_str(wire_wr *w, int width, const char *s, size_t cap)
{
    size_t n = wire_strlen(s, cap);
    if (width == 1) {
        wire_put_u8(w, (uint8_t)n);
    } else {
        wire_put_u16(w, (uint16_t)n);
    }
    wire_put_bytes(w, s, n);
}

// Encoded size of a string field: its prefix and bytes, or 0 when the
// string breaks its bound (or is not terminated within @cap).
static size_t
wire_str_size(int width, const char *s, size_t cap, size_t max)
{
    size_t n = wire_strlen(s, cap);
    return n > max ? 0 : (size_t)width + n;
}

// ---- frame header ----------------------------------------------------

void
tp__frame_hdr_encode(uint8_t out[TP_FRAME_HDR_LEN], const tp__frame_hdr *h)
{
    out[0] = h->fh_type;
    out[1] = h->fh_version;
    tp__put_u16le(out + 2, 0);
    tp__put_u32le(out + 4, h->fh_aux);
    tp__put_u64le(out + 8, h->fh_body_len);
}

tp_status
tp__frame_hdr_decode(const uint8_t in[TP_FRAME_HDR_LEN], tp__frame_hdr *h,
                     tp_error **err_p)
{
    uint8_t type = in[0];
    uint8_t version = in[1];
    uint16_t zero = tp__get_u16le(in + 2);
    if (version != TP_PIPE_WIRE_VERSION) {
        return tp__error_set(err_p, TP_EPROTO,
                             "frame header: wire version %u, expected %u "
                             "(peer runs an incompatible tpipe)",
                             version, TP_PIPE_WIRE_VERSION);
    }
    if (zero != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "frame header: reserved field is 0x%04x, "
                             "expected 0",
                             zero);
    }
    if (type < TP_FRAME_BROCHURE || type > TP_FRAME_ACK) {
        return tp__error_set(err_p, TP_EPROTO,
                             "frame header: unknown frame type %u", type);
    }
    h->fh_type = type;
    h->fh_version = version;
    h->fh_aux = tp__get_u32le(in + 4);
    h->fh_body_len = tp__get_u64le(in + 8);
    return TP_OK;
}

// ---- brochure --------------------------------------------------------

#define ENTRY_STR(e, m) (e)->m, sizeof((e)->m)

size_t
tp__brochure_size(const tp__brochure *b)
{
    if (b->b_ntransports > TP_WIRE_MAX_BACKENDS ||
        b->b_nchannels > TP_WIRE_MAX_BACKENDS) {
        return 0;
    }
    size_t ctx = wire_str_size(1, b->b_ctxname, sizeof(b->b_ctxname),
                               TP_WIRE_MAX_CTXNAME);
    if (ctx == 0) {
        return 0;
    }
    size_t total = 4 + ctx;
    for (unsigned i = 0; i < b->b_ntransports; i++) {
        const tp__brochure_entry *e = &b->b_transports[i];
        size_t name = wire_str_size(1, ENTRY_STR(e, be_name), TP_WIRE_MAX_NAME);
        size_t dom =
            wire_str_size(2, ENTRY_STR(e, be_domain), TP_WIRE_MAX_DOMAIN);
        size_t addr = wire_str_size(2, ENTRY_STR(e, be_addr), TP_WIRE_MAX_ADDR);
        if (name == 0 || dom == 0 || addr == 0) {
            return 0;
        }
        total += name + dom + addr;
    }
    for (unsigned i = 0; i < b->b_nchannels; i++) {
        const tp__brochure_entry *e = &b->b_channels[i];
        size_t name = wire_str_size(1, ENTRY_STR(e, be_name), TP_WIRE_MAX_NAME);
        size_t dom =
            wire_str_size(2, ENTRY_STR(e, be_domain), TP_WIRE_MAX_DOMAIN);
        if (name == 0 || dom == 0) {
            return 0;
        }
        total += name + dom;
    }
    return total;
}

size_t
tp__brochure_encode(const tp__brochure *b, uint8_t *out, size_t cap)
{
    size_t size = tp__brochure_size(b);
    if (size == 0 || size > cap) {
        return 0;
    }
    wire_wr w = {out, size, 0};
    wire_put_u16(&w, b->b_ntransports);
    wire_put_u16(&w, b->b_nchannels);
    wire_put_str(&w, 1, b->b_ctxname, sizeof(b->b_ctxname));
    for (unsigned i = 0; i < b->b_ntransports; i++) {
        const tp__brochure_entry *e = &b->b_transports[i];
        wire_put_str(&w, 1, ENTRY_STR(e, be_name));
        wire_put_str(&w, 2, ENTRY_STR(e, be_domain));
        wire_put_str(&w, 2, ENTRY_STR(e, be_addr));
    }
    for (unsigned i = 0; i < b->b_nchannels; i++) {
        const tp__brochure_entry *e = &b->b_channels[i];
        wire_put_str(&w, 1, ENTRY_STR(e, be_name));
        wire_put_str(&w, 2, ENTRY_STR(e, be_domain));
    }
    TP_ASSERT(w.w_off == size);
    return size;
}

static bool
brochure_parse(wire_rd *r, tp__brochure *b)
{
    if (!wire_u16(r, WIRE_FIELD("transport count"), &b->b_ntransports) ||
        !wire_u16(r, WIRE_FIELD("channel count"), &b->b_nchannels)) {
        return false;
    }
    if (b->b_ntransports > TP_WIRE_MAX_BACKENDS) {
        wire_fail(r, "transport count %u exceeds the limit %u",
                  b->b_ntransports, TP_WIRE_MAX_BACKENDS);
        return false;
    }
    if (b->b_nchannels > TP_WIRE_MAX_BACKENDS) {
        wire_fail(r, "channel count %u exceeds the limit %u", b->b_nchannels,
                  TP_WIRE_MAX_BACKENDS);
        return false;
    }
    if (!wire_str(r, 1, TP_WIRE_MAX_CTXNAME, b->b_ctxname,
                  WIRE_FIELD("ctxname"))) {
        return false;
    }
    for (unsigned i = 0; i < b->b_ntransports; i++) {
        tp__brochure_entry *e = &b->b_transports[i];
        if (!wire_str(r, 1, TP_WIRE_MAX_NAME, e->be_name,
                      WIRE_FIELD_I("transport", i, "name")) ||
            !wire_str(r, 2, TP_WIRE_MAX_DOMAIN, e->be_domain,
                      WIRE_FIELD_I("transport", i, "domain")) ||
            !wire_str(r, 2, TP_WIRE_MAX_ADDR, e->be_addr,
                      WIRE_FIELD_I("transport", i, "addr"))) {
            return false;
        }
    }
    for (unsigned i = 0; i < b->b_nchannels; i++) {
        tp__brochure_entry *e = &b->b_channels[i];
        if (!wire_str(r, 1, TP_WIRE_MAX_NAME, e->be_name,
                      WIRE_FIELD_I("channel", i, "name")) ||
            !wire_str(r, 2, TP_WIRE_MAX_DOMAIN, e->be_domain,
                      WIRE_FIELD_I("channel", i, "domain"))) {
            return false;
        }
    }
    return wire_end(r);
}

tp_status
tp__brochure_decode(const uint8_t *in, size_t len, tp__brochure *b,
                    tp_error **err_p)
{
    wire_rd r;
    wire_rd_init(&r, "brochure", in, len, err_p);
    memset(b, 0, sizeof(*b));
    if (!brochure_parse(&r, b)) {
        // Leave nothing half-decoded behind.
        memset(b, 0, sizeof(*b));
        return TP_EPROTO;
    }
    return TP_OK;
}

// ---- answer ----------------------------------------------------------

size_t
tp__answer_size(const tp__answer *a)
{
    size_t ctx = wire_str_size(1, a->a_ctxname, sizeof(a->a_ctxname),
                               TP_WIRE_MAX_CTXNAME);
    size_t reason =
        wire_str_size(2, a->a_reason, sizeof(a->a_reason), TP_WIRE_MAX_REASON);
    if (ctx == 0 || reason == 0) {
        return 0;
    }
    size_t total = 1 + ctx + reason;
    if (!a->a_accepted) {
        return total;
    }
    size_t tname = wire_str_size(1, a->a_transport, sizeof(a->a_transport),
                                 TP_WIRE_MAX_NAME);
    size_t taddr = wire_str_size(2, a->a_transport_addr,
                                 sizeof(a->a_transport_addr), TP_WIRE_MAX_ADDR);
    size_t cname =
        wire_str_size(1, a->a_channel, sizeof(a->a_channel), TP_WIRE_MAX_NAME);
    if (tname == 0 || taddr == 0 || cname == 0 ||
        a->a_nconns > TP_WIRE_MAX_CONNS) {
        return 0;
    }
    total += tname + taddr + 8 + cname + 2;
    for (unsigned i = 0; i < a->a_nconns; i++) {
        const tp__answer_conn *c = &a->a_conns[i];
        size_t addr =
            wire_str_size(2, c->ac_addr, sizeof(c->ac_addr), TP_WIRE_MAX_ADDR);
        if (addr == 0 || c->ac_reg_id == 0) {
            return 0;
        }
        total += addr + 8;
    }
    return total;
}

size_t
tp__answer_encode(const tp__answer *a, uint8_t *out, size_t cap)
{
    size_t size = tp__answer_size(a);
    if (size == 0 || size > cap) {
        return 0;
    }
    wire_wr w = {out, size, 0};
    wire_put_u8(&w, a->a_accepted ? 1 : 0);
    wire_put_str(&w, 1, a->a_ctxname, sizeof(a->a_ctxname));
    wire_put_str(&w, 2, a->a_reason, sizeof(a->a_reason));
    if (a->a_accepted) {
        wire_put_str(&w, 1, a->a_transport, sizeof(a->a_transport));
        wire_put_str(&w, 2, a->a_transport_addr, sizeof(a->a_transport_addr));
        wire_put_u64(&w, a->a_transport_reg_id);
        wire_put_str(&w, 1, a->a_channel, sizeof(a->a_channel));
        wire_put_u16(&w, a->a_nconns);
        for (unsigned i = 0; i < a->a_nconns; i++) {
            const tp__answer_conn *c = &a->a_conns[i];
            wire_put_str(&w, 2, c->ac_addr, sizeof(c->ac_addr));
            wire_put_u64(&w, c->ac_reg_id);
        }
    }
    TP_ASSERT(w.w_off == size);
    return size;
}

static bool
answer_parse(wire_rd *r, tp__answer *a)
{
    uint8_t accepted;
    if (!wire_u8(r, WIRE_FIELD("accepted"), &accepted)) {
        return false;
    }
    if (accepted > 1) {
        wire_fail(r, "accepted is %u, expected 0 or 1", accepted);
        return false;
    }
    a->a_accepted = accepted == 1;
    if (!wire_str(r, 1, TP_WIRE_MAX_CTXNAME, a->a_ctxname,
                  WIRE_FIELD("ctxname")) ||
        !wire_str(r, 2, TP_WIRE_MAX_REASON, a->a_reason,
                  WIRE_FIELD("reason"))) {
        return false;
    }
    if (!a->a_accepted) {
        return wire_end(r);
    }
    if (!wire_str(r, 1, TP_WIRE_MAX_NAME, a->a_transport,
                  WIRE_FIELD("transport name")) ||
        !wire_str(r, 2, TP_WIRE_MAX_ADDR, a->a_transport_addr,
                  WIRE_FIELD("transport addr")) ||
        !wire_u64(r, WIRE_FIELD("transport reg id"), &a->a_transport_reg_id) ||
        !wire_str(r, 1, TP_WIRE_MAX_NAME, a->a_channel,
                  WIRE_FIELD("channel name")) ||
        !wire_u16(r, WIRE_FIELD("conn count"), &a->a_nconns)) {
        return false;
    }
    if (a->a_nconns > TP_WIRE_MAX_CONNS) {
        wire_fail(r, "conn count %u exceeds the limit %u", a->a_nconns,
                  TP_WIRE_MAX_CONNS);
        return false;
    }
    for (unsigned i = 0; i < a->a_nconns; i++) {
        tp__answer_conn *c = &a->a_conns[i];
        if (!wire_str(r, 2, TP_WIRE_MAX_ADDR, c->ac_addr,
                      WIRE_FIELD_I("conn", i, "addr")) ||
            !wire_u64(r, WIRE_FIELD_I("conn", i, "reg id"), &c->ac_reg_id)) {
            return false;
        }
        if (c->ac_reg_id == 0) {
            wire_fail(r, "conn %u reg id is 0 (reg ids are nonzero)", i);
            return false;
        }
    }
    return wire_end(r);
}

tp_status
tp__answer_decode(const uint8_t *in, size_t len, tp__answer *a,
                  tp_error **err_p)
{
    wire_rd r;
    wire_rd_init(&r, "answer", in, len, err_p);
    memset(a, 0, sizeof(*a));
    if (!answer_parse(&r, a)) {
        memset(a, 0, sizeof(*a));
        return TP_EPROTO;
    }
    return TP_OK;
}

// ---- join ------------------------------------------------------------

void
tp__join_encode(uint64_t reg_id, uint16_t index, uint8_t out[TP_JOIN_LEN])
{
    tp__put_u64le(out, reg_id);
    tp__put_u16le(out + 8, index);
}

tp_status
tp__join_decode(const uint8_t *in, size_t len, uint64_t *reg_id_p,
                uint16_t *index_p, tp_error **err_p)
{
    wire_rd r;
    wire_rd_init(&r, "join", in, len, err_p);
    uint64_t reg_id;
    uint16_t index;
    if (!wire_u64(&r, WIRE_FIELD("reg id"), &reg_id) ||
        !wire_u16(&r, WIRE_FIELD("conn index"), &index) || !wire_end(&r)) {
        return TP_EPROTO;
    }
    if (reg_id == 0) {
        return wire_fail(&r, "reg id is 0 (reg ids are nonzero)");
    }
    *reg_id_p = reg_id;
    *index_p = index;
    return TP_OK;
}

// ---- message descriptor ----------------------------------------------

#define DESC_HDR_LEN     16u // metadata_len, npayloads, ntensors
#define DESC_PAYLOAD_LEN 8u  // len
#define DESC_TENSOR_LEN  11u // len, device type, index, info_len (info)

uint64_t
tp__desc_max_size(const tp__pipe_limits *lim)
{
    uint64_t n = DESC_HDR_LEN;
    n = wire_sat_add(n, wire_sat_mul(lim->max_payloads, DESC_PAYLOAD_LEN));
    n = wire_sat_add(n, wire_sat_mul(lim->max_tensors,
                                     DESC_TENSOR_LEN + TP_WIRE_MAX_CHAN_INFO));
    return wire_sat_add(n, lim->max_metadata);
}

// The size of a valid descriptor, 0 if @msg cannot be encoded (channel
// info over its bound, a device type that does not fit a byte, metadata
// NULL with a nonzero length, NULL arrays with nonzero counts).
uint64_t
tp__desc_size(const tp_message *msg, const tp__chan_info *infos)
{
    if ((msg->metadata == NULL && msg->metadata_len > 0) ||
        (msg->payloads == NULL && msg->npayloads > 0) ||
        (msg->tensors == NULL && msg->ntensors > 0)) {
        return 0;
    }
    uint64_t n = DESC_HDR_LEN + (uint64_t)msg->npayloads * DESC_PAYLOAD_LEN;
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        uint8_t info_len = infos != NULL ? infos[i].ci_len : 0;
        unsigned type = (unsigned)msg->tensors[i].device.type;
        int index = msg->tensors[i].device.index;
        if (info_len > TP_WIRE_MAX_CHAN_INFO || type > UINT8_MAX || index < 0 ||
            index > UINT8_MAX) {
            return 0;
        }
        n += DESC_TENSOR_LEN + info_len;
    }
    return wire_sat_add(n, msg->metadata_len);
}

uint64_t
tp__desc_encode(const tp_message *msg, const tp__chan_info *infos, uint8_t *out,
                uint64_t cap)
{
    uint64_t size = tp__desc_size(msg, infos);
    if (size == 0 || size == UINT64_MAX || size > cap) {
        return 0;
    }
    wire_wr w = {out, size, 0};
    wire_put_u64(&w, msg->metadata_len);
    wire_put_u32(&w, msg->npayloads);
    wire_put_u32(&w, msg->ntensors);
    for (uint32_t i = 0; i < msg->npayloads; i++) {
        wire_put_u64(&w, msg->payloads[i].len);
    }
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        const tp_msg_buf *t = &msg->tensors[i];
        uint8_t info_len = infos != NULL ? infos[i].ci_len : 0;
        wire_put_u64(&w, t->len);
        wire_put_u8(&w, (uint8_t)t->device.type);
        wire_put_u8(&w, (uint8_t)t->device.index);
        wire_put_u8(&w, info_len);
        if (info_len > 0) {
            wire_put_bytes(&w, infos[i].ci_bytes, info_len);
        }
    }
    wire_put_bytes(&w, msg->metadata, msg->metadata_len);
    TP_ASSERT(w.w_off == size);
    return size;
}

// Parses a descriptor. With @msg NULL it only validates (and must be run
// first: the second pass, filling @msg and @infos, assumes valid input).
static bool
desc_parse(wire_rd *r, const tp__pipe_limits *lim, tp_message *msg,
           tp__chan_info *infos, uint64_t *metadata_len_p,
           uint32_t *npayloads_p, uint32_t *ntensors_p)
{
    uint64_t mlen;
    uint32_t np;
    uint32_t nt;
    if (!wire_u64(r, WIRE_FIELD("metadata length"), &mlen) ||
        !wire_u32(r, WIRE_FIELD("payload count"), &np) ||
        !wire_u32(r, WIRE_FIELD("tensor count"), &nt)) {
        return false;
    }
    if (mlen > lim->max_metadata) {
        wire_fail(r,
                  "metadata length %" PRIu64 " exceeds the limit %" PRIu64
                  " (TP_PIPE_MAX_METADATA)",
                  mlen, lim->max_metadata);
        return false;
    }
    if (np > lim->max_payloads) {
        wire_fail(r,
                  "payload count %" PRIu32 " exceeds the limit %" PRIu32
                  " (TP_PIPE_MAX_PAYLOADS)",
                  np, lim->max_payloads);
        return false;
    }
    if (nt > lim->max_tensors) {
        wire_fail(r,
                  "tensor count %" PRIu32 " exceeds the limit %" PRIu32
                  " (TP_PIPE_MAX_TENSORS)",
                  nt, lim->max_tensors);
        return false;
    }
    // Cheap early check (no allocation depends on it, but it turns a
    // forged count into a clear message before the loops run).
    uint64_t fixed =
        (uint64_t)np * DESC_PAYLOAD_LEN + (uint64_t)nt * DESC_TENSOR_LEN;
    if (!wire_need(r, fixed, WIRE_FIELD("payload and tensor table"))) {
        return false;
    }

    uint64_t total = 0; // bytes of payloads and tensors, must fit 64 bits
    for (uint32_t i = 0; i < np; i++) {
        uint64_t len;
        if (!wire_u64(r, WIRE_FIELD_I("payload", i, "length"), &len)) {
            return false;
        }
        if (len > lim->max_buf_len) {
            wire_fail(r,
                      "payload %" PRIu32 " length %" PRIu64
                      " exceeds the limit %" PRIu64 " (TP_PIPE_MAX_BUF_BYTES)",
                      i, len, lim->max_buf_len);
            return false;
        }
        if (len > UINT64_MAX - total) {
            wire_fail(r,
                      "payload %" PRIu32 " length %" PRIu64
                      ": the total length of the message overflows 64 bits",
                      i, len);
            return false;
        }
        total += len;
        if (msg != NULL) {
            msg->payloads[i].len = len;
        }
    }
    for (uint32_t i = 0; i < nt; i++) {
        uint64_t len;
        uint8_t type;
        uint8_t index;
        uint8_t info_len;
        if (!wire_u64(r, WIRE_FIELD_I("tensor", i, "length"), &len)) {
            return false;
        }
        if (len > lim->max_buf_len) {
            wire_fail(r,
                      "tensor %" PRIu32 " length %" PRIu64
                      " exceeds the limit %" PRIu64 " (TP_PIPE_MAX_BUF_BYTES)",
                      i, len, lim->max_buf_len);
            return false;
        }
        if (len > UINT64_MAX - total) {
            wire_fail(r,
                      "tensor %" PRIu32 " length %" PRIu64
                      ": the total length of the message overflows 64 bits",
                      i, len);
            return false;
        }
        total += len;
        if (!wire_u8(r, WIRE_FIELD_I("tensor", i, "device type"), &type)) {
            return false;
        }
        if (type != TP_DEVICE_CPU && type != TP_DEVICE_CUDA) {
            wire_fail(r,
                      "tensor %" PRIu32 " device type %u is not supported "
                      "(0 cpu, 1 cuda)",
                      i, type);
            return false;
        }
        if (!wire_u8(r, WIRE_FIELD_I("tensor", i, "device index"), &index)) {
            return false;
        }
        if (type == TP_DEVICE_CPU && index != 0) {
            wire_fail(r, "tensor %" PRIu32 " cpu device index %u is not 0", i,
                      index);
            return false;
        }
        if (!wire_u8(r, WIRE_FIELD_I("tensor", i, "channel info length"),
                     &info_len)) {
            return false;
        }
        if (info_len > TP_WIRE_MAX_CHAN_INFO) {
            wire_fail(r,
                      "tensor %" PRIu32 " channel info length %u exceeds "
                      "the limit %u",
                      i, info_len, TP_WIRE_MAX_CHAN_INFO);
            return false;
        }
        if (!wire_need(r, info_len,
                       WIRE_FIELD_I("tensor", i, "channel info"))) {
            return false;
        }
        if (msg != NULL) {
            msg->tensors[i].len = len;
            msg->tensors[i].device.type = (tp_device_type)type;
            msg->tensors[i].device.index = index;
            infos[i].ci_len = info_len;
            memcpy(infos[i].ci_bytes, r->r_in + r->r_off, info_len);
        }
        r->r_off += info_len;
    }
    if (!wire_need(r, mlen, WIRE_FIELD("metadata"))) {
        return false;
    }
    if (msg != NULL && mlen > 0) {
        memcpy(msg->metadata, r->r_in + r->r_off, (size_t)mlen);
    }
    r->r_off += mlen;
    if (!wire_end(r)) {
        return false;
    }
    *metadata_len_p = mlen;
    *npayloads_p = np;
    *ntensors_p = nt;
    return true;
}

tp_status
tp__desc_decode(const uint8_t *in, uint64_t len, const tp__pipe_limits *lim,
                tp_message **msg_p, tp__chan_info **infos_p, tp_error **err_p)
{
    wire_rd r;
    uint64_t mlen;
    uint32_t np;
    uint32_t nt;
    wire_rd_init(&r, "descriptor", in, len, err_p);
    if (!desc_parse(&r, lim, NULL, NULL, &mlen, &np, &nt)) {
        return TP_EPROTO;
    }

    // The input is valid, so every size below is bounded by @len and the
    // limits.
    tp_message *msg = NULL;
    tp__chan_info *infos = NULL;
    if (tp__message_create(np, nt, mlen, &msg) != TP_OK) {
        goto nomem;
    }
    if (nt > 0) {
        infos = tp__alloc((size_t)nt * sizeof(*infos));
        if (infos == NULL) {
            goto free_msg;
        }
    }
    wire_rd_init(&r, "descriptor", in, len, err_p);
    bool ok = desc_parse(&r, lim, msg, infos, &mlen, &np, &nt);
    TP_ASSERT(ok);
    *msg_p = msg;
    if (infos_p != NULL) {
        *infos_p = infos;
    } else {
        tp__free(infos);
    }
    return TP_OK;

free_msg:
    tp_message_destroy(msg);
nomem:
    return tp__error_set(err_p, TP_ENOMEM,
                         "descriptor: no memory for a message of %" PRIu32
                         " payloads, %" PRIu32 " tensors and %" PRIu64
                         " bytes of metadata",
                         np, nt, mlen);
}
