// SPDX-License-Identifier: Apache-2.0
// wire.c - distributed autograd's section and headers (wire.h). Every
// decoder checks every byte: fixed fields, lengths, ids of existing
// workers; what it accepts encodes back to the same bytes.

#include "wire.h"

#include "core/error.h"
#include "core/wire.h"

static bool
ctx_ok(int64_t id, uint32_t world)
{
    return id >= 0 && (uint32_t)da_ctx_creator(id) < world;
}

tp_status
tp__da_sec_decode(const uint8_t *p, size_t len, uint32_t world, size_t ntensors,
                  da_sec *s, tp_error **err_p)
{
    if (len < DA_SEC_FIXED) {
        return tp__error_set(err_p, TP_EPROTO,
                             "section of %zu bytes, shorter than its header",
                             len);
    }
    if (p[0] != DA_WIRE_VERSION || p[1] != 0 || tp__get_u32le(p + 4) != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "section of version %u (this worker speaks %u) "
                             "or with unknown flags",
                             p[0], DA_WIRE_VERSION);
    }
    s->s_n = (uint32_t)p[2] | (uint32_t)p[3] << 8;
    s->s_ctx = (int64_t)tp__get_u64le(p + 8);
    s->s_send = tp__get_u64le(p + 16);
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
        uint32_t k = tp__da_sec_idx(s, i);
        if (k >= ntensors || (i > 0 && k <= tp__da_sec_idx(s, i - 1))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "tensor index %u of %zu, or not ascending", k,
                                 ntensors);
        }
    }
    return TP_OK;
}

uint32_t
tp__da_sec_idx(const da_sec *s, uint32_t i)
{
    return tp__get_u32le(s->s_idx + 4 * (size_t)i);
}

void
tp__da_sec_encode_fixed(int64_t ctx, uint64_t send, uint32_t n,
                        uint8_t out[DA_SEC_FIXED])
{
    out[0] = DA_WIRE_VERSION;
    out[1] = 0;
    out[2] = (uint8_t)n;
    out[3] = (uint8_t)(n >> 8);
    tp__put_u32le(out + 4, 0);
    tp__put_u64le(out + 8, (uint64_t)ctx);
    tp__put_u64le(out + 16, send);
}

tp_status
tp__da_bw_decode(const uint8_t *p, size_t len, uint32_t world, da_bw *b,
                 tp_error **err_p)
{
    if (p == NULL || len != DA_BW_HDR || p[0] != DA_WIRE_VERSION ||
        (p[1] & ~DA_BW_RETAIN) != 0 || p[2] != 0 || p[3] != 0 ||
        tp__get_u32le(p + 4) != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "BACKWARD header of %zu bytes (want %d), or of "
                             "another version or flags",
                             len, DA_BW_HDR);
    }
    b->b_ctx = (int64_t)tp__get_u64le(p + 8);
    b->b_send = tp__get_u64le(p + 16);
    b->b_pass = tp__get_u64le(p + 24);
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
tp__da_bw_encode(const da_bw *b, uint8_t out[DA_BW_HDR])
{
    out[0] = DA_WIRE_VERSION;
    out[1] = b->b_retain ? DA_BW_RETAIN : 0;
    out[2] = out[3] = 0;
    tp__put_u32le(out + 4, 0);
    tp__put_u64le(out + 8, (uint64_t)b->b_ctx);
    tp__put_u64le(out + 16, b->b_send);
    tp__put_u64le(out + 24, b->b_pass);
}

tp_status
tp__da_note_decode(const uint8_t *p, size_t len, uint32_t world, da_note *n,
                   tp_error **err_p)
{
    if (p == NULL || len != DA_NOTE_HDR || p[0] != DA_WIRE_VERSION ||
        p[1] != 0 || p[2] != 0 || p[3] != 0 || tp__get_u32le(p + 4) != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "note header of %zu bytes (want %d), or of "
                             "another version",
                             len, DA_NOTE_HDR);
    }
    n->n_ctx = (int64_t)tp__get_u64le(p + 8);
    n->n_pass = tp__get_u64le(p + 16);
    if (!ctx_ok(n->n_ctx, world)) {
        return tp__error_set(err_p, TP_EPROTO,
                             "note for context %lld of no worker (world %u)",
                             (long long)n->n_ctx, world);
    }
    return TP_OK;
}

void
tp__da_note_encode(const da_note *n, uint8_t out[DA_NOTE_HDR])
{
    out[0] = DA_WIRE_VERSION;
    out[1] = out[2] = out[3] = 0;
    tp__put_u32le(out + 4, 0);
    tp__put_u64le(out + 8, (uint64_t)n->n_ctx);
    tp__put_u64le(out + 16, n->n_pass);
}
