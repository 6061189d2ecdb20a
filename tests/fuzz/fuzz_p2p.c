// SPDX-License-Identifier: Apache-2.0
// fuzz_p2p.c - libFuzzer target for tp__p2p_hdr_check, the check of every
// message a process group's pipe receives, and tp__p2p_answer_decode, the
// check of a query's answer (collectives/p2p.c).
//
// Input: byte 0 = payloads (mod 2), byte 1 = tensors (mod 2), bytes 2-9
// the payload's length, 10-17 the tensor's (u64le), byte 18 the world size
// (1..16), byte 19 this rank (mod world), byte 20 the pipe's known source
// (mod world + 1, minus 1: -1 = none yet), then the metadata. A rejection
// must say why; an accepted header must be consistent with the shape and
// re-encode to exactly the input bytes. The metadata is also given to the
// answer decoder, under the same rules.

#include <string.h>

#include "collectives/p2p.h"
#include "core/wire.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 21) {
        return 0;
    }
    uint32_t np = data[0] % 2;
    uint32_t nt = data[1] % 2;
    uint64_t plen = tp__get_u64le(data + 2);
    uint64_t tlen = tp__get_u64le(data + 10);
    int world = data[18] % 16 + 1;
    int self = data[19] % world;
    int pipe_src = (int)(data[20] % (world + 1)) - 1;
    data += 21;
    size -= 21;
    tp__p2p_answer a;
    char awhy[160] = "";
    if (tp__p2p_answer_decode(data, size, &a, awhy, sizeof(awhy))) {
        FUZZ_CHECK(size == TP__P2P_ANSWER_LEN);
        FUZZ_CHECK(a.has_group || a.next == 0);
        uint8_t ans[TP__P2P_ANSWER_LEN];
        tp__p2p_answer_encode(ans, &a);
        FUZZ_CHECK(memcmp(ans, data, TP__P2P_ANSWER_LEN) == 0);
    } else {
        FUZZ_CHECK(strlen(awhy) > 0);
    }
    tp__p2p_hdr h;
    char why[160] = "";
    if (!tp__p2p_hdr_check(data, size, np, plen, nt, tlen, world, self,
                           pipe_src, &h, why, sizeof(why))) {
        FUZZ_CHECK(strlen(why) > 0);
        return 0;
    }
    FUZZ_CHECK(size == TP__P2P_HDR);
    FUZZ_CHECK(h.kind >= 0 && h.kind <= 5);
    FUZZ_CHECK(h.src >= 0 && h.src < world && h.src != self);
    FUZZ_CHECK(pipe_src < 0 || h.src == pipe_src);
    FUZZ_CHECK((h.nbytes > 0) == (nt == 1));
    FUZZ_CHECK(nt == 0 || tlen == h.nbytes);
    FUZZ_CHECK(np == (h.kind == 2 || h.kind == 5 ? 1u : 0u));
    FUZZ_CHECK(h.kind != 2 || plen <= TP__P2P_MAX_REASON);
    FUZZ_CHECK(h.kind != 5 || plen == TP__P2P_ANSWER_LEN);
    FUZZ_CHECK(h.kind < 2 || h.nbytes == 0);
    FUZZ_CHECK(h.kind < 4 || h.tag != 0);
    uint8_t again[TP__P2P_HDR];
    tp__p2p_hdr_encode(again, &h);
    FUZZ_CHECK(memcmp(again, data, TP__P2P_HDR) == 0);
    return 0;
}
