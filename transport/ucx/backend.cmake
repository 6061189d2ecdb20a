# SPDX-License-Identifier: Apache-2.0
# ucx: UCP streams (docs/transport-ucx.md), built when UCX is found. Last:
# its is_viable says no unless TP_UCX=1, so it is chosen only when asked
# for by name (TP_CONF_TRANSPORT, bench --transport ucx, a ucx:// address),
# never over shm or tcp by default.
tp_backend(NAME ucx ORDER 90 OPS tp__transport_ucx_ops
           SOURCES ucx.c conn.c recv.c flow.c setup.c CONDITION TP_HAVE_UCX)
