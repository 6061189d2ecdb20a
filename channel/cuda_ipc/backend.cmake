# SPDX-License-Identifier: Apache-2.0
# cuda_ipc: CUDA tensors between processes of one host through CUDA IPC
# memory handles, the pipe's device channel (docs/cuda.md).
tp_backend(NAME cuda_ipc ORDER 15 OPS tp__channel_cuda_ipc_ops
           SOURCES cuda_ipc.c cuda_ipc_copy.c cuda_ipc_cache.c CONDITION TP_HAVE_CUDA)
