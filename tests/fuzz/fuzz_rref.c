// SPDX-License-Identifier: Apache-2.0
// fuzz_rref.c - libFuzzer target for the RRef protocol's decoders
// (rref/wire.c, docs/rref.md): the headers of its six message kinds and
// the section describing the RRefs an args carries.
//
// Input: byte 0 = what (mod 7: 0..5 the header of kind 16 + n, 6 a
// section), byte 1 = the sender's rank, byte 2 = the world size (0 reads
// as 256), then the bytes. A rejection must be TP_EPROTO with a message;
// an accepted input must obey every rule the decoder promises and encode
// back to exactly the input bytes.

#include <string.h>

#include "fuzz.h"
#include "rref/wire.h"

static void
check_id(rr_id id, uint32_t world)
{
    FUZZ_CHECK(id.w < world && id.n != 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) {
        return 0;
    }
    unsigned what = data[0] % 7;
    uint32_t world = data[2] == 0 ? 256 : data[2];
    uint32_t from = data[1] % world;
    data += 3;
    size -= 3;
    tp_error *err = NULL;
    if (what < 6) {
        unsigned kind = RR_KIND_REMOTE + what;
        rr_msg m;
        tp_status st =
            tp__rr_hdr_decode(kind, data, size, from, world, &m, &err);
        if (st != TP_OK) {
            FUZZ_CHECK(st == TP_EPROTO && tp_error_status(err) == TP_EPROTO);
            FUZZ_CHECK(strlen(tp_error_message(err)) > 0);
            tp_error_unref(err);
            return 0;
        }
        FUZZ_CHECK(err == NULL && size == tp__rr_hdr_size(kind));
        switch (kind) {
        case RR_KIND_REMOTE:
            check_id(m.m_id, world);
            FUZZ_CHECK(m.m_id.w == from && rr_id_eq(m.m_id, m.m_fork));
            FUZZ_CHECK((m.m_flags & ~(RR_REMOTE_OBJECT | RR_REMOTE_PROXY)) ==
                       0);
            if (m.m_flags & RR_REMOTE_PROXY) {
                check_id(m.m_target, world);
            }
            break;
        case RR_KIND_FORK:
        case RR_KIND_DELETE:
            check_id(m.m_id, world);
            check_id(m.m_fork, world);
            break;
        case RR_KIND_CHILD_ACCEPT:
            check_id(m.m_fork, world);
            break;
        default:
            check_id(m.m_id, world);
            break;
        }
        uint8_t buf[64];
        FUZZ_CHECK(size <= sizeof(buf));
        tp__rr_hdr_encode(kind, &m, buf);
        FUZZ_CHECK(memcmp(buf, data, size) == 0);
        return 0;
    }
    size_t n = 0;
    tp_status st = tp__rr_sec_check(data, size, from, world, 4096, &n, &err);
    if (st != TP_OK) {
        FUZZ_CHECK(st == TP_EPROTO && tp_error_status(err) == TP_EPROTO);
        FUZZ_CHECK(strlen(tp_error_message(err)) > 0);
        tp_error_unref(err);
        return 0;
    }
    FUZZ_CHECK(n >= 1 && n <= 4096 && size == tp__rr_sec_size(n));
    rr_desc *d = malloc(n * sizeof(*d));
    uint8_t *buf = malloc(size);
    FUZZ_CHECK(d != NULL && buf != NULL);
    for (size_t i = 0; i < n; i++) {
        tp__rr_sec_desc(data, i, &d[i]);
        check_id(d[i].d_id, world);
        FUZZ_CHECK(d[i].d_owner < world);
        FUZZ_CHECK(d[i].d_fork.w == from && d[i].d_fork.n != 0);
        FUZZ_CHECK((d[i].d_flags & ~RR_DESC_OBJECT) == 0);
    }
    tp__rr_sec_encode(d, n, buf);
    FUZZ_CHECK(memcmp(buf, data, size) == 0);
    free(buf);
    free(d);
    return 0;
}
