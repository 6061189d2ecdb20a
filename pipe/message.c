// SPDX-License-Identifier: Apache-2.0
// message.c - tp_message allocation. A message is one block: a hidden
// header, the public tp_message, the payload and tensor arrays, and (for
// messages made by tp__desc_decode) the metadata bytes. Keeping the
// metadata inside the block means "the message owns its metadata" needs no
// flag and stays right even if the caller repoints msg->metadata.

#include <stdalign.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/cuda.h"
#include "core/platform.h"
#include "pipe/wire.h"

// Catches tp_message_destroy on a message not made here (a bug in the
// caller: a tp_message on the stack, or a double free).
#define MESSAGE_MAGIC      0x6d736731u // "msg1"
#define MESSAGE_DEAD_MAGIC 0x64656164u // "dead"

typedef struct message_block {
    uint32_t mb_magic;
    tp_message mb_msg;
} message_block;

// Offset of the buffer arrays: the header rounded up to their alignment.
#define MESSAGE_BUFS_OFF                                                       \
    ((sizeof(message_block) + alignof(tp_msg_buf) - 1) / alignof(tp_msg_buf) * \
     alignof(tp_msg_buf))

tp_status
tp__message_create(uint32_t npayloads, uint32_t ntensors, uint64_t metadata_len,
                   tp_message **msg_p)
{
    // Sizes are computed in 64 bits (2^32 buffers of a few dozen bytes
    // cannot overflow) and then checked against SIZE_MAX, so 32-bit hosts
    // refuse instead of wrapping.
    uint64_t nbufs = (uint64_t)npayloads + ntensors;
    uint64_t bufs_bytes = nbufs * sizeof(tp_msg_buf);
    uint64_t total = MESSAGE_BUFS_OFF + bufs_bytes;
    if (metadata_len > UINT64_MAX - total || total + metadata_len > SIZE_MAX) {
        return TP_ENOMEM;
    }
    total += metadata_len;

    char *p = tp__alloc((size_t)total);
    if (p == NULL) {
        return TP_ENOMEM;
    }
    // Zero the header and the arrays; the metadata is overwritten by the
    // caller, so it is left as is.
    memset(p, 0, (size_t)(MESSAGE_BUFS_OFF + bufs_bytes));
    message_block *mb = (message_block *)(void *)p;
    mb->mb_magic = MESSAGE_MAGIC;

    tp_message *msg = &mb->mb_msg;
    tp_msg_buf *bufs = (tp_msg_buf *)(void *)(p + MESSAGE_BUFS_OFF);
    // memset zero is a valid tp_msg_buf: data NULL, len 0, device CPU 0,
    // pipe_owned false.
    msg->payloads = npayloads > 0 ? bufs : NULL;
    msg->npayloads = npayloads;
    msg->tensors = ntensors > 0 ? bufs + npayloads : NULL;
    msg->ntensors = ntensors;
    msg->metadata = metadata_len > 0 ? p + MESSAGE_BUFS_OFF + bufs_bytes : NULL;
    msg->metadata_len = metadata_len;
    *msg_p = msg;
    return TP_OK;
}

tp_status
tp_message_create(uint32_t npayloads, uint32_t ntensors, tp_message **msg_p)
{
    if (msg_p == NULL) {
        return TP_EINVAL;
    }
    return tp__message_create(npayloads, ntensors, 0, msg_p);
}

static void
message_free_bufs(tp_msg_buf *bufs, uint32_t n)
{
    if (bufs == NULL) {
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (bufs[i].pipe_owned) {
            if (bufs[i].device.type == TP_DEVICE_CUDA) {
                tp__cuda_free(bufs[i].device.index, bufs[i].data);
            } else {
                tp__free(bufs[i].data);
            }
            bufs[i].data = NULL;
            bufs[i].pipe_owned = false;
        }
    }
}

void
tp_message_destroy(tp_message *msg)
{
    if (msg == NULL) {
        return;
    }
    message_block *mb = TP_CONTAINER_OF(msg, message_block, mb_msg);
    TP_ASSERT(mb->mb_magic == MESSAGE_MAGIC);
    // Buffers are freed through the public fields, so a caller that
    // marked a buffer pipe_owned itself hands it over (tp__free) too.
    message_free_bufs(msg->payloads, msg->npayloads);
    message_free_bufs(msg->tensors, msg->ntensors);
    mb->mb_magic = MESSAGE_DEAD_MAGIC;
    tp__free(mb);
}
