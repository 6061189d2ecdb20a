// SPDX-License-Identifier: Apache-2.0
// fuzz_desc.c - libFuzzer target for tp__desc_decode. Every input is
// decoded under two sets of limits (generous but memory-bounded, and tiny,
// so the bound checks fire). A rejection must be a TP_EPROTO with a
// "descriptor: " message and no output; an accepted input must respect
// the limits and re-encode to exactly the same bytes (the encoding is
// canonical).

#include <string.h>

#include "fuzz.h"
#include "pipe/wire.h"

static const tp__pipe_limits fuzz_desc_limits[] = {
    // max_metadata 1 MiB keeps every allocation small; UINT64_MAX buffer
    // lengths let the overflow check of the length sum run.
    {.max_metadata = 1u << 20,
     .max_payloads = 1024,
     .max_tensors = 1024,
     .max_buf_len = UINT64_MAX},
    {.max_metadata = 64,
     .max_payloads = 4,
     .max_tensors = 4,
     .max_buf_len = 4096},
};

static void
fuzz_desc_one(const uint8_t *data, size_t size, const tp__pipe_limits *lim)
{
    tp_message *msg = NULL;
    tp__chan_info *infos = NULL;
    tp_error *err = NULL;
    tp_status st = tp__desc_decode(data, size, lim, &msg, &infos, &err);
    if (st != TP_OK) {
        FUZZ_CHECK(st == TP_EPROTO);
        FUZZ_CHECK(msg == NULL && infos == NULL);
        FUZZ_CHECK(tp_error_status(err) == TP_EPROTO);
        FUZZ_CHECK(strncmp(tp_error_message(err), "descriptor: ", 12) == 0);
        tp_error_unref(err);
        return;
    }
    FUZZ_CHECK(err == NULL);
    FUZZ_CHECK(size <= tp__desc_max_size(lim));
    FUZZ_CHECK(msg->metadata_len <= lim->max_metadata);
    FUZZ_CHECK(msg->npayloads <= lim->max_payloads);
    FUZZ_CHECK(msg->ntensors <= lim->max_tensors);
    FUZZ_CHECK((msg->ntensors == 0) == (infos == NULL));
    uint64_t total = 0;
    for (uint32_t i = 0; i < msg->npayloads; i++) {
        const tp_msg_buf *b = &msg->payloads[i];
        FUZZ_CHECK(b->len <= lim->max_buf_len);
        FUZZ_CHECK(b->data == NULL && !b->pipe_owned);
        FUZZ_CHECK(total <= UINT64_MAX - b->len);
        total += b->len;
    }
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        const tp_msg_buf *b = &msg->tensors[i];
        FUZZ_CHECK(b->len <= lim->max_buf_len);
        FUZZ_CHECK(b->data == NULL && !b->pipe_owned);
        FUZZ_CHECK(b->device.type == TP_DEVICE_CUDA ||
                   (b->device.type == TP_DEVICE_CPU && b->device.index == 0));
        FUZZ_CHECK(b->device.index >= 0 && b->device.index <= 255);
        FUZZ_CHECK(infos[i].ci_len <= TP_WIRE_MAX_CHAN_INFO);
        FUZZ_CHECK(total <= UINT64_MAX - b->len);
        total += b->len;
    }
    // Canonical: decode then encode gives back the input.
    FUZZ_CHECK(tp__desc_size(msg, infos) == size);
    uint8_t *out = malloc(size);
    FUZZ_CHECK(out != NULL);
    FUZZ_CHECK(tp__desc_encode(msg, infos, out, size) == size);
    FUZZ_CHECK(memcmp(out, data, size) == 0);
    free(out);
    tp_message_destroy(msg);
    free(infos);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i < sizeof(fuzz_desc_limits) / sizeof(*fuzz_desc_limits);
         i++) {
        fuzz_desc_one(data, size, &fuzz_desc_limits[i]);
    }
    return 0;
}
