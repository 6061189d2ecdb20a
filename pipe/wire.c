// SPDX-License-Identifier: Apache-2.0
// wire.c - encoders and decoders of the pipe's wire format (pipe/wire.h,
// docs/pipe-wire.md): frame header, brochure, answer, join; the message
// descriptor is in wire_desc.c, the cursors both use in wire_io.h.
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
#include "pipe/wire_io.h"

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
    size_t dname = wire_str_size(1, a->a_dchannel, sizeof(a->a_dchannel),
                                 TP_WIRE_MAX_NAME);
    unsigned nall = (unsigned)a->a_nconns + a->a_dnconns;
    if (tname == 0 || taddr == 0 || cname == 0 || dname == 0 ||
        nall > TP_WIRE_MAX_CONNS) {
        return 0;
    }
    total += tname + taddr + 8 + cname + 2 + dname + 2;
    for (unsigned i = 0; i < nall; i++) {
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

static void
answer_put_conns(wire_wr *w, const tp__answer_conn *c, uint16_t n)
{
    wire_put_u16(w, n);
    for (unsigned i = 0; i < n; i++) {
        wire_put_str(w, 2, c[i].ac_addr, sizeof(c[i].ac_addr));
        wire_put_u64(w, c[i].ac_reg_id);
    }
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
        answer_put_conns(&w, a->a_conns, a->a_nconns);
        wire_put_str(&w, 1, a->a_dchannel, sizeof(a->a_dchannel));
        answer_put_conns(&w, a->a_conns + a->a_nconns, a->a_dnconns);
    }
    TP_ASSERT(w.w_off == size);
    return size;
}

// A conn count and its conns, at most @max ("device ": the device
// channel's, which follow the channel's in a_conns).
static bool
answer_parse_conns(wire_rd *r, const char *kind, tp__answer_conn *c,
                   unsigned max, uint16_t *n_p)
{
    if (!wire_u16(r, WIRE_FIELD(*kind ? "device conn count" : "conn count"),
                  n_p)) {
        return false;
    }
    if (*n_p > max) {
        wire_fail(r, "%sconn count %u exceeds the limit %u (%u in all)", kind,
                  *n_p, max, TP_WIRE_MAX_CONNS);
        return false;
    }
    for (unsigned i = 0; i < *n_p; i++) {
        const char *what = *kind ? "device conn" : "conn";
        if (!wire_str(r, 2, TP_WIRE_MAX_ADDR, c[i].ac_addr,
                      WIRE_FIELD_I(what, i, "addr")) ||
            !wire_u64(r, WIRE_FIELD_I(what, i, "reg id"), &c[i].ac_reg_id)) {
            return false;
        }
        if (c[i].ac_reg_id == 0) {
            wire_fail(r, "%sconn %u reg id is 0 (reg ids are nonzero)", kind,
                      i);
            return false;
        }
    }
    return true;
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
        !answer_parse_conns(r, "", a->a_conns, TP_WIRE_MAX_CONNS,
                            &a->a_nconns) ||
        !wire_str(r, 1, TP_WIRE_MAX_NAME, a->a_dchannel,
                  WIRE_FIELD("device channel name")) ||
        !answer_parse_conns(r, "device ", a->a_conns + a->a_nconns,
                            TP_WIRE_MAX_CONNS - a->a_nconns, &a->a_dnconns)) {
        return false;
    }
    if (a->a_dchannel[0] == '\0' && a->a_dnconns != 0) {
        wire_fail(r, "%u device conns without a device channel", a->a_dnconns);
        return false;
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
