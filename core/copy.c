// SPDX-License-Identifier: Apache-2.0
// copy.c - memcpy with non-temporal stores (see copy.h).

#include "copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE2__))
#include <emmintrin.h>

void
tp__memcpy_stream(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (n < 256) {
        memcpy(d, s, n);
        return;
    }
    // Align the destination to 16 bytes with a plain copy of the head.
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    while (n >= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
        d += 64;
        s += 64;
        n -= 64;
    }
    _mm_sfence();
    memcpy(d, s, n);
}

#else

void
tp__memcpy_stream(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

#endif
