/* SPDX-License-Identifier: Apache-2.0 */
/* tpipe.h - umbrella header of libtpipe. */
#ifndef TPIPE_TPIPE_H
#define TPIPE_TPIPE_H

#include <tpipe/export.h>
#include <tpipe/version.h>
#include <tpipe/error.h>
#include <tpipe/log.h>
#include <tpipe/config.h>
#include <tpipe/future.h>
#include <tpipe/tensor.h>
#include <tpipe/autograd.h>
#include <tpipe/store.h>
#include <tpipe/rpc.h>
#include <tpipe/rref.h>
#include <tpipe/dist_autograd.h>
#include <tpipe/optim.h>
#include <tpipe/collectives.h>
#include <tpipe/info.h>

#ifdef __cplusplus
extern "C" {
#endif

/** tp_version_string - "0.1.0"; static. */
TP_API const char *tp_version_string(void);
/**
 * tp_build_features - a static, space-separated list of optional features
 * compiled in ("uring ibv ucx cuda nccl" or a subset).
 */
TP_API const char *tp_build_features(void);

#ifdef __cplusplus
}
#endif
#endif
