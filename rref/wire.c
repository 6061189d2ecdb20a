// SPDX-License-Identifier: Apache-2.0
// wire.c - encoding and checking the RRef protocol's headers and RRef
// sections (wire.h). Everything decoded here comes from the network.

#include "wire.h"

#include <string.h>

#include "core/wire.h"

static void
id_put(uint8_t *p, rr_id id)
{
    tp__put_u32le(p, id.w);
    tp__put_u32le(p + 4, 0);
    tp__put_u64le(p + 8, id.n);
}

// Reads an id; false if its reserved bytes are not zero.
static bool
id_get(const uint8_t *p, rr_id *id)
{
    id->w = tp__get_u32le(p);
    id->n = tp__get_u64le(p + 8);
    return tp__get_u32le(p + 4) == 0;
}

size_t
tp__rr_hdr_size(unsigned kind)
{
    switch (kind) {
    case RR_KIND_REMOTE:
        return 2 * RR_ID_BYTES + 8 + RR_ID_BYTES;
    case RR_KIND_FETCH:
    case RR_KIND_CHILD_ACCEPT:
        return RR_ID_BYTES;
    case RR_KIND_FORK:
    case RR_KIND_DELETE:
        return 2 * RR_ID_BYTES;
    case RR_KIND_CALL:
        return RR_ID_BYTES + 8;
    default:
        return 0;
    }
}

void
tp__rr_hdr_encode(unsigned kind, const rr_msg *m, uint8_t *buf)
{
    switch (kind) {
    case RR_KIND_REMOTE:
        id_put(buf, m->m_id);
        id_put(buf + RR_ID_BYTES, m->m_fork);
        tp__put_u32le(buf + 2 * RR_ID_BYTES, m->m_flags);
        tp__put_u32le(buf + 2 * RR_ID_BYTES + 4, 0);
        id_put(buf + 2 * RR_ID_BYTES + 8, m->m_target);
        break;
    case RR_KIND_FETCH:
        id_put(buf, m->m_id);
        break;
    case RR_KIND_CHILD_ACCEPT:
        id_put(buf, m->m_fork);
        break;
    case RR_KIND_FORK:
    case RR_KIND_DELETE:
        id_put(buf, m->m_id);
        id_put(buf + RR_ID_BYTES, m->m_fork);
        break;
    case RR_KIND_CALL:
        id_put(buf, m->m_id);
        tp__put_u32le(buf + RR_ID_BYTES, m->m_flags);
        tp__put_u32le(buf + RR_ID_BYTES + 4, 0);
        break;
    default:
        break;
    }
}

// Checks an id read from the network: made by a worker of the world, and
// numbered from 1.
static tp_status
id_check(const char *what, rr_id id, uint32_t world, tp_error **err_p)
{
    if (id.w >= world || id.n == 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rref %s (%u:%llu): not an id of a world of %u",
                             what, id.w, (unsigned long long)id.n, world);
    }
    return TP_OK;
}

tp_status
tp__rr_hdr_decode(unsigned kind, const uint8_t *buf, size_t len, uint32_t from,
                  uint32_t world, rr_msg *m, tp_error **err_p)
{
    memset(m, 0, sizeof(*m));
    size_t want = tp__rr_hdr_size(kind);
    if (want == 0) {
        return tp__error_set(err_p, TP_EPROTO, "rref message of kind %u", kind);
    }
    if (buf == NULL || len != want) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rref message of kind %u with a %zu-byte "
                             "header (%zu expected)",
                             kind, buf != NULL ? len : 0, want);
    }
    bool ok = true;
    tp_status st = TP_OK;
    switch (kind) {
    case RR_KIND_REMOTE:
        ok = id_get(buf, &m->m_id) && id_get(buf + RR_ID_BYTES, &m->m_fork) &&
             tp__get_u32le(buf + 2 * RR_ID_BYTES + 4) == 0 &&
             id_get(buf + 2 * RR_ID_BYTES + 8, &m->m_target);
        m->m_flags = tp__get_u32le(buf + 2 * RR_ID_BYTES);
        if (ok && (m->m_flags & ~(RR_REMOTE_OBJECT | RR_REMOTE_PROXY)) != 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref REMOTE with unknown flags 0x%x",
                                 m->m_flags);
        }
        if (ok && (m->m_flags & RR_REMOTE_OBJECT) &&
            (m->m_flags & RR_REMOTE_PROXY)) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref REMOTE both constructs and proxies");
        }
        // The creator names the new RRef and its own fork with one id.
        if (ok && (m->m_id.w != from || !rr_id_eq(m->m_id, m->m_fork))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref REMOTE from rank %u creating RRef "
                                 "(%u:%llu) with fork (%u:%llu)",
                                 from, m->m_id.w, (unsigned long long)m->m_id.n,
                                 m->m_fork.w, (unsigned long long)m->m_fork.n);
        }
        if (ok) {
            st = id_check("id", m->m_id, world, err_p);
        }
        if (ok && st == TP_OK && (m->m_flags & RR_REMOTE_PROXY)) {
            st = id_check("target", m->m_target, world, err_p);
        } else if (ok && st == TP_OK &&
                   (m->m_target.w != 0 || m->m_target.n != 0)) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref REMOTE with a target but no proxy "
                                 "flag");
        }
        break;
    case RR_KIND_FETCH:
        ok = id_get(buf, &m->m_id);
        st = ok ? id_check("id", m->m_id, world, err_p) : TP_OK;
        break;
    case RR_KIND_CHILD_ACCEPT:
        ok = id_get(buf, &m->m_fork);
        st = ok ? id_check("fork", m->m_fork, world, err_p) : TP_OK;
        break;
    case RR_KIND_FORK:
    case RR_KIND_DELETE:
        ok = id_get(buf, &m->m_id) && id_get(buf + RR_ID_BYTES, &m->m_fork);
        if (ok) {
            st = id_check("id", m->m_id, world, err_p);
        }
        if (ok && st == TP_OK) {
            st = id_check("fork", m->m_fork, world, err_p);
        }
        break;
    case RR_KIND_CALL:
        ok = id_get(buf, &m->m_id) && tp__get_u32le(buf + RR_ID_BYTES + 4) == 0;
        m->m_flags = tp__get_u32le(buf + RR_ID_BYTES);
        if (ok && (m->m_flags & ~RR_CALL_METHOD) != 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref CALL with unknown flags 0x%x",
                                 m->m_flags);
        }
        st = ok ? id_check("id", m->m_id, world, err_p) : TP_OK;
        break;
    default:
        break;
    }
    if (!ok) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rref message of kind %u: reserved bytes not "
                             "zero",
                             kind);
    }
    return st;
}

size_t
tp__rr_sec_size(size_t n)
{
    return RR_SEC_HDR + n * RR_DESC_BYTES;
}

void
tp__rr_sec_encode(const rr_desc *d, size_t n, uint8_t *buf)
{
    tp__put_u32le(buf, (uint32_t)n);
    tp__put_u32le(buf + 4, 0);
    uint8_t *p = buf + RR_SEC_HDR;
    for (size_t i = 0; i < n; i++, p += RR_DESC_BYTES) {
        id_put(p, d[i].d_id);
        id_put(p + RR_ID_BYTES, d[i].d_fork);
        tp__put_u32le(p + 2 * RR_ID_BYTES, d[i].d_owner);
        tp__put_u32le(p + 2 * RR_ID_BYTES + 4, d[i].d_flags);
    }
}

void
tp__rr_sec_desc(const uint8_t *buf, size_t i, rr_desc *d)
{
    const uint8_t *p = buf + RR_SEC_HDR + i * RR_DESC_BYTES;
    id_get(p, &d->d_id);
    id_get(p + RR_ID_BYTES, &d->d_fork);
    d->d_owner = tp__get_u32le(p + 2 * RR_ID_BYTES);
    d->d_flags = tp__get_u32le(p + 2 * RR_ID_BYTES + 4);
}

tp_status
tp__rr_sec_check(const uint8_t *buf, size_t len, uint32_t from, uint32_t world,
                 size_t max, size_t *n_p, tp_error **err_p)
{
    if (len < RR_SEC_HDR) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rref section of %zu bytes, shorter than its "
                             "header",
                             len);
    }
    uint32_t n = tp__get_u32le(buf);
    if (tp__get_u32le(buf + 4) != 0) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rref section: reserved bytes not zero");
    }
    if (n == 0 || n > max || len != tp__rr_sec_size(n)) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rref section of %zu bytes describing %u RRefs "
                             "(1..%zu of %d bytes each)",
                             len, n, max, RR_DESC_BYTES);
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p = buf + RR_SEC_HDR + (size_t)i * RR_DESC_BYTES;
        rr_desc d;
        if (tp__get_u32le(p + 4) != 0 ||
            tp__get_u32le(p + RR_ID_BYTES + 4) != 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref %u: reserved bytes not zero", i);
        }
        tp__rr_sec_desc(buf, i, &d);
        if (d.d_id.w >= world || d.d_id.n == 0 || d.d_owner >= world) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref %u: RRef (%u:%llu) owned by rank %u "
                                 "in a world of %u",
                                 i, d.d_id.w, (unsigned long long)d.d_id.n,
                                 d.d_owner, world);
        }
        if (d.d_fork.w != from || d.d_fork.n == 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref %u: fork (%u:%llu) sent by rank %u "
                                 "(a fork is made by its sender)",
                                 i, d.d_fork.w, (unsigned long long)d.d_fork.n,
                                 from);
        }
        if ((d.d_flags & ~RR_DESC_OBJECT) != 0) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "rref %u: unknown flags 0x%x", i, d.d_flags);
        }
    }
    *n_p = n;
    return TP_OK;
}
