/* SPDX-License-Identifier: Apache-2.0 */
/* wire.h (internal) - the pipe's wire format: frame headers, brochure,
 * answer, join, message descriptor and ack. Encoders write into caller
 * buffers; decoders check every count, length and string against the
 * bounds below (and the caller's tp__pipe_limits) before they allocate or
 * copy anything, and fail with TP_EPROTO and a message that says which
 * field was wrong and why. Decoders never read past @len.
 *
 * All integers are little-endian (core/wire.h). Strings are length-prefixed
 * bytes, no NUL inside (a NUL inside is a protocol error), stored decoded
 * into NUL-terminated fixed arrays. Documented in docs/pipe-wire.md.
 *
 * Frame header, 16 bytes, before every body on a pipe connection:
 *   u8 type (TP_FRAME_*), u8 version (TP_PIPE_WIRE_VERSION), u16 zero,
 *   u32 aux (type-specific, 0 if unused), u64 body_len
 */
#ifndef TP_PIPE_WIRE_H
#define TP_PIPE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/pipe.h>

#include "channel/chan_info.h"
#include "core/error.h"

// 2: tensors carry a device index; 3: the answer names a device channel,
// and a tensor's channel info may be 160 bytes (cuda_ipc's handles)
#define TP_PIPE_WIRE_VERSION 3u
_Static_assert(TP_CHAN_INFO_MAX == 160u,
               "the descriptor's info bound is 160 bytes");
#define TP_FRAME_HDR_LEN 16u

enum {
    TP_FRAME_BROCHURE = 1, // connector -> listener, first frame of a pipe
    TP_FRAME_ANSWER = 2,   // listener -> connector
    TP_FRAME_JOIN = 3,     // first frame of an extra connection (reg id)
    TP_FRAME_MESSAGE = 4,  // a message descriptor (then inline data)
    TP_FRAME_ACK = 5,      // reader -> writer: tensors of a message copied
};

// Bounds of the handshake (fixed, part of the protocol).
#define TP_WIRE_MAX_NAME      31u    // transport / channel name bytes
#define TP_WIRE_MAX_DOMAIN    255u   // domain descriptor bytes
#define TP_WIRE_MAX_ADDR      255u   // address bytes
#define TP_WIRE_MAX_CTXNAME   127u   // context (worker) name bytes
#define TP_WIRE_MAX_REASON    1023u  // refusal reason / notes bytes
#define TP_WIRE_MAX_BACKENDS  16u    // transports, and channels, per brochure
#define TP_WIRE_MAX_CONNS     64u    // extra connections in an answer (all)
#define TP_WIRE_MAX_HANDSHAKE 65536u // body_len of brochure/answer/join
#define TP_WIRE_MAX_CHAN_INFO                                                  \
    TP_CHAN_INFO_MAX // per-tensor channel info bytes (160)

typedef struct tp__frame_hdr {
    uint8_t fh_type;
    uint8_t fh_version;
    uint32_t fh_aux;
    uint64_t fh_body_len;
} tp__frame_hdr;

void tp__frame_hdr_encode(uint8_t out[TP_FRAME_HDR_LEN],
                          const tp__frame_hdr *h);
// Checks version == TP_PIPE_WIRE_VERSION, the zero field, and a known
// type. Does not check body_len (the caller knows the bound per type).
tp_status tp__frame_hdr_decode(const uint8_t in[TP_FRAME_HDR_LEN],
                               tp__frame_hdr *h, tp_error **err_p);

// ---- brochure ----
// Body: u16 ntransports, u16 nchannels, u8 ctxname_len, ctxname,
//   per transport: u8 name_len, name, u16 domain_len, domain,
//                  u16 addr_len, addr
//   per channel:   u8 name_len, name, u16 domain_len, domain
typedef struct tp__brochure_entry {
    char be_name[TP_WIRE_MAX_NAME + 1];
    char be_domain[TP_WIRE_MAX_DOMAIN + 1];
    char be_addr[TP_WIRE_MAX_ADDR + 1]; // transports only ("" for channels)
} tp__brochure_entry;

typedef struct tp__brochure {
    char b_ctxname[TP_WIRE_MAX_CTXNAME + 1];
    uint16_t b_ntransports;
    uint16_t b_nchannels;
    tp__brochure_entry b_transports[TP_WIRE_MAX_BACKENDS];
    tp__brochure_entry b_channels[TP_WIRE_MAX_BACKENDS];
} tp__brochure;

// Bytes tp__brochure_encode writes for @b; 0 if a field breaks a bound.
size_t tp__brochure_size(const tp__brochure *b);
// Writes the body into @out (capacity @cap >= tp__brochure_size). Returns
// bytes written; 0 if @cap is too small or a field breaks a bound.
size_t tp__brochure_encode(const tp__brochure *b, uint8_t *out, size_t cap);
// Decodes exactly @len bytes (trailing bytes are an error).
tp_status tp__brochure_decode(const uint8_t *in, size_t len, tp__brochure *b,
                              tp_error **err_p);

// ---- answer ----
// Body: u8 accepted (0/1), u8 ctxname_len, ctxname, u16 reason_len, reason,
//   then if accepted:
//   u8 name_len, transport name, u16 addr_len, addr, u64 transport_reg_id,
//   u8 name_len, channel name, u16 nconns,
//   per conn: u16 addr_len, addr, u64 reg_id,
//   u8 name_len, device channel name (0: none), u16 nconns,
//   per conn: u16 addr_len, addr, u64 reg_id
// transport_reg_id 0: keep using the connection the brochure came on.
// The channel carries host buffers; the device channel (optional) the
// tensors whose sender's buffer is on a CUDA device (docs/cuda.md). The
// device channel's conns follow the channel's in a_conns, and the join
// index counts across both.
typedef struct tp__answer_conn {
    char ac_addr[TP_WIRE_MAX_ADDR + 1];
    uint64_t ac_reg_id;
} tp__answer_conn;

typedef struct tp__answer {
    bool a_accepted;
    char a_ctxname[TP_WIRE_MAX_CTXNAME + 1];
    char a_reason[TP_WIRE_MAX_REASON +
                  1]; // why refused; when accepted: notes on the other choices
    char a_transport[TP_WIRE_MAX_NAME + 1];
    char a_transport_addr[TP_WIRE_MAX_ADDR + 1];
    uint64_t a_transport_reg_id;
    char a_channel[TP_WIRE_MAX_NAME + 1];
    uint16_t a_nconns; // the channel's conns: a_conns[0, a_nconns)
    char a_dchannel[TP_WIRE_MAX_NAME + 1]; // "" = no device channel
    uint16_t a_dnconns; // its conns: a_conns[a_nconns, + a_dnconns)
    tp__answer_conn a_conns[TP_WIRE_MAX_CONNS];
} tp__answer;

// As for the brochure; 0 also when a conn's reg id is 0. A refusal
// encodes only accepted, ctxname and reason.
size_t tp__answer_size(const tp__answer *a);
size_t tp__answer_encode(const tp__answer *a, uint8_t *out, size_t cap);
tp_status tp__answer_decode(const uint8_t *in, size_t len, tp__answer *a,
                            tp_error **err_p);

// ---- join: body u64 reg_id (nonzero), u16 conn index ----
#define TP_JOIN_LEN 10u
void tp__join_encode(uint64_t reg_id, uint16_t index, uint8_t out[TP_JOIN_LEN]);
tp_status tp__join_decode(const uint8_t *in, size_t len, uint64_t *reg_id_p,
                          uint16_t *index_p, tp_error **err_p);

// ---- message descriptor ----
// Body: u64 metadata_len, u32 npayloads, u32 ntensors,
//   per payload: u64 len,
//   per tensor:  u64 len, u8 device type (0 = cpu, 1 = cuda), u8 device
//                index (0 for cpu), u8 info_len, info,
//   metadata bytes.
// Limits come from the configuration (tp__pipe_limits); each payload and
// tensor length must be <= max_buf_len and their sum must not overflow.
typedef struct tp__pipe_limits {
    uint64_t max_metadata; // TP_PIPE_MAX_METADATA
    uint32_t max_payloads; // TP_PIPE_MAX_PAYLOADS
    uint32_t max_tensors;  // TP_PIPE_MAX_TENSORS
    uint64_t max_buf_len;  // TP_PIPE_MAX_BUF_BYTES, per payload / tensor
} tp__pipe_limits;

// The largest descriptor body the limits allow (for the frame check).
uint64_t tp__desc_max_size(const tp__pipe_limits *lim);

// Per-tensor channel info (tp__chan_info, channel/chan_info.h): bytes the
// sending channel attaches to a tensor, up to TP_WIRE_MAX_CHAN_INFO.

// Bytes of the descriptor of @msg with @infos (one per tensor; NULL means
// no channel info for any tensor). 0 if @msg cannot be encoded (a channel
// info over TP_WIRE_MAX_CHAN_INFO, a device type above 255, a NULL
// metadata or array with a nonzero length or count, a device index
// outside 0..255): a valid descriptor
// is at least 16 bytes, so callers must check for 0.
uint64_t tp__desc_size(const tp_message *msg, const tp__chan_info *infos);
// Writes the descriptor into @out (capacity @cap). Returns bytes written,
// 0 if it does not fit.
uint64_t tp__desc_encode(const tp_message *msg, const tp__chan_info *infos,
                         uint8_t *out, uint64_t cap);
// Decodes exactly @len bytes into a new message (tp_message_destroy frees
// it): metadata copied into a new buffer, payload and tensor lengths set,
// their data NULL, devices from the wire (the sender's: cpu, or cuda with
// its index; a cpu index other than 0 is an error).
// @infos_p receives a new array of ntensors channel infos (tp__free), NULL
// when ntensors is 0. Every count and length is checked against @lim
// before anything is allocated.
tp_status tp__desc_decode(const uint8_t *in, uint64_t len,
                          const tp__pipe_limits *lim, tp_message **msg_p,
                          tp__chan_info **infos_p, tp_error **err_p);

// ---- ack: body u64 message sequence number (first message is 0) ----
#define TP_ACK_LEN 8u

// ---- messages (pipe/message.c) ----
// As tp_message_create, plus @metadata_len bytes of uninitialised metadata
// owned by the message (msg->metadata, NULL when 0), freed with it by
// tp_message_destroy. One allocation. TP_ENOMEM on failure or when the
// sizes do not fit in size_t.
tp_status tp__message_create(uint32_t npayloads, uint32_t ntensors,
                             uint64_t metadata_len, tp_message **msg_p);

#endif
