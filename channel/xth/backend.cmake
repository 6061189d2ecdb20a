# SPDX-License-Identifier: Apache-2.0
# xth: a peer in the same process (memcpy); first (docs/backends.md).
tp_backend(NAME xth ORDER 10 OPS tp__channel_xth_ops SOURCES xth.c)
