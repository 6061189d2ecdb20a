# SPDX-License-Identifier: Apache-2.0
# shm: shared-memory rings between processes of one host; first, since it
# only matches a peer on this host (docs/backends.md explains the fields).
tp_backend(NAME shm ORDER 10 OPS tp__transport_shm_ops
           SOURCES shm.c ring.c data.c handshake.c accept.c)
