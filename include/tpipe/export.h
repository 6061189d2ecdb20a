/* SPDX-License-Identifier: Apache-2.0 */
/* export.h - symbol visibility for libtpipe. */
#ifndef TPIPE_EXPORT_H
#define TPIPE_EXPORT_H

#if defined(TP_BUILDING_LIBRARY)
#define TP_API __attribute__((visibility("default")))
#else
#define TP_API
#endif

#endif
