// SPDX-License-Identifier: Apache-2.0
// fuzz_brochure.c - libFuzzer target for tp__brochure_decode. A rejection
// must be a TP_EPROTO with a "brochure: " message and leave the output
// zeroed; an accepted input must respect every bound and re-encode to
// exactly the same bytes.

#include <string.h>

#include "fuzz.h"
#include "pipe/wire.h"

static tp__brochure fuzz_b;
static const tp__brochure fuzz_zero;
static uint8_t fuzz_out[TP_WIRE_MAX_HANDSHAKE];

static void
fuzz_check_entry(const tp__brochure_entry *e, bool transport)
{
    FUZZ_CHECK(strlen(e->be_name) <= TP_WIRE_MAX_NAME);
    FUZZ_CHECK(strlen(e->be_domain) <= TP_WIRE_MAX_DOMAIN);
    FUZZ_CHECK(strlen(e->be_addr) <= (transport ? TP_WIRE_MAX_ADDR : 0));
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_error *err = NULL;
    tp_status st = tp__brochure_decode(data, size, &fuzz_b, &err);
    if (st != TP_OK) {
        FUZZ_CHECK(st == TP_EPROTO);
        FUZZ_CHECK(tp_error_status(err) == TP_EPROTO);
        FUZZ_CHECK(strncmp(tp_error_message(err), "brochure: ", 10) == 0);
        FUZZ_CHECK(memcmp(&fuzz_b, &fuzz_zero, sizeof(fuzz_b)) == 0);
        tp_error_unref(err);
        return 0;
    }
    FUZZ_CHECK(err == NULL);
    FUZZ_CHECK(size <= TP_WIRE_MAX_HANDSHAKE);
    FUZZ_CHECK(strlen(fuzz_b.b_ctxname) <= TP_WIRE_MAX_CTXNAME);
    FUZZ_CHECK(fuzz_b.b_ntransports <= TP_WIRE_MAX_BACKENDS);
    FUZZ_CHECK(fuzz_b.b_nchannels <= TP_WIRE_MAX_BACKENDS);
    for (unsigned i = 0; i < fuzz_b.b_ntransports; i++) {
        fuzz_check_entry(&fuzz_b.b_transports[i], true);
    }
    for (unsigned i = 0; i < fuzz_b.b_nchannels; i++) {
        fuzz_check_entry(&fuzz_b.b_channels[i], false);
    }
    FUZZ_CHECK(tp__brochure_size(&fuzz_b) == size);
    FUZZ_CHECK(tp__brochure_encode(&fuzz_b, fuzz_out, sizeof(fuzz_out)) ==
               size);
    FUZZ_CHECK(memcmp(fuzz_out, data, size) == 0);
    return 0;
}
