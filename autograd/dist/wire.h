/* SPDX-License-Identifier: Apache-2.0 */
/* wire.h (internal) - distributed autograd's bytes on the wire
 * (docs/dist_autograd.md, "Wire"): the section a message carries, the
 * BACKWARD header and the RELEASE / ABORT note header. Pure functions, no
 * agent: fuzzed by tests/fuzz/fuzz_dist_autograd.c. */
#ifndef TP_AUTOGRAD_DIST_WIRE_H
#define TP_AUTOGRAD_DIST_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>

#define DA_WIRE_VERSION 1
/* Section: u8 version, u8 0, u16 n, u32 0, i64 ctx, u64 send id, then n
 * u32 indices (ascending) of the args' tensors the send function covers. */
#define DA_SEC_FIXED   24
#define DA_MAX_TENSORS 4096
/* BACKWARD: u8 version, u8 flags, u16 0, u32 0, i64 ctx, u64 send id, u64
 * pass id. RELEASE / ABORT: u8 version, 3 x 0, u32 0, i64 ctx, u64 pass. */
#define DA_BW_HDR    32
#define DA_NOTE_HDR  24
#define DA_BW_RETAIN 0x01
#define DA_CTX_BITS  48 /* the creator's rank above */

typedef struct da_sec {
    int64_t s_ctx;
    uint64_t s_send; /* 0: no send function (no tensor requires grad) */
    uint32_t s_n;
    const uint8_t *s_idx; /* s_n little-endian u32, in the decoded bytes */
} da_sec;

typedef struct da_bw {
    int64_t b_ctx;
    uint64_t b_send, b_pass;
    bool b_retain;
} da_bw;

typedef struct da_note {
    int64_t n_ctx;
    uint64_t n_pass;
} da_note;

/* The creator's rank of context @id. */
static inline int
da_ctx_creator(int64_t id)
{
    return (int)((uint64_t)id >> DA_CTX_BITS);
}

/* Decodes a section of @len bytes for args of @ntensors tensors in a job
 * of @world workers. TP_EPROTO with the reason in *@err_p. */
tp_status tp__da_sec_decode(const uint8_t *p, size_t len, uint32_t world,
                            size_t ntensors, da_sec *s, tp_error **err_p);
/* Index @i (< s_n) of @s. */
uint32_t tp__da_sec_idx(const da_sec *s, uint32_t i);
/* The fixed part of a section for @ctx, @send and @n indices. */
void tp__da_sec_encode_fixed(int64_t ctx, uint64_t send, uint32_t n,
                             uint8_t out[DA_SEC_FIXED]);
tp_status tp__da_bw_decode(const uint8_t *p, size_t len, uint32_t world,
                           da_bw *b, tp_error **err_p);
void tp__da_bw_encode(const da_bw *b, uint8_t out[DA_BW_HDR]);
tp_status tp__da_note_decode(const uint8_t *p, size_t len, uint32_t world,
                             da_note *n, tp_error **err_p);
void tp__da_note_encode(const da_note *n, uint8_t out[DA_NOTE_HDR]);

#endif
