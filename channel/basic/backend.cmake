# SPDX-License-Identifier: Apache-2.0
# basic: the bytes on the pipe's own connection; last, it always works.
tp_backend(NAME basic ORDER 40 OPS tp__channel_basic_ops SOURCES basic.c)
