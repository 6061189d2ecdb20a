// SPDX-License-Identifier: Apache-2.0
// fuzz_dist_autograd.c - libFuzzer target for distributed autograd's
// decoders (autograd/dist/wire.c, docs/dist_autograd.md): the section a
// message carries, the BACKWARD header and the RELEASE / ABORT header.
//
// Input: byte 0 = what (mod 3: section, BACKWARD, note), byte 1 = the
// world size (0 reads as 256), byte 2 = the args' tensor count, then the
// bytes. A rejection must be TP_EPROTO with a message; an accepted input
// must obey every rule the decoder promises and encode back to exactly
// the input bytes.

#include <string.h>

#include "autograd/dist/wire.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) {
        return 0;
    }
    unsigned what = data[0] % 3;
    uint32_t world = data[1] == 0 ? 256 : data[1];
    size_t ntensors = data[2];
    data += 3;
    size -= 3;
    tp_error *err = NULL;
    tp_status st;
    uint8_t back[DA_BW_HDR + 4 * 256];
    if (what == 0) {
        da_sec s;
        st = tp__da_sec_decode(data, size, world, ntensors, &s, &err);
        if (st == TP_OK) {
            FUZZ_CHECK(s.s_ctx >= 0 &&
                       (uint32_t)da_ctx_creator(s.s_ctx) < world);
            FUZZ_CHECK((s.s_n == 0) == (s.s_send == 0));
            FUZZ_CHECK(s.s_n <= ntensors);
            FUZZ_CHECK(size == DA_SEC_FIXED + 4 * (size_t)s.s_n);
            for (uint32_t i = 0; i < s.s_n; i++) {
                uint32_t k = tp__da_sec_idx(&s, i);
                FUZZ_CHECK(k < ntensors);
                FUZZ_CHECK(i == 0 || k > tp__da_sec_idx(&s, i - 1));
            }
            tp__da_sec_encode_fixed(s.s_ctx, s.s_send, s.s_n, back);
            FUZZ_CHECK(memcmp(back, data, DA_SEC_FIXED) == 0);
        }
    } else if (what == 1) {
        da_bw b;
        st = tp__da_bw_decode(data, size, world, &b, &err);
        if (st == TP_OK) {
            FUZZ_CHECK(size == DA_BW_HDR && b.b_send != 0 && b.b_pass != 0);
            FUZZ_CHECK((uint32_t)da_ctx_creator(b.b_ctx) < world);
            tp__da_bw_encode(&b, back);
            FUZZ_CHECK(memcmp(back, data, DA_BW_HDR) == 0);
        }
    } else {
        da_note n;
        st = tp__da_note_decode(data, size, world, &n, &err);
        if (st == TP_OK) {
            FUZZ_CHECK(size == DA_NOTE_HDR);
            FUZZ_CHECK((uint32_t)da_ctx_creator(n.n_ctx) < world);
            tp__da_note_encode(&n, back);
            FUZZ_CHECK(memcmp(back, data, DA_NOTE_HDR) == 0);
        }
    }
    if (st != TP_OK) {
        FUZZ_CHECK(st == TP_EPROTO && tp_error_status(err) == TP_EPROTO);
        FUZZ_CHECK(strlen(tp_error_message(err)) > 0);
        tp_error_unref(err);
    } else {
        FUZZ_CHECK(err == NULL);
    }
    return 0;
}
