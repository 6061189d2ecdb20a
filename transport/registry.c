// SPDX-License-Identifier: Apache-2.0
// registry.c - the transport backends compiled in, best first. The table
// is generated from transport/*/backend.cmake (cmake/TpBackends.cmake) into
// the build's gen/tp_transport_list.inc; it is an explicit array, not
// constructor attributes, because the linker drops those from static
// archives.

#include <string.h>

#include "tp_config.h"
#include "transport.h"

#include "tp_transport_list.inc"

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
