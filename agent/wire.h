/* SPDX-License-Identifier: Apache-2.0 */
/* wire.h (internal) - the agent's messages: the metadata of a pipe message
 * (docs/rpc-wire.md). Payload 0 carries the args bytes (or an error's
 * text); the pipe's tensors carry the args tensors.
 *
 * Metadata, little-endian:
 *   0  u32 magic "TPRA"       4  u8 version (2)      5  u8 kind
 *   6  u16 fn_name_len        8  u64 call_id        16  u64 fn_id
 *  24  i32 status            28  u32 ntensors       32  u32 ext_len
 *  36  u32 src_rank          40  fn name, then ext bytes, then per tensor
 *      u8 dtype, u8 ndim, u16 0, u32 0, ndim x i64 size.
 * The ext bytes are sections: u8 id (0..7, ascending), u8 0, u16 0,
 * u32 length, then the bytes (proto.h).
 */
#ifndef TP_AGENT_WIRE_H
#define TP_AGENT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/rpc.h>
#include <tpipe/tensor.h>

#include "core/error.h"

#define AG_WIRE_MAGIC   0x41525054u /* "TPRA" little-endian */
#define AG_WIRE_VERSION 2
#define AG_WIRE_HDR     40
#define AG_WIRE_MAX_EXT (256u << 10)
/* Extension sections: ids 0..AG_WIRE_MAX_SECTIONS-1, 8-byte headers. */
#define AG_WIRE_MAX_SECTIONS 8
#define AG_WIRE_SEC_HDR      8
/* The longest error text an ERROR message may carry. */
#define AG_WIRE_MAX_ERRMSG (64u << 10)

/* Message kinds. 16..31 belong to the RRef protocol, 32..47 to
 * distributed autograd (proto.h): requests, answered by RESPONSE or ERROR.
 * The decoder accepts those ranges; the agent closes the pipe with a
 * protocol error naming a kind that no installed protocol owns. */
typedef enum ag_kind {
    AG_KIND_REQUEST = 1,  /* call fn_id/fn_name with the args */
    AG_KIND_RESPONSE = 2, /* the result of call_id */
    AG_KIND_ERROR = 3,    /* call_id failed: status + text in payload 0 */
} ag_kind;

typedef struct ag_tensor_meta {
    tp_dtype tm_dtype;
    int tm_ndim;
    int64_t tm_shape[TP_TENSOR_MAX_DIMS];
    uint64_t tm_nbytes;  /* numel * dtype size, overflow-checked */
    tp_device tm_device; /* where it goes on the receiver (device maps) */
} ag_tensor_meta;

typedef struct ag_hdr {
    ag_kind h_kind;
    uint64_t h_call_id;
    uint64_t h_fn_id;
    int32_t h_status;
    uint32_t h_ntensors;
    uint32_t h_src_rank;
    const char *h_fn_name; /* not NUL-terminated; h_fn_name_len bytes */
    uint16_t h_fn_name_len;
    const uint8_t *h_ext;
    uint32_t h_ext_len;
    /* The sections of h_ext (decode only): NULL/0 where absent. */
    const uint8_t *h_sec[AG_WIRE_MAX_SECTIONS];
    uint32_t h_sec_len[AG_WIRE_MAX_SECTIONS];
    uint8_t h_sec_mask; /* bit i: section i is present */
} ag_hdr;

/* True for a kind a protocol may own (proto.h). */
static inline bool
ag_kind_is_proto(unsigned kind)
{
    return kind >= 16 && kind <= 47;
}

/* The metadata size of a message with these parts. */
size_t tp__ag_wire_size(size_t fn_name_len, size_t ext_len,
                        const tp_args *args);
/* Writes the metadata into @buf (tp__ag_wire_size bytes). */
/* @targets: per tensor, the device it arrives on at the receiver (NULL:
 * every one on the CPU). */
void tp__ag_wire_encode(uint8_t *buf, const ag_hdr *h, const tp_args *args,
                        const tp_device *targets);
/*
 * Checks and decodes @len bytes of metadata from a message with @npayloads
 * and @ntensors buffers whose lengths are @tensor_lens. Tensor metadata go
 * to @metas (room for @ntensors). TP_EPROTO with a message saying what is
 * wrong (the caller names the peer).
 */
tp_status tp__ag_wire_decode(const uint8_t *buf, size_t len, uint32_t npayloads,
                             uint32_t ntensors, const uint64_t *tensor_lens,
                             ag_hdr *h, ag_tensor_meta *metas,
                             tp_error **err_p);
/* True if @name is 1..@max bytes of letters, digits and @extra. */
bool tp__ag_name_valid(const char *name, size_t len, size_t max,
                       const char *extra);
/* Checks a function name (1..TP_RPC_MAX_FN_NAME of [A-Za-z0-9_.:/-]). */
bool tp__ag_fn_name_valid(const char *name, size_t len);

#endif
