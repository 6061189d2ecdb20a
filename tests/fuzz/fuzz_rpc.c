// SPDX-License-Identifier: Apache-2.0
// fuzz_rpc.c - libFuzzer target for tp__ag_wire_decode, the RPC agent's
// message metadata decoder, and its extension sections
// (docs/rpc-wire.md).
//
// Input: byte 0 = number of tensors the pipe message carries (mod 5),
// byte 1 = number of payloads (mod 3), then one u64le length per tensor,
// then the metadata. A rejection must be TP_EPROTO with a message; an
// accepted input must be self-consistent and, when its tensors are small,
// re-encode (from tensors of the decoded dtypes and shapes) to exactly the
// input bytes.

#include <string.h>

#include "agent/agent_int.h"
#include "agent/wire.h"
#include "core/wire.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    uint32_t nt = data[0] % 5;
    uint32_t np = data[1] % 3;
    data += 2;
    size -= 2;
    if (size < 8u * nt) {
        return 0;
    }
    uint64_t lens[4];
    for (uint32_t i = 0; i < nt; i++) {
        lens[i] = tp__get_u64le(data + 8 * i);
    }
    data += 8u * nt;
    size -= 8u * nt;

    ag_hdr h;
    ag_tensor_meta metas[4];
    tp_error *err = NULL;
    tp_status st =
        tp__ag_wire_decode(data, size, np, nt, lens, &h, metas, &err);
    if (st != TP_OK) {
        FUZZ_CHECK(st == TP_EPROTO);
        FUZZ_CHECK(tp_error_status(err) == TP_EPROTO);
        FUZZ_CHECK(strlen(tp_error_message(err)) > 0);
        tp_error_unref(err);
        return 0;
    }
    FUZZ_CHECK(err == NULL);
    FUZZ_CHECK(h.h_ntensors == nt);
    FUZZ_CHECK((h.h_kind >= AG_KIND_REQUEST && h.h_kind <= AG_KIND_ERROR) ||
               ag_kind_is_proto(h.h_kind));
    FUZZ_CHECK(h.h_ext_len <= AG_WIRE_MAX_EXT);
    if (h.h_kind == AG_KIND_REQUEST) {
        FUZZ_CHECK(tp__ag_fn_name_valid(h.h_fn_name, h.h_fn_name_len));
    } else if (ag_kind_is_proto(h.h_kind)) {
        FUZZ_CHECK(h.h_fn_name_len == 0 ||
                   tp__ag_fn_name_valid(h.h_fn_name, h.h_fn_name_len));
    } else {
        FUZZ_CHECK(h.h_fn_name_len == 0);
    }
    // The sections tile the extension: each inside it, ids ascending.
    size_t covered = 0;
    for (unsigned i = 0; i < AG_WIRE_MAX_SECTIONS; i++) {
        if (h.h_sec_mask & (1u << i)) {
            FUZZ_CHECK(h.h_sec[i] >= h.h_ext + AG_WIRE_SEC_HDR &&
                       h.h_sec[i] + h.h_sec_len[i] <= h.h_ext + h.h_ext_len);
            FUZZ_CHECK(i != 0 || ag_kind_is_proto(h.h_kind));
            covered += AG_WIRE_SEC_HDR + h.h_sec_len[i];
        } else {
            FUZZ_CHECK(h.h_sec[i] == NULL && h.h_sec_len[i] == 0);
        }
    }
    FUZZ_CHECK(covered == h.h_ext_len);
    FUZZ_CHECK(h.h_kind != AG_KIND_ERROR || h.h_ext_len == 0);
    uint64_t total = 0;
    for (uint32_t i = 0; i < nt; i++) {
        FUZZ_CHECK(metas[i].tm_nbytes == lens[i]);
        FUZZ_CHECK(metas[i].tm_ndim >= 0 &&
                   metas[i].tm_ndim <= TP_TENSOR_MAX_DIMS);
        total += lens[i];
    }
    if (total > (1u << 20)) {
        return 0;
    }
    // Canonical: the same header and tensors encode to the same bytes.
    tp_args *args = NULL;
    FUZZ_CHECK(tp__ag_args_create_empty(nt, &args) == TP_OK);
    for (uint32_t i = 0; i < nt; i++) {
        tp_tensor *t = NULL;
        if (tp_tensor_empty(metas[i].tm_dtype, metas[i].tm_ndim,
                            metas[i].tm_shape, &t, NULL) != TP_OK) {
            // A shape with a zero size may still be too large to
            // describe (numel overflow is caught by the decoder only in
            // bytes); nothing to compare then.
            tp_args_unref(args);
            return 0;
        }
        tp__ag_args_push_tensor(args, t);
    }
    size_t esize = tp__ag_wire_size(h.h_fn_name_len, h.h_ext_len, args);
    FUZZ_CHECK(esize == size);
    uint8_t *buf = malloc(esize);
    FUZZ_CHECK(buf != NULL);
    tp_device targets[sizeof(metas) / sizeof(metas[0])];
    for (uint32_t i = 0; i < nt; i++) {
        targets[i] = metas[i].tm_device;
    }
    tp__ag_wire_encode(buf, &h, args, targets);
    FUZZ_CHECK(memcmp(buf, data, size) == 0);
    free(buf);
    tp_args_unref(args);
    return 0;
}
