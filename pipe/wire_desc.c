// SPDX-License-Identifier: Apache-2.0
// wire_desc.c - the message descriptor of the pipe's wire format
// (pipe/wire.h, docs/pipe-wire.md): its size bounds, encoder and the
// decoder, which parses twice: once to validate (no allocation), then,
// knowing the input is good, once more into the new message.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "pipe/wire_io.h"

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
        bool staged =
            infos != NULL && (infos[i].ci_flags & TP_CHAN_INFO_STAGED) != 0;
        wire_put_u8(&w, (uint8_t)(t->device.type | (staged ? 0x80u : 0u)));
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

// Checks a payload's or tensor's length against the limit and adds it to
// @total, failing if the message's total length would overflow 64 bits.
static bool
desc_len_ok(wire_rd *r, const tp__pipe_limits *lim, const char *what,
            uint32_t i, uint64_t len, uint64_t *total)
{
    if (len > lim->max_buf_len) {
        wire_fail(r,
                  "%s %" PRIu32 " length %" PRIu64 " exceeds the limit %" PRIu64
                  " (TP_PIPE_MAX_BUF_BYTES)",
                  what, i, len, lim->max_buf_len);
        return false;
    }
    if (len > UINT64_MAX - *total) {
        wire_fail(r,
                  "%s %" PRIu32 " length %" PRIu64
                  ": the total length of the message overflows 64 bits",
                  what, i, len);
        return false;
    }
    *total += len;
    return true;
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
        if (!desc_len_ok(r, lim, "payload", i, len, &total)) {
            return false;
        }
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
        if (!desc_len_ok(r, lim, "tensor", i, len, &total)) {
            return false;
        }
        if (!wire_u8(r, WIRE_FIELD_I("tensor", i, "device type"), &type)) {
            return false;
        }
        // Bit 7: a CUDA tensor staged although there is a device channel.
        bool staged = (type & 0x80u) != 0;
        if (staged && (type & 0x7fu) == TP_DEVICE_CUDA) {
            type = TP_DEVICE_CUDA;
        } else if (type != TP_DEVICE_CPU && type != TP_DEVICE_CUDA) {
            wire_fail(r,
                      "tensor %" PRIu32 " device type %u is not supported "
                      "(0 cpu, 1 cuda, 129 cuda staged)",
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
            infos[i].ci_flags = staged ? TP_CHAN_INFO_STAGED : 0;
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
