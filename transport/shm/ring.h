/* SPDX-License-Identifier: Apache-2.0 */
/* ring.h - the single-producer single-consumer byte ring that the shm
 * transport keeps in a memfd shared by two processes.
 *
 * Layout of the memfd (SHM_RING_DATA_OFF + size bytes):
 *   0     line 0: constants, written by the producer before the fd is sent
 *   64    line 1: rh_head (release) and rh_producer_cpu, by the producer
 *   128   line 2: rh_tail, written by the consumer (release)
 *   192   line 3: rh_consumer_sleeping, set by the consumer before it sleeps
 *   256   line 4: rh_producer_waiting, set by the producer on a full ring
 *   4096  data, size bytes (a power of two), indexed by counter & (size - 1)
 *
 * head and tail are free-running 64-bit byte counters: the bytes in the
 * ring are [tail, head), so head - tail <= size always. Each side keeps its
 * own counter in private memory and only publishes it; the counter read
 * from the other side is untrusted and is checked before use.
 *
 * Both processes must agree on this layout: every offset is asserted, and
 * the atomics must be lock-free (an atomic implemented with a lock would
 * not work across processes).
 */
#ifndef TP_TRANSPORT_SHM_RING_H
#define TP_TRANSPORT_SHM_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>

#include "core/copy.h"
#include "core/platform.h"

#define SHM_RING_MAGIC    "TPSHMRNG" // 8 bytes, not NUL-terminated
#define SHM_RING_VERSION  1u
#define SHM_RING_LINE     64u
#define SHM_RING_DATA_OFF 4096u
#define SHM_RING_MIN_SIZE 4096u
#define SHM_RING_MAX_SIZE (1u << 30)

typedef struct shm_ring_hdr {
    // Line 0: constants (plain data, read once by the consumer to check).
    uint8_t rh_magic[8];
    uint8_t rh_version[4]; // u32le
    uint8_t rh_pad0[4];
    uint8_t rh_size[8];     // u64le, data bytes
    uint8_t rh_data_off[8]; // u64le
    uint8_t rh_pad1[SHM_RING_LINE - 32];
    // Line 1: producer. rh_producer_cpu: the CPU the producer's loop
    // thread last ran on (-1 unknown), so that the consumer does not spin
    // while the producer waits for that very CPU.
    _Atomic uint64_t rh_head;
    _Atomic int32_t rh_producer_cpu;
    uint8_t rh_pad2[SHM_RING_LINE - 12];
    // Line 2: consumer.
    _Atomic uint64_t rh_tail;
    uint8_t rh_pad3[SHM_RING_LINE - 8];
    // Line 3: 1 while the consumer may be asleep; the producer wakes it
    // through the consumer's eventfd after publishing.
    _Atomic uint32_t rh_consumer_sleeping;
    uint8_t rh_pad4[SHM_RING_LINE - 4];
    // Line 4: 1 while the producer waits for space; the consumer wakes it
    // through the producer's eventfd after consuming.
    _Atomic uint32_t rh_producer_waiting;
    uint8_t rh_pad5[SHM_RING_LINE - 4];
} shm_ring_hdr;

_Static_assert(offsetof(shm_ring_hdr, rh_magic) == 0, "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_version) == 8, "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_size) == 16, "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_data_off) == 24, "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_head) == 64, "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_producer_cpu) == 72,
               "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_tail) == 128, "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_consumer_sleeping) == 192,
               "shm ring layout");
_Static_assert(offsetof(shm_ring_hdr, rh_producer_waiting) == 256,
               "shm ring layout");
_Static_assert(sizeof(shm_ring_hdr) == 320, "shm ring layout");
_Static_assert(sizeof(shm_ring_hdr) <= SHM_RING_DATA_OFF, "shm ring layout");
_Static_assert(sizeof(_Atomic uint64_t) == 8, "shm ring: 8-byte atomics");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "shm ring: 4-byte atomics");
// uint64_t is unsigned long on LP64, uint32_t unsigned int.
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 && sizeof(long) == 8,
               "shm ring: 64-bit atomics must be always lock-free");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && sizeof(int) == 4,
               "shm ring: 32-bit atomics must be always lock-free");

// A mapped ring, from either side.
typedef struct shm_ring {
    shm_ring_hdr *r_hdr;
    uint8_t *r_data;
    uint64_t r_size;
    uint64_t r_mask;
    size_t r_map_len; // 0 when not mapped
} shm_ring;

// Copies @n bytes from @src into the ring at counter @pos (wrapping).
static inline void
shm_ring_put(const shm_ring *r, uint64_t pos, const void *src, uint64_t n)
{
    uint64_t off = pos & r->r_mask;
    uint64_t first = r->r_size - off;
    if (n <= first) {
        memcpy(r->r_data + off, src, n);
    } else {
        memcpy(r->r_data + off, src, first);
        memcpy(r->r_data, (const uint8_t *)src + first, n - first);
    }
}

// Copies @n bytes from the ring at counter @pos (wrapping) into @dst.
// @stream: non-temporal stores into @dst (a large read the consumer will
// not touch again soon; see core/copy.h).
static inline void
shm_ring_get(const shm_ring *r, uint64_t pos, void *dst, uint64_t n,
             bool stream)
{
    uint64_t off = pos & r->r_mask;
    uint64_t first = TP_MIN(n, r->r_size - off);
    if (stream) {
        tp__memcpy_stream(dst, r->r_data + off, first);
        tp__memcpy_stream((uint8_t *)dst + first, r->r_data, n - first);
    } else {
        memcpy(dst, r->r_data + off, first);
        memcpy((uint8_t *)dst + first, r->r_data, n - first);
    }
}

#endif
