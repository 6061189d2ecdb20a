// SPDX-License-Identifier: Apache-2.0
// wire_test.c - the pipe's wire format (pipe/wire.h): round trips of every
// body kind (empty, typical, every count and string at its bound), and
// rejection of malformed input: every truncation point of a valid
// encoding, every bound + 1, NUL inside strings, trailing bytes, bad frame
// headers, overflowing length sums. Also tp_message_create/destroy and the
// decoders' behaviour when allocations fail.
// The frame header and join cases are here; the handshake bodies' cases in
// wire_test_handshake.c, the descriptor's and tp_message's in
// wire_test_desc.c, shared helpers in wire_test_util.c (wire_test.h).

#include <tpipe/pipe.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "tp_test.h"
#include "wire_test.h"

// ---- frame header ----

void
frame_hdr_round_trip(void)
{
    for (unsigned type = TP_FRAME_BROCHURE; type <= TP_FRAME_ACK; type++) {
        tp__frame_hdr h = {(uint8_t)type, TP_PIPE_WIRE_VERSION, 0xdeadbeefu,
                           UINT64_C(0x0123456789abcdef)};
        uint8_t out[TP_FRAME_HDR_LEN];
        tp__frame_hdr_encode(out, &h);
        TP_CHECK_EQ(out[0], type);
        TP_CHECK_EQ(out[1], TP_PIPE_WIRE_VERSION);
        TP_CHECK_EQ(out[2], 0);
        TP_CHECK_EQ(out[3], 0);
        TP_CHECK_EQ(tp__get_u32le(out + 4), 0xdeadbeefu);
        TP_CHECK(tp__get_u64le(out + 8) == UINT64_C(0x0123456789abcdef));
        tp__frame_hdr d;
        tp_error *err = NULL;
        TP_CHECK_OK(tp__frame_hdr_decode(out, &d, &err), err);
        TP_CHECK_EQ(d.fh_type, type);
        TP_CHECK_EQ(d.fh_version, TP_PIPE_WIRE_VERSION);
        TP_CHECK_EQ(d.fh_aux, 0xdeadbeefu);
        TP_CHECK(d.fh_body_len == UINT64_C(0x0123456789abcdef));
    }
}

void
frame_hdr_rejects(void)
{
    tp__frame_hdr h = {TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, 0, 10};
    uint8_t good[TP_FRAME_HDR_LEN];
    uint8_t bad[TP_FRAME_HDR_LEN];
    tp__frame_hdr_encode(good, &h);
    tp__frame_hdr d = {0};
    tp_error *err = NULL;

    static const unsigned versions[] = {0, 1, 2, 4,
                                        255}; // 2: no device channel
    for (size_t i = 0; i < TP_ARRAY_LEN(versions); i++) {
        memcpy(bad, good, sizeof(bad));
        bad[1] = (uint8_t)versions[i];
        EXPECT_PROTO(tp__frame_hdr_decode(bad, &d, &err), err, "version");
    }
    static const unsigned types[] = {0, 6, 255};
    for (size_t i = 0; i < TP_ARRAY_LEN(types); i++) {
        memcpy(bad, good, sizeof(bad));
        bad[0] = (uint8_t)types[i];
        EXPECT_PROTO(tp__frame_hdr_decode(bad, &d, &err), err, "type");
    }
    for (int at = 2; at <= 3; at++) {
        memcpy(bad, good, sizeof(bad));
        bad[at] = 1;
        EXPECT_PROTO(tp__frame_hdr_decode(bad, &d, &err), err, "reserved");
    }
    // Nothing was written on failure; a NULL err_p is fine.
    TP_CHECK_EQ(d.fh_type, 0);
    memcpy(bad, good, sizeof(bad));
    bad[1] = 9;
    TP_CHECK_EQ(tp__frame_hdr_decode(bad, &d, NULL), TP_EPROTO);
    check_no_leaks();
}

// ---- join ----

void
join_round_trip_and_rejects(void)
{
    uint8_t out[TP_JOIN_LEN + 1];
    uint64_t reg = 0;
    uint16_t idx = 0;
    tp_error *err = NULL;
    tp__join_encode(UINT64_C(0xfedcba9876543210), 63, out);
    TP_CHECK_OK(tp__join_decode(out, TP_JOIN_LEN, &reg, &idx, &err), err);
    TP_CHECK(reg == UINT64_C(0xfedcba9876543210));
    TP_CHECK_EQ(idx, 63);
    tp__join_encode(1, UINT16_MAX, out);
    TP_CHECK_OK(tp__join_decode(out, TP_JOIN_LEN, &reg, &idx, &err), err);
    TP_CHECK_EQ(reg, 1);
    TP_CHECK_EQ(idx, UINT16_MAX);

    for (size_t n = 0; n < TP_JOIN_LEN; n++) {
        reg = 42;
        EXPECT_PROTO(tp__join_decode(out, n, &reg, &idx, &err), err,
                     "join: truncated at byte");
        TP_CHECK_EQ(reg, 42); // untouched on failure
    }
    out[TP_JOIN_LEN] = 0;
    EXPECT_PROTO(tp__join_decode(out, TP_JOIN_LEN + 1, &reg, &idx, &err), err,
                 "join: 1 trailing bytes after byte 10");
    tp__join_encode(0, 1, out);
    EXPECT_PROTO(tp__join_decode(out, TP_JOIN_LEN, &reg, &idx, &err), err,
                 "join: reg id is 0");
    TP_CHECK_EQ(reg, 42);
    check_no_leaks();
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(frame_hdr_round_trip),
    TP_TEST_CASE(frame_hdr_rejects),
    TP_TEST_CASE(brochure_round_trips),
    TP_TEST_CASE(brochure_encode_refuses_bad_fields),
    TP_TEST_CASE(brochure_every_truncation_fails),
    TP_TEST_CASE(brochure_rejects_each_bound_plus_one),
    TP_TEST_CASE(brochure_rejects_nul_in_strings),
    TP_TEST_CASE(answer_round_trips),
    TP_TEST_CASE(answer_encode_refuses_bad_fields),
    TP_TEST_CASE(answer_every_truncation_fails),
    TP_TEST_CASE(answer_rejects_bad_fields),
    TP_TEST_CASE(join_round_trip_and_rejects),
    TP_TEST_CASE(desc_round_trips),
    TP_TEST_CASE(desc_encode_refuses_bad_fields),
    TP_TEST_CASE(desc_every_truncation_fails),
    TP_TEST_CASE(desc_rejects_each_bound_plus_one),
    TP_TEST_CASE(desc_rejects_overflowing_sums),
    TP_TEST_CASE(desc_max_size_saturates),
    TP_TEST_CASE(desc_decode_allocation),
    TP_TEST_CASE(message_create_destroy),
    TP_TEST_CASE(message_owned_metadata),
};

TP_TEST_MAIN(cases)
