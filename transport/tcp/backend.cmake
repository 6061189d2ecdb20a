# SPDX-License-Identifier: Apache-2.0
# tcp: sockets, any host (docs/backends.md explains the fields).
tp_backend(NAME tcp ORDER 20 OPS tp__transport_tcp_ops
           SOURCES tcp.c conn.c setup.c listener.c)
