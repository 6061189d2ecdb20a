# SPDX-License-Identifier: Apache-2.0
# cma: cross-memory attach to a peer on the same host (docs/channel-cma.md).
tp_backend(NAME cma ORDER 20 OPS tp__channel_cma_ops
           SOURCES cma.c cma_copy.c cma_probe.c)
