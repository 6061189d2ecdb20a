/* SPDX-License-Identifier: Apache-2.0 */
/* ibv_fake.h - an in-memory fake of the verbs operations the ibv transport
 * uses (transport/ibv/verbs.h), with reliable-connected semantics, for
 * tests on hosts without an RDMA device. Linked into tp_testing only; the
 * harness installs it (tp__ibv_verbs_override) when TP_IBV_FAKE=1.
 *
 * It works across processes of one host: registered memory is a memfd
 * that the peer maps through /proc/<pid>/fd/<rkey>; a CQ is a pipe whose
 * read end is the completion channel's fd, and the peer writes receive
 * completions into its write end (opened through /proc/<pid>/fd). RDMA
 * writes land in the peer's memory before their completions are queued;
 * completions arrive in order; a peer that is gone (its CQ closed) makes
 * the write fail ("retry exceeded") and the QP go to the error state, whose
 * posted work requests complete with FLUSH. */
#ifndef TP_TESTS_IBV_FAKE_H
#define TP_TESTS_IBV_FAKE_H

#include <stdint.h>

#include "transport/ibv/verbs.h"

extern const tp_ibv_verbs tp__ibv_verbs_fake;

// Installs the fake if TP_IBV_FAKE=1 (tp_test_main calls it).
void tp__ibv_fake_install_from_env(void);

// Counters, for tests (this process).
typedef struct tp_ibv_fake_stats {
    uint64_t fs_reg_mr;
    uint64_t fs_dereg_mr;
    uint64_t fs_writes;
} tp_ibv_fake_stats;
void tp__ibv_fake_stats(tp_ibv_fake_stats *st);

// The fake's devices: "fake_0" (port 1) and "fake_1" (port 1, and port 2
// DOWN); TP_IBV_DEVICE and TP_IBV_PORT choose among them as on real verbs.
// "name:port" of the device @d opened.
void tp__ibv_fake_dev_name(const tp_ibv_dev *d, char *buf, size_t len);

// The next data write posted in this process carries @imm instead of its
// length (a peer gone wrong: tests of protocol errors).
void tp__ibv_fake_corrupt_next_imm(uint32_t imm);

#endif
