// SPDX-License-Identifier: Apache-2.0
// version.c - the library version and the optional features compiled in.

#include <tpipe/tpipe.h>

#include "tp_backend_features.h"
#include "tp_config.h"

const char *
tp_version_string(void)
{
    return TP_VERSION_STRING;
}

// Built from string literals at compile time, so it is static and needs no
// formatting at run time.
#if TP_HAVE_URING
#define VERSION_F_URING " uring"
#else
#define VERSION_F_URING ""
#endif
#if TP_HAVE_CRYPTO
#define VERSION_F_CRYPTO " crypto"
#else
#define VERSION_F_CRYPTO ""
#endif
#if TP_HAVE_PMIX
#define VERSION_F_PMIX " pmix"
#else
#define VERSION_F_PMIX ""
#endif
#if TP_HAVE_CUDA
#define VERSION_F_CUDA " cuda"
#else
#define VERSION_F_CUDA ""
#endif
#if TP_HAVE_NCCL
#define VERSION_F_NCCL " nccl"
#else
#define VERSION_F_NCCL ""
#endif

// The optional backends built (ucx, ...) come from the same list as the
// registries (cmake/TpBackends.cmake): a backend with a build condition is
// a feature exactly when it is built.
static const char version_features[] = VERSION_F_URING VERSION_F_CRYPTO
    VERSION_F_PMIX TP_BACKEND_FEATURES VERSION_F_CUDA VERSION_F_NCCL;

const char *
tp_build_features(void)
{
    // Skip the leading space of the first feature (or return "").
    return version_features[0] == ' ' ? version_features + 1 : version_features;
}
