// SPDX-License-Identifier: Apache-2.0
// registry.c - the transport backends compiled in, best first. Explicit
// (no constructor attributes: the linker drops them from static archives).

#include <string.h>

#include "tp_config.h"
#include "transport.h"

static const tp_transport_ops *const transport_registry[] = {
    &tp__transport_shm_ops,
    &tp__transport_tcp_ops,
#if TP_HAVE_UCX
    // Last: chosen only when asked for by name (TP_CONF_TRANSPORT, bench
    // --transport ucx, a ucx:// address), never over shm or tcp by default.
    &tp__transport_ucx_ops,
#endif
};

const tp_transport_ops *const *
tp__transport_registry(size_t *n_p)
{
    *n_p = TP_ARRAY_LEN(transport_registry);
    return transport_registry;
}

const tp_transport_ops *
tp__transport_find(const char *name)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(transport_registry); i++) {
        if (strcmp(transport_registry[i]->name, name) == 0) {
            return transport_registry[i];
        }
    }
    return NULL;
}
