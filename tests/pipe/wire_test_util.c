// SPDX-License-Identifier: Apache-2.0
// wire_test_util.c - wire_test's helpers (wire_test.h): the leak check
// at the end of a case and a raw byte builder for hand-made (often
// malformed) bodies.

#include <tpipe/pipe.h>

#include "core/alloc.h"
#include "core/wire.h"
#include "pipe/wire.h"
#include "tp_test.h"
#include "wire_test.h"

// The harness ends each case with _exit, which skips LeakSanitizer's
// exit-time check: cases that allocate call check_no_leaks at their end.
#if defined(__SANITIZE_ADDRESS__)
#define WIRE_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WIRE_TEST_LSAN 1
#endif
#endif
#ifdef WIRE_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

void
check_no_leaks(void)
{
#ifdef WIRE_TEST_LSAN
    TP_CHECKF(__lsan_do_recoverable_leak_check() == 0, "memory leaked");
#endif
}

// ---- a raw byte builder for hand-made (often malformed) bodies ----

raw rb;

void
raw_u8(raw *r, unsigned v)
{
    TP_CHECK(r->n + 1 <= sizeof(r->b));
    r->b[r->n++] = (uint8_t)v;
}

void
raw_u16(raw *r, unsigned v)
{
    TP_CHECK(r->n + 2 <= sizeof(r->b));
    tp__put_u16le(r->b + r->n, (uint16_t)v);
    r->n += 2;
}

void
raw_u32(raw *r, uint32_t v)
{
    TP_CHECK(r->n + 4 <= sizeof(r->b));
    tp__put_u32le(r->b + r->n, v);
    r->n += 4;
}

void
raw_u64(raw *r, uint64_t v)
{
    TP_CHECK(r->n + 8 <= sizeof(r->b));
    tp__put_u64le(r->b + r->n, v);
    r->n += 8;
}

// A string of @n bytes with a @width-byte length prefix (the bytes are
// 'a'.. unless @s is given).
void
raw_str(raw *r, int width, const char *s, size_t n)
{
    if (width == 1) {
        raw_u8(r, (unsigned)n);
    } else {
        raw_u16(r, (unsigned)n);
    }
    for (size_t i = 0; i < n; i++) {
        raw_u8(r, s != NULL ? (uint8_t)s[i] : (uint8_t)('a' + i % 26));
    }
}
