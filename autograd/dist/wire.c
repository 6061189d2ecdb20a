// SPDX-License-Identifier: Apache-2.0
// wire.c - distributed autograd's section and headers (wire.h). Every
// decoder checks every byte: fixed fields, lengths, ids of existing
// workers; what it accepts encodes back to the same bytes.

#include "wire.h"

#include "core/error.h"

void
da_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

uint32_t
da_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

void
da_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

uint64_t
da_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static bool
ctx_ok(int64_t id, uint32_t world)
{
    return id >= 0 && (uint32_t)da_ctx_creator(id) < world;
}

tp_status
da_sec_decode(const uint8_t *p, size_t len, uint32_t world, size_t ntensors,
              da_sec *s, tp_error **err_p)
{
    if (len < DA_SEC_FIXED) {
        return tp__error_set(err_p, TP_EPROTO,
                             "section of %zu bytes, shorter than its header",
                             len);
    }
    if (p[0] != DA_WIRE_VERSION || p[1] != 0 || da_get32(p + 4) != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "section of version %u (this worker speaks %u) "
                             "or with unknown flags",
                             p[0], DA_WIRE_VERSION);
    }
    s->s_n = (uint32_t)p[2] | (uint32_t)p[3] << 8;
    s->s_ctx = (int64_t)da_get64(p + 8);
    s->s_send = da_get64(p + 16);
    s->s_idx = p + DA_SEC_FIXED;
    if (s->s_n > DA_MAX_TENSORS || len != DA_SEC_FIXED + 4 * (size_t)s->s_n) {
        return tp__error_set(err_p, TP_EPROTO,
                             "section of %zu bytes for %u tensors", len,
                             s->s_n);
    }
    if (!ctx_ok(s->s_ctx, world)) {
        return tp__error_set(err_p, TP_EPROTO,
                             "context id %lld of no worker (world %u)",
                             (long long)s->s_ctx, world);
    }
    if ((s->s_n == 0) != (s->s_send == 0)) {
        return tp__error_set(err_p, TP_EPROTO,
                             "send function %llu with %u tensors",
                             (unsigned long long)s->s_send, s->s_n);
    }
    for (uint32_t i = 0; i < s->s_n; i++) {
        uint32_t k = da_sec_idx(s, i);
        if (k >= ntensors || (i > 0 && k <= da_sec_idx(s, i - 1))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "tensor index %u of %zu, or not ascending", k,
                                 ntensors);
        }
    }
    return TP_OK;
}

uint32_t
da_sec_idx(const da_sec *s, uint32_t i)
{
    return da_get32(s->s_idx + 4 * (size_t)i);
}

void
da_sec_encode_fixed(int64_t ctx, uint64_t send, uint32_t n,
                    uint8_t out[DA_SEC_FIXED])
{
    out[0] = DA_WIRE_VERSION;
    out[1] = 0;
    out[2] = (uint8_t)n;
    out[3] = (uint8_t)(n >> 8);
    da_put32(out + 4, 0);
    da_put64(out + 8, (uint64_t)ctx);
    da_put64(out + 16, send);
}

tp_status
da_bw_decode(const uint8_t *p, size_t len, uint32_t world, da_bw *b,
             tp_error **err_p)
{
    if (p == NULL || len != DA_BW_HDR || p[0] != DA_WIRE_VERSION ||
        (p[1] & ~DA_BW_RETAIN) != 0 || p[2] != 0 || p[3] != 0 ||
        da_get32(p + 4) != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "BACKWARD header of %zu bytes (want %d), or of "
                             "another version or flags",
                             len, DA_BW_HDR);
    }
    b->b_ctx = (int64_t)da_get64(p + 8);
    b->b_send = da_get64(p + 16);
    b->b_pass = da_get64(p + 24);
    b->b_retain = (p[1] & DA_BW_RETAIN) != 0;
    if (!ctx_ok(b->b_ctx, world) || b->b_send == 0 || b->b_pass == 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "BACKWARD for context %lld, send function %llu, "
                             "pass %llu",
                             (long long)b->b_ctx, (unsigned long long)b->b_send,
                             (unsigned long long)b->b_pass);
    }
    return TP_OK;
}

void
da_bw_encode(const da_bw *b, uint8_t out[DA_BW_HDR])
{
    out[0] = DA_WIRE_VERSION;
    out[1] = b->b_retain ? DA_BW_RETAIN : 0;
    out[2] = out[3] = 0;
    da_put32(out + 4, 0);
    da_put64(out + 8, (uint64_t)b->b_ctx);
    da_put64(out + 16, b->b_send);
    da_put64(out + 24, b->b_pass);
}

tp_status
da_note_decode(const uint8_t *p, size_t len, uint32_t world, da_note *n,
               tp_error **err_p)
{
    if (p == NULL || len != DA_NOTE_HDR || p[0] != DA_WIRE_VERSION ||
        p[1] != 0 || p[2] != 0 || p[3] != 0 || da_get32(p + 4) != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "note header of %zu bytes (want %d), or of "
                             "another version",
                             len, DA_NOTE_HDR);
    }
    n->n_ctx = (int64_t)da_get64(p + 8);
    n->n_pass = da_get64(p + 16);
    if (!ctx_ok(n->n_ctx, world)) {
        return tp__error_set(err_p, TP_EPROTO,
                             "note for context %lld of no worker (world %u)",
                             (long long)n->n_ctx, world);
    }
    return TP_OK;
}

void
da_note_encode(const da_note *n, uint8_t out[DA_NOTE_HDR])
{
    out[0] = DA_WIRE_VERSION;
    out[1] = out[2] = out[3] = 0;
    da_put32(out + 4, 0);
    da_put64(out + 8, (uint64_t)n->n_ctx);
    da_put64(out + 16, n->n_pass);
}
