/* SPDX-License-Identifier: Apache-2.0 */
/* chan_info.h - the bytes a channel attaches to one tensor: its sending
 * end fills them (cma: pid + address; xth: a token; cuda_ipc: the
 * memory handle; basic/mpt: none), the
 * pipe carries them in the message descriptor (pipe/wire.h, bounded by
 * TP_CHAN_INFO_MAX there too), and the receiving end reads them. A type of
 * the channel contract, so channel/ needs nothing of pipe/.
 */
#ifndef TP_CHANNEL_CHAN_INFO_H
#define TP_CHANNEL_CHAN_INFO_H

#include <stdint.h>

#define TP_CHAN_INFO_MAX 160u // per-tensor channel info bytes (wire bound)

// ci_flags: the pipe's, not the channel's (the descriptor carries them in
// the tensor's device type byte, docs/pipe-wire.md).
#define TP_CHAN_INFO_STAGED                                                    \
    0x01u // a CUDA tensor staged through host memory
          // although the pipe has a device channel

typedef struct tp__chan_info {
    uint8_t ci_len;
    uint8_t ci_flags; // TP_CHAN_INFO_*
    uint8_t ci_bytes[TP_CHAN_INFO_MAX];
} tp__chan_info;

#endif
