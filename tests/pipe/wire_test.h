/* SPDX-License-Identifier: Apache-2.0 */
/* wire_test.h - what the sources of wire_test share: the check that a
 * decoder failed with TP_EPROTO, the leak check at the end of a case, a
 * raw byte builder for hand-made bodies (wire_test_util.c), and the cases
 * that wire_test.c's table runs (wire_test.c, wire_test_handshake.c,
 * wire_test_desc.c). */
#ifndef WIRE_TEST_H
#define WIRE_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "tp_test.h"

// The harness ends each case with _exit, which skips LeakSanitizer's
// exit-time check: cases that allocate call check_no_leaks at their end
// (a no-op without LeakSanitizer).
void check_no_leaks(void);

// Checks a decoder failed with TP_EPROTO and a message naming @needle.
#define EXPECT_PROTO(st, err, needle)                                          \
    do {                                                                       \
        tp_status s_ = (st);                                                   \
        TP_CHECKF(s_ == TP_EPROTO, "status %s, expected TP_EPROTO",            \
                  tp_status_name(s_));                                         \
        TP_CHECK((err) != NULL);                                               \
        TP_CHECK_EQ(tp_error_status(err), TP_EPROTO);                          \
        TP_CHECK_STR_CONTAINS(tp_error_message(err), (needle));                \
        tp_error_unref(err);                                                   \
        (err) = NULL;                                                          \
    } while (0)

// ---- a raw byte builder for hand-made (often malformed) bodies ----

typedef struct raw {
    uint8_t b[1 << 17];
    size_t n;
} raw;

extern raw rb; // the builder the cases share

void raw_u8(raw *r, unsigned v);
void raw_u16(raw *r, unsigned v);
void raw_u32(raw *r, uint32_t v);
void raw_u64(raw *r, uint64_t v);
// A string of @n bytes with a @width-byte length prefix (the bytes are
// 'a'.. unless @s is given).
void raw_str(raw *r, int width, const char *s, size_t n);

// ---- cases

// wire_test.c
void frame_hdr_round_trip(void);
void frame_hdr_rejects(void);
void join_round_trip_and_rejects(void);
// wire_test_handshake.c
void brochure_round_trips(void);
void brochure_encode_refuses_bad_fields(void);
void brochure_every_truncation_fails(void);
void brochure_rejects_each_bound_plus_one(void);
void brochure_rejects_nul_in_strings(void);
void answer_round_trips(void);
void answer_encode_refuses_bad_fields(void);
void answer_every_truncation_fails(void);
void answer_rejects_bad_fields(void);
// wire_test_desc.c
void desc_round_trips(void);
void desc_encode_refuses_bad_fields(void);
void desc_every_truncation_fails(void);
void desc_rejects_each_bound_plus_one(void);
void desc_rejects_overflowing_sums(void);
void desc_max_size_saturates(void);
void desc_decode_allocation(void);
void message_create_destroy(void);
void message_owned_metadata(void);

#endif
