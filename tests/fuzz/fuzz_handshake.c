// SPDX-License-Identifier: Apache-2.0
// fuzz_handshake.c - libFuzzer target for the rest of the handshake: the
// first input byte picks the decoder (0: frame header, 1: answer, 2:
// join; taken modulo 3), the rest is its input. Same properties as the
// other targets: clean TP_EPROTO rejections naming the body kind, and
// byte-exact re-encoding of everything accepted.

#include <string.h>

#include "fuzz.h"
#include "pipe/wire.h"

static tp__answer fuzz_a;
static const tp__answer fuzz_zero;
static uint8_t fuzz_out[TP_WIRE_MAX_HANDSHAKE];

static void
fuzz_check_rejected(tp_status st, tp_error *err, const char *prefix)
{
    FUZZ_CHECK(st == TP_EPROTO);
    FUZZ_CHECK(tp_error_status(err) == TP_EPROTO);
    FUZZ_CHECK(strncmp(tp_error_message(err), prefix, strlen(prefix)) == 0);
    tp_error_unref(err);
}

static void
fuzz_frame_hdr(const uint8_t *data, size_t size)
{
    // The decoder takes exactly 16 bytes; shorter inputs are padded with
    // zeros (the caller always has a full header).
    uint8_t in[TP_FRAME_HDR_LEN] = {0};
    memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
    tp__frame_hdr h;
    tp_error *err = NULL;
    tp_status st = tp__frame_hdr_decode(in, &h, &err);
    if (st != TP_OK) {
        fuzz_check_rejected(st, err, "frame header: ");
        return;
    }
    FUZZ_CHECK(h.fh_version == TP_PIPE_WIRE_VERSION);
    FUZZ_CHECK(h.fh_type >= TP_FRAME_BROCHURE && h.fh_type <= TP_FRAME_ACK);
    uint8_t out[TP_FRAME_HDR_LEN];
    tp__frame_hdr_encode(out, &h);
    FUZZ_CHECK(memcmp(out, in, sizeof(in)) == 0);
}

static void
fuzz_answer(const uint8_t *data, size_t size)
{
    tp_error *err = NULL;
    tp_status st = tp__answer_decode(data, size, &fuzz_a, &err);
    if (st != TP_OK) {
        fuzz_check_rejected(st, err, "answer: ");
        FUZZ_CHECK(memcmp(&fuzz_a, &fuzz_zero, sizeof(fuzz_a)) == 0);
        return;
    }
    FUZZ_CHECK(strlen(fuzz_a.a_ctxname) <= TP_WIRE_MAX_CTXNAME);
    FUZZ_CHECK(strlen(fuzz_a.a_reason) <= TP_WIRE_MAX_REASON);
    FUZZ_CHECK(strlen(fuzz_a.a_transport) <= TP_WIRE_MAX_NAME);
    FUZZ_CHECK(strlen(fuzz_a.a_transport_addr) <= TP_WIRE_MAX_ADDR);
    FUZZ_CHECK(strlen(fuzz_a.a_channel) <= TP_WIRE_MAX_NAME);
    FUZZ_CHECK(fuzz_a.a_nconns <= TP_WIRE_MAX_CONNS);
    FUZZ_CHECK(fuzz_a.a_accepted || fuzz_a.a_nconns == 0);
    for (unsigned i = 0; i < fuzz_a.a_nconns; i++) {
        FUZZ_CHECK(fuzz_a.a_conns[i].ac_reg_id != 0);
        FUZZ_CHECK(strlen(fuzz_a.a_conns[i].ac_addr) <= TP_WIRE_MAX_ADDR);
    }
    FUZZ_CHECK(tp__answer_size(&fuzz_a) == size);
    FUZZ_CHECK(tp__answer_encode(&fuzz_a, fuzz_out, sizeof(fuzz_out)) == size);
    FUZZ_CHECK(memcmp(fuzz_out, data, size) == 0);
}

static void
fuzz_join(const uint8_t *data, size_t size)
{
    uint64_t reg_id = 0;
    uint16_t index = 0;
    tp_error *err = NULL;
    tp_status st = tp__join_decode(data, size, &reg_id, &index, &err);
    if (st != TP_OK) {
        fuzz_check_rejected(st, err, "join: ");
        FUZZ_CHECK(reg_id == 0 && index == 0);
        return;
    }
    FUZZ_CHECK(size == TP_JOIN_LEN && reg_id != 0);
    uint8_t out[TP_JOIN_LEN];
    tp__join_encode(reg_id, index, out);
    FUZZ_CHECK(memcmp(out, data, TP_JOIN_LEN) == 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    switch (data[0] % 3) {
    case 0:
        fuzz_frame_hdr(data + 1, size - 1);
        break;
    case 1:
        fuzz_answer(data + 1, size - 1);
        break;
    default:
        fuzz_join(data + 1, size - 1);
        break;
    }
    return 0;
}
