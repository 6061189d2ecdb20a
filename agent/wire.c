// SPDX-License-Identifier: Apache-2.0
// wire.c - encoding and checking the agent's message metadata (wire.h).
// Everything decoded here comes from the network: every count, length,
// dtype and size is checked before it is used.

#include "wire.h"

#include <string.h>

#include "agent_int.h"
#include "core/wire.h"

#define AG_TMETA_FIXED 8

bool
tp__ag_name_valid(const char *name, size_t len, size_t max, const char *extra)
{
    if (len == 0 || len > max) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') ||
                  (c != '\0' && strchr(extra, c) != NULL);
        if (!ok) {
            return false;
        }
    }
    return true;
}

bool
tp__ag_fn_name_valid(const char *name, size_t len)
{
    return tp__ag_name_valid(name, len, TP_RPC_MAX_FN_NAME, "_-.:/");
}

size_t
tp__ag_wire_size(size_t fn_name_len, size_t ext_len, const tp_args *args)
{
    size_t n = AG_WIRE_HDR + fn_name_len + ext_len;
    if (args != NULL) {
        for (size_t i = 0; i < args->a_ntensors; i++) {
            n += AG_TMETA_FIXED +
                 8u * (size_t)tp_tensor_ndim(args->a_tensors[i]);
        }
    }
    return n;
}

void
tp__ag_wire_encode(uint8_t *buf, const ag_hdr *h, const tp_args *args,
                   const tp_device *targets)
{
    uint32_t nt = args != NULL ? (uint32_t)args->a_ntensors : 0;

    tp__put_u32le(buf, AG_WIRE_MAGIC);
    buf[4] = AG_WIRE_VERSION;
    buf[5] = (uint8_t)h->h_kind;
    tp__put_u16le(buf + 6, h->h_fn_name_len);
    tp__put_u64le(buf + 8, h->h_call_id);
    tp__put_u64le(buf + 16, h->h_fn_id);
    tp__put_u32le(buf + 24, (uint32_t)h->h_status);
    tp__put_u32le(buf + 28, nt);
    tp__put_u32le(buf + 32, h->h_ext_len);
    tp__put_u32le(buf + 36, h->h_src_rank);
    uint8_t *p = buf + AG_WIRE_HDR;
    if (h->h_fn_name_len > 0) {
        memcpy(p, h->h_fn_name, h->h_fn_name_len);
        p += h->h_fn_name_len;
    }
    if (h->h_ext_len > 0) {
        memcpy(p, h->h_ext, h->h_ext_len);
        p += h->h_ext_len;
    }
    for (uint32_t i = 0; i < nt; i++) {
        const tp_tensor *t = args->a_tensors[i];
        int nd = tp_tensor_ndim(t);
        const int64_t *shape = tp_tensor_shape(t);
        p[0] = (uint8_t)tp_tensor_dtype(t);
        p[1] = (uint8_t)nd;
        memset(p + 2, 0, 6);
        if (targets != NULL) { // u8 device type, u8 index (device maps)
            p[2] = (uint8_t)targets[i].type;
            p[3] = (uint8_t)targets[i].index;
        }
        p += AG_TMETA_FIXED;
        for (int d = 0; d < nd; d++) {
            tp__put_u64le(p, (uint64_t)shape[d]);
            p += 8;
        }
    }
}

// Splits h_ext into its sections: ascending ids below
// AG_WIRE_MAX_SECTIONS, zero reserved bytes, lengths within the
// extension; section 0 (a kind's header) only in protocol messages, and
// none at all in an error reply (it carries no args).
static tp_status
ag_wire_sections(ag_hdr *h, tp_error **err_p)
{
    const uint8_t *p = h->h_ext;
    size_t left = h->h_ext_len;
    int prev = -1;
    while (left > 0) {
        if (left < AG_WIRE_SEC_HDR) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc extension: %zu bytes left, short of a "
                                 "section header",
                                 left);
        }
        unsigned id = p[0];
        uint32_t slen = tp__get_u32le(p + 4);
        if (p[1] != 0 || tp__get_u16le(p + 2) != 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc extension section %u: reserved bytes "
                                 "not zero",
                                 id);
        }
        if (id >= AG_WIRE_MAX_SECTIONS || (int)id <= prev) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc extension section id %u after %d "
                                 "(ids 0..%d, ascending)",
                                 id, prev, AG_WIRE_MAX_SECTIONS - 1);
        }
        if (slen > left - AG_WIRE_SEC_HDR) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc extension section %u of %u bytes, "
                                 "%zu left",
                                 id, slen, left - AG_WIRE_SEC_HDR);
        }
        if (h->h_kind == AG_KIND_ERROR ||
            (id == 0 && !ag_kind_is_proto(h->h_kind))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc message of kind %u with extension "
                                 "section %u",
                                 (unsigned)h->h_kind, id);
        }
        h->h_sec[id] = p + AG_WIRE_SEC_HDR;
        h->h_sec_len[id] = slen;
        h->h_sec_mask |= (uint8_t)(1u << id);
        prev = (int)id;
        p += AG_WIRE_SEC_HDR + slen;
        left -= AG_WIRE_SEC_HDR + slen;
    }
    return TP_OK;
}

tp_status
tp__ag_wire_decode(const uint8_t *buf, size_t len, uint32_t npayloads,
                   uint32_t ntensors, const uint64_t *tensor_lens, ag_hdr *h,
                   ag_tensor_meta *metas, tp_error **err_p)
{
    if (len < AG_WIRE_HDR) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message of %zu bytes, shorter than the "
                             "%d-byte header",
                             len, AG_WIRE_HDR);
    }
    uint32_t magic = tp__get_u32le(buf);
    if (magic != AG_WIRE_MAGIC) {
        return tp__error_set(err_p, TP_EPROTO,
                             "not an rpc message (magic 0x%08x)", magic);
    }
    if (buf[4] != AG_WIRE_VERSION) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message version %u, this agent speaks %d",
                             buf[4], AG_WIRE_VERSION);
    }
    memset(h, 0, sizeof(*h));
    unsigned kind = buf[5];
    if ((kind < AG_KIND_REQUEST || kind > AG_KIND_ERROR) &&
        !ag_kind_is_proto(kind)) {
        return tp__error_set(err_p, TP_EPROTO, "unknown rpc message kind %u",
                             kind);
    }
    h->h_kind = (ag_kind)kind;
    h->h_fn_name_len = tp__get_u16le(buf + 6);
    h->h_call_id = tp__get_u64le(buf + 8);
    h->h_fn_id = tp__get_u64le(buf + 16);
    h->h_status = (int32_t)tp__get_u32le(buf + 24);
    h->h_ntensors = tp__get_u32le(buf + 28);
    h->h_ext_len = tp__get_u32le(buf + 32);
    h->h_src_rank = tp__get_u32le(buf + 36);

    if (h->h_ntensors != ntensors) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message describes %u tensors, carries %u",
                             h->h_ntensors, ntensors);
    }
    if (ntensors > TP_RPC_MAX_TENSORS) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message with %u tensors (at most %d)",
                             ntensors, TP_RPC_MAX_TENSORS);
    }
    if (npayloads > 1) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message with %u payloads (at most 1)",
                             npayloads);
    }
    if (h->h_ext_len > AG_WIRE_MAX_EXT) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message extension of %u bytes (at most %d)",
                             h->h_ext_len, AG_WIRE_MAX_EXT);
    }
    if (h->h_kind == AG_KIND_REQUEST) {
        if (!tp__ag_fn_name_valid(
                (const char *)buf + AG_WIRE_HDR,
                TP_MIN(h->h_fn_name_len, (size_t)(len - AG_WIRE_HDR)))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc request with a malformed function "
                                 "name (%u bytes)",
                                 h->h_fn_name_len);
        }
    } else if (ag_kind_is_proto(kind)) {
        // A protocol message may carry a name (a function, a type).
        if (h->h_fn_name_len != 0 &&
            !tp__ag_fn_name_valid(
                (const char *)buf + AG_WIRE_HDR,
                TP_MIN(h->h_fn_name_len, (size_t)(len - AG_WIRE_HDR)))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc message of kind %u with a malformed "
                                 "name (%u bytes)",
                                 kind, h->h_fn_name_len);
        }
    } else if (h->h_fn_name_len != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc reply with a function name");
    }
    if (h->h_kind == AG_KIND_ERROR) {
        if (h->h_status >= 0 || h->h_status < -1000) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc error reply with status %d",
                                 (int)h->h_status);
        }
        if (ntensors != 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc error reply with tensors");
        }
    } else if (h->h_status != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message of kind %u with status %d", kind,
                             (int)h->h_status);
    }

    size_t off = AG_WIRE_HDR;
    if ((size_t)h->h_fn_name_len > len - off) {
        goto truncated;
    }
    h->h_fn_name = (const char *)buf + off;
    off += h->h_fn_name_len;
    if ((size_t)h->h_ext_len > len - off) {
        goto truncated;
    }
    h->h_ext = buf + off;
    if (ag_wire_sections(h, err_p) != TP_OK) {
        return TP_EPROTO;
    }
    off += h->h_ext_len;
    for (uint32_t i = 0; i < ntensors; i++) {
        if (len - off < AG_TMETA_FIXED) {
            goto truncated;
        }
        ag_tensor_meta *m = &metas[i];
        unsigned dt = buf[off];
        unsigned nd = buf[off + 1];
        unsigned dtype = buf[off + 2];
        unsigned didx = buf[off + 3];
        if (dtype > TP_DEVICE_CUDA || (dtype == TP_DEVICE_CPU && didx != 0)) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc tensor %u: target device %u:%u (cpu "
                                 "is 0:0, cuda 1:index)",
                                 i, dtype, didx);
        }
        m->tm_device = (tp_device){(tp_device_type)dtype, (int)didx};
        for (unsigned k = 4; k < AG_TMETA_FIXED; k++) {
            if (buf[off + k] != 0) {
                return tp__error_set(err_p, TP_EPROTO,
                                     "rpc tensor %u: reserved bytes not zero",
                                     i);
            }
        }
        off += AG_TMETA_FIXED;
        if (dt >= TP_DTYPE_COUNT) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc tensor %u: unknown dtype %u", i, dt);
        }
        if (nd > TP_TENSOR_MAX_DIMS) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc tensor %u: %u dims (at most %d)", i, nd,
                                 TP_TENSOR_MAX_DIMS);
        }
        if (len - off < 8u * nd) {
            goto truncated;
        }
        m->tm_dtype = (tp_dtype)dt;
        m->tm_ndim = (int)nd;
        uint64_t nbytes = tp_dtype_size(m->tm_dtype);
        for (unsigned d = 0; d < nd; d++) {
            uint64_t sz = tp__get_u64le(buf + off);
            off += 8;
            if (sz > (uint64_t)INT64_MAX) {
                return tp__error_set(err_p, TP_EPROTO,
                                     "rpc tensor %u: negative size in dim %u",
                                     i, d);
            }
            if (sz != 0 && nbytes > UINT64_MAX / sz) {
                return tp__error_set(err_p, TP_EPROTO,
                                     "rpc tensor %u: shape overflows", i);
            }
            nbytes *= sz;
            m->tm_shape[d] = (int64_t)sz;
        }
        if (nbytes != tensor_lens[i]) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rpc tensor %u: shape says %llu bytes, the "
                                 "message carries %llu",
                                 i, (unsigned long long)nbytes,
                                 (unsigned long long)tensor_lens[i]);
        }
        m->tm_nbytes = nbytes;
    }
    if (off != len) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc message has %zu bytes after its last "
                             "field",
                             len - off);
    }
    return TP_OK;

truncated:
    return tp__error_set(err_p, TP_EPROTO, "rpc message truncated (%zu bytes)",
                         len);
}
