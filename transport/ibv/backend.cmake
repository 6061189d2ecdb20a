# SPDX-License-Identifier: Apache-2.0
# ibv: InfiniBand verbs, RC queue pairs bootstrapped over tcp
# (docs/transport-ibv.md), built when libibverbs is found. After tcp: it is
# chosen only when asked for by name (TP_TRANSPORTS, TP_CONF_TRANSPORT,
# bench --transport ibv, an ibv:// address), never over shm or tcp by
# default; without a device it is not viable and says why.
tp_backend(NAME ibv ORDER 30 OPS tp__transport_ibv_ops
           SOURCES ibv.c conn.c setup.c proto.c mr_cache.c verbs_real.c
                   tunables.c
           CONDITION TP_HAVE_IBV)
