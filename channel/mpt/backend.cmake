# SPDX-License-Identifier: Apache-2.0
# mpt: tensors striped over network lanes (docs/pipe.md).
tp_backend(NAME mpt ORDER 30 OPS tp__channel_mpt_ops SOURCES mpt.c)
