/* SPDX-License-Identifier: Apache-2.0 */
/* wire_io.h (internal to pipe/) - the cursors the pipe's wire encoders and
 * decoders share (wire.c: frame header, brochure, answer, join;
 * wire_desc.c: the message descriptor). A wire_rd checks that bytes are
 * there before every read, so nothing past its length is touched, and
 * names the field of each failure; a wire_wr writes into a buffer sized
 * beforehand. Static inline: no symbols of their own. */
#ifndef TP_PIPE_WIRE_IO_H
#define TP_PIPE_WIRE_IO_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/wire.h"
#include "pipe/wire.h"

static inline uint64_t
wire_sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline uint64_t
wire_sat_mul(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

// The length of a NUL-terminated string stored in an array of @cap bytes,
// or @cap if it is not terminated there (a broken bound).
static inline size_t
wire_strlen(const char *s, size_t cap)
{
    const char *nul = memchr(s, 0, cap);
    return nul == NULL ? cap : (size_t)(nul - s);
}

// A field, named only when an error needs it: "ctxname", "transport 1
// domain", "conn 3 reg id".
typedef struct wire_field {
    const char *f_name;
    long f_idx; // -1: no index
    const char *f_sub;
} wire_field;

#define WIRE_FIELD(name)             ((wire_field){(name), -1, NULL})
#define WIRE_FIELD_I(name, idx, sub) ((wire_field){(name), (long)(idx), (sub)})

static inline void
wire_field_fmt(char *buf, size_t cap, wire_field f)
{
    if (f.f_idx < 0) {
        snprintf(buf, cap, "%s%s%s", f.f_name, f.f_sub ? " " : "",
                 f.f_sub ? f.f_sub : "");
    } else {
        snprintf(buf, cap, "%s %ld%s%s", f.f_name, f.f_idx, f.f_sub ? " " : "",
                 f.f_sub ? f.f_sub : "");
    }
}

typedef struct wire_rd {
    const uint8_t *r_in;
    uint64_t r_len;
    uint64_t r_off;
    const char *r_what; // "brochure", "answer", "join", "descriptor"
    tp_error **r_err_p;
} wire_rd;

static inline void
wire_rd_init(wire_rd *r, const char *what, const uint8_t *in, uint64_t len,
             tp_error **err_p)
{
    r->r_in = in;
    r->r_len = len;
    r->r_off = 0;
    r->r_what = what;
    r->r_err_p = err_p;
}

static inline tp_status wire_fail(wire_rd *r, const char *fmt, ...)
    TP_PRINTF(2, 3);

// Sets the error "<what>: <fmt>" and returns TP_EPROTO.
static inline tp_status
wire_fail(wire_rd *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return tp__error_set(r->r_err_p, TP_EPROTO, "%s: %s", r->r_what, msg);
}

// Checks that @n more bytes are there.
static inline bool
wire_need(wire_rd *r, uint64_t n, wire_field f)
{
    uint64_t left = r->r_len - r->r_off;
    if (n <= left) {
        return true;
    }
    char name[96];
    wire_field_fmt(name, sizeof(name), f);
    wire_fail(r,
              "truncated at byte %" PRIu64 " (%s, need %" PRIu64 " more bytes)",
              r->r_len, name, n - left);
    return false;
}

static inline bool
wire_u8(wire_rd *r, wire_field f, uint8_t *v_p)
{
    if (!wire_need(r, 1, f)) {
        return false;
    }
    *v_p = r->r_in[r->r_off];
    r->r_off += 1;
    return true;
}

static inline bool
wire_u16(wire_rd *r, wire_field f, uint16_t *v_p)
{
    if (!wire_need(r, 2, f)) {
        return false;
    }
    *v_p = tp__get_u16le(r->r_in + r->r_off);
    r->r_off += 2;
    return true;
}

static inline bool
wire_u32(wire_rd *r, wire_field f, uint32_t *v_p)
{
    if (!wire_need(r, 4, f)) {
        return false;
    }
    *v_p = tp__get_u32le(r->r_in + r->r_off);
    r->r_off += 4;
    return true;
}

static inline bool
wire_u64(wire_rd *r, wire_field f, uint64_t *v_p)
{
    if (!wire_need(r, 8, f)) {
        return false;
    }
    *v_p = tp__get_u64le(r->r_in + r->r_off);
    r->r_off += 8;
    return true;
}

// Reads a string with a @width-byte (1 or 2) length prefix, at most @max
// bytes and no NUL inside, into @out (capacity > @max), NUL-terminated.
static inline bool
wire_str(wire_rd *r, int width, size_t max, char *out, wire_field f)
{
    uint64_t n;
    if (width == 1) {
        uint8_t n8;
        if (!wire_u8(r, f, &n8)) {
            return false;
        }
        n = n8;
    } else {
        uint16_t n16;
        if (!wire_u16(r, f, &n16)) {
            return false;
        }
        n = n16;
    }
    char name[96];
    if (n > max) {
        wire_field_fmt(name, sizeof(name), f);
        wire_fail(r, "%s length %" PRIu64 " exceeds the limit %zu", name, n,
                  max);
        return false;
    }
    if (!wire_need(r, n, f)) {
        return false;
    }
    const uint8_t *s = r->r_in + r->r_off;
    const uint8_t *nul = memchr(s, 0, (size_t)n);
    if (nul != NULL) {
        wire_field_fmt(name, sizeof(name), f);
        wire_fail(r, "%s contains a NUL byte at offset %td", name, nul - s);
        return false;
    }
    memcpy(out, s, (size_t)n);
    out[n] = '\0';
    r->r_off += n;
    return true;
}

// Checks that the whole input was used.
static inline bool
wire_end(wire_rd *r)
{
    if (r->r_off == r->r_len) {
        return true;
    }
    wire_fail(r, "%" PRIu64 " trailing bytes after byte %" PRIu64,
              r->r_len - r->r_off, r->r_off);
    return false;
}

// The matching writer: callers check the total size first, so writes never
// overflow; the cursor asserts it anyway.
typedef struct wire_wr {
    uint8_t *w_out;
    uint64_t w_cap;
    uint64_t w_off;
} wire_wr;

static inline void
wire_put_u8(wire_wr *w, uint8_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 1);
    w->w_out[w->w_off++] = v;
}

static inline void
wire_put_u16(wire_wr *w, uint16_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 2);
    tp__put_u16le(w->w_out + w->w_off, v);
    w->w_off += 2;
}

static inline void
wire_put_u32(wire_wr *w, uint32_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 4);
    tp__put_u32le(w->w_out + w->w_off, v);
    w->w_off += 4;
}

static inline void
wire_put_u64(wire_wr *w, uint64_t v)
{
    TP_ASSERT(w->w_cap - w->w_off >= 8);
    tp__put_u64le(w->w_out + w->w_off, v);
    w->w_off += 8;
}

static inline void
wire_put_bytes(wire_wr *w, const void *p, uint64_t n)
{
    TP_ASSERT(w->w_cap - w->w_off >= n);
    if (n > 0) {
        memcpy(w->w_out + w->w_off, p, (size_t)n);
    }
    w->w_off += n;
}

// Writes a length-prefixed string (already checked against its bound).
static inline void
wire_put_str(wire_wr *w, int width, const char *s, size_t cap)
{
    size_t n = wire_strlen(s, cap);
    if (width == 1) {
        wire_put_u8(w, (uint8_t)n);
    } else {
        wire_put_u16(w, (uint16_t)n);
    }
    wire_put_bytes(w, s, n);
}

// Encoded size of a string field: its prefix and bytes, or 0 when the
// string breaks its bound (or is not terminated within @cap).
static inline size_t
wire_str_size(int width, const char *s, size_t cap, size_t max)
{
    size_t n = wire_strlen(s, cap);
    return n > max ? 0 : (size_t)width + n;
}

#endif
