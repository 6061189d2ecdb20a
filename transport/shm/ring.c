// SPDX-License-Identifier: Apache-2.0
// ring.c - the shm transport's addresses (abstract unix socket names) and
// rings: create our outbox memfd, map the peer's, copy iovecs in and out,
// and wake the peer.

#include "transport/shm/shm_impl.h"

// ---- addresses ------------------------------------------------------------

static bool
shm_name_char_ok(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
}

// "shm://NAME" -> NAME. NAME: 1..100 of [A-Za-z0-9._-].
tp_status
tp__shm_parse_addr(const char *addr, char *name, tp_error **err_p)
{
    if (strncmp(addr, SHM_SCHEME, SHM_SCHEME_LEN) != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm: bad address \"%s\": expected shm://NAME",
                             addr);
    }
    const char *n = addr + SHM_SCHEME_LEN;
    size_t len = strlen(n);
    if (len == 0 || len > SHM_NAME_MAX) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm: bad address \"%s\": the name must have 1 "
                             "to %d characters",
                             addr, SHM_NAME_MAX);
    }
    for (size_t i = 0; i < len; i++) {
        if (!shm_name_char_ok(n[i])) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "shm: bad address \"%s\": the name may "
                                 "only contain letters, digits, '.', '_' "
                                 "and '-'",
                                 addr);
        }
    }
    memcpy(name, n, len + 1);
    return TP_OK;
}

// An abstract-namespace address: sun_path[0] = '\0', then the name
// (not NUL-terminated; the length says where it ends).
socklen_t
tp__shm_sockaddr(const char *name, struct sockaddr_un *sa)
{
    size_t n = strlen(name);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int
tp__shm_peer_pid(int fd)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
        return 0;
    }
    return (int)cr.pid;
}

void
tp__shm_close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

// ---- rings ----------------------------------------------------------------

uint64_t
tp__shm_chunk(uint64_t ring_size)
{
    return TP_MIN(ring_size / 4, (uint64_t)SHM_CHUNK_MAX);
}

void
tp__shm_ring_unmap(shm_ring *r)
{
    if (r->r_map_len > 0) {
        munmap(r->r_hdr, r->r_map_len);
    }
    memset(r, 0, sizeof(*r));
}

// Creates our outbox: a sealed memfd of SHM_RING_DATA_OFF + @size bytes,
// mapped, header initialised. On success *fd_p holds the memfd.
tp_status
tp__shm_ring_create(shm_ring *r, uint64_t size, int *fd_p, tp_error **err_p)
{
    size_t len = SHM_RING_DATA_OFF + (size_t)size;
    int fd = memfd_create("tpipe-shm-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "shm: memfd_create");
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e,
                               "shm: ftruncate a ring memfd to %zu "
                               "bytes",
                               len);
    }
    // Sealed so that the peer can rely on the size: a shrunk mapping would
    // make its reads fault (SIGBUS).
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
        0) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e, "shm: seal a ring memfd");
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e, "shm: mmap %zu bytes of a ring memfd",
                               len);
    }
    shm_ring_hdr *h = p;
    memcpy(h->rh_magic, SHM_RING_MAGIC, 8);
    tp__put_u32le(h->rh_version, SHM_RING_VERSION);
    tp__put_u64le(h->rh_size, size);
    tp__put_u64le(h->rh_data_off, SHM_RING_DATA_OFF);
    atomic_store_explicit(&h->rh_head, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_tail, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_consumer_sleeping, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_producer_waiting, 0, memory_order_relaxed);
    atomic_store_explicit(&h->rh_producer_cpu, -1, memory_order_relaxed);
    r->r_hdr = h;
    r->r_data = (uint8_t *)p + SHM_RING_DATA_OFF;
    r->r_size = size;
    r->r_mask = size - 1;
    r->r_map_len = len;
    *fd_p = fd;
    return TP_OK;
}

// Checks the peer's outbox memfd and maps it as our inbox. The fd and every
// field come from the peer: nothing is trusted. On failure @why says why.
bool
tp__shm_ring_map_peer(shm_ring *r, int fd, uint64_t size, char *why,
                      size_t why_len)
{
    size_t len = SHM_RING_DATA_OFF + (size_t)size;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "fstat of the ring fd: %s", strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "the ring fd is not a memfd (mode 0%o)",
                 (unsigned)st.st_mode);
        return false;
    }
    if ((uint64_t)st.st_size != len) {
        snprintf(why, why_len,
                 "the ring memfd has %lld bytes, the hello says %zu",
                 (long long)st.st_size, len);
        return false;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(why, why_len,
                 "the ring memfd is not sealed against shrinking");
        return false;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, why_len, "mmap of the peer's ring (%zu bytes): %s", len,
                 strerror(errno));
        return false;
    }
    shm_ring_hdr *h = p;
    const char *bad = NULL;
    if (memcmp(h->rh_magic, SHM_RING_MAGIC, 8) != 0) {
        bad = "bad ring header magic";
    } else if (tp__get_u32le(h->rh_version) != SHM_RING_VERSION) {
        bad = "unsupported ring header version";
    } else if (tp__get_u64le(h->rh_size) != size ||
               tp__get_u64le(h->rh_data_off) != SHM_RING_DATA_OFF) {
        bad = "ring header geometry differs from the hello";
    } else if (atomic_load_explicit(&h->rh_tail, memory_order_acquire) != 0 ||
               atomic_load_explicit(&h->rh_head, memory_order_acquire) > size) {
        bad = "ring counters are not those of a new ring";
    }
    if (bad != NULL) {
        munmap(p, len);
        snprintf(why, why_len, "%s", bad);
        return false;
    }
    r->r_hdr = h;
    r->r_data = (uint8_t *)p + SHM_RING_DATA_OFF;
    r->r_size = size;
    r->r_mask = size - 1;
    r->r_map_len = len;
    return true;
}

// Wakes the other side through @fd if it said (in @flag) that it sleeps.
// Called right after publishing a counter with a release store.
void
tp__shm_notify(_Atomic uint32_t *flag, int fd)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(flag, memory_order_relaxed) != 0 &&
        atomic_exchange_explicit(flag, 0, memory_order_relaxed) != 0 &&
        fd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(fd, &one, sizeof(one));
        TP_UNUSED(n); // EAGAIN: the counter is already non-zero
    }
}

// Copies @n bytes between the iovs of @aio, from byte @off on, and the ring
// at counter @pos.
void
tp__shm_copy_iov(const shm_ring *r, uint64_t pos, const tp_aio *aio,
                 uint64_t off, uint64_t n, bool to_ring)
{
    unsigned i = tp__iov_seek(aio->a_iov, &off);
    while (n > 0) {
        uint64_t k = TP_MIN(n, aio->a_iov[i].iov_len - off);
        uint8_t *base = (uint8_t *)aio->a_iov[i].iov_base + off;
        if (to_ring) {
            shm_ring_put(r, pos, base, k);
        } else {
            shm_ring_get(r, pos, base, k,
                         aio->a_prov_u64[1] >= TP_COPY_STREAM_MIN);
        }
        pos += k;
        n -= k;
        off = 0;
        i++;
    }
}
