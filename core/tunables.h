/* SPDX-License-Identifier: Apache-2.0 */
/* tunables.h (internal) - the type of a component's table of tunables
 * (UCX's ucs_config_field tables are the model) and the parser they share.
 *
 * Each component declares one tp_tunables table in its own folder: core
 * (core/config.c, core/auth.c), the generic transport layer, each
 * transport and channel backend (reached through the `tunables` member of
 * its ops table), pipe, store, agent, collectives, autograd. The build
 * composes the list (gen/tp_tunables.c, from cmake/tp_tunables.c.in);
 * tp__tunables_at walks it. Nothing here knows any component.
 *
 * Where a value goes (tp_tunables.ts_store):
 * - TP_TUNABLES_IN_CONFIG: a field of tp_config (core/config.h), for the
 *   tunables that several layers read or that context options set.
 * - TP_TUNABLES_OWN: a field of the component's own struct of ts_size
 *   bytes, kept inside tp_config (its cfg_own area) and reached with
 *   tp__config_own(cfg, &table). A new backend adds a tunable this way
 *   without editing core/.
 * A row flagged TP_TUNABLE_EXTERNAL is only declared: its component reads
 * and checks it itself, at its own time, with its own messages (the RPC
 * agent's options, the store server's bounds, TP_FAULT, TP_INIT_METHOD,
 * the job secret); tu_accepted says what it takes. It is listed with the
 * others (`tpipe info --config`, docs/configuration.md).
 *
 * Every row's env name is "TP_" + its name upper-cased. */
#ifndef TP_CORE_TUNABLES_H
#define TP_CORE_TUNABLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/error.h>

typedef enum tp_tunable_type {
    TP_TUNABLE_INT,  // decimal integer
    TP_TUNABLE_SIZE, // bytes, with an optional K, M or G suffix (1024s)
    TP_TUNABLE_MS,   // milliseconds, with an optional "ms" or "s" suffix
    TP_TUNABLE_STR,  // text that fits the char array of the field
    TP_TUNABLE_ENUM, // one of tu_choices (index = value)
} tp_tunable_type;

// Flags of a row.
#define TP_TUNABLE_POW2     0x1u // the value must be a power of two
#define TP_TUNABLE_NUMERIC  0x2u // an enum that also accepts its index
#define TP_TUNABLE_EXTERNAL 0x4u // declared only, read by its component
#define TP_TUNABLE_SECRET   0x8u // never shown (the job secret)

// An external row: declared here, read and checked by its component.
#define TP_TUNABLE_EXTERN(name, env, def, accepted, doc)                       \
    {                                                                          \
        .tu_name = (name), .tu_env = (env), .tu_def = (def), .tu_doc = (doc),  \
        .tu_accepted = (accepted), .tu_flags = TP_TUNABLE_EXTERNAL,            \
    }

typedef struct tp_tunable {
    const char *tu_name; // "shm_ring_size"
    const char *tu_env;  // "TP_SHM_RING_SIZE"
    const char *tu_def;  // default as text, parsed like the environment
    const char *tu_doc;  // one line
    tp_tunable_type tu_type;
    size_t tu_offset; // in the table's storage (see ts_store)
    size_t tu_size;   // of the field: int64_t, or the char array
    int64_t tu_min;
    int64_t tu_max;
    unsigned tu_flags;
    const char *tu_unit;           // TP_TUNABLE_INT: "threads"
    const char *const *tu_choices; // TP_TUNABLE_ENUM, NULL-terminated
    const char *tu_accepted;       // TP_TUNABLE_EXTERNAL: what it takes
} tp_tunable;

typedef enum tp_tunables_store {
    TP_TUNABLES_IN_CONFIG = 0, // tu_offset is in tp_config
    TP_TUNABLES_OWN = 1,       // tu_offset is in the component's struct
} tp_tunables_store;

typedef struct tp_tunables {
    const char *ts_component; // "core", "tcp", "pipe"
    const tp_tunable *ts_rows;
    size_t ts_nrows;
    tp_tunables_store ts_store;
    size_t ts_size; // TP_TUNABLES_OWN: sizeof the component's struct
} tp_tunables;

// A row's storage in tp_config / in the component's struct @type.
#define TP_TUNABLE_CONFIG_FIELD(f)                                             \
    .tu_offset = offsetof(tp_config, f),                                       \
    .tu_size = sizeof(((tp_config *)NULL)->f)
#define TP_TUNABLE_FIELD(type, f)                                              \
    .tu_offset = offsetof(type, f), .tu_size = sizeof(((type *)NULL)->f)

#define TP_TUNABLE_KIB    ((int64_t)1 << 10)
#define TP_TUNABLE_MIB    ((int64_t)1 << 20)
#define TP_TUNABLE_GIB    ((int64_t)1 << 30)
#define TP_TUNABLE_DAY_MS ((int64_t)24 * 3600 * 1000)

// The @i-th table of the build (core first), NULL past the last one.
// Defined by the build's composed list (gen/tp_tunables.c).
const tp_tunables *tp__tunables_at(size_t i);

// Parses @value for @t into @base (the table's storage). On failure @base
// is unchanged and the error reads "<label>=<value>: <what is accepted>".
tp_status tp__tunable_apply(const tp_tunable *t, void *base, const char *label,
                            const char *value, tp_error **err_p);
// Renders the value of @t in @base in the form the parser accepts.
void tp__tunable_format(const tp_tunable *t, const void *base, char *buf,
                        size_t len);
// What @t accepts, for listings: "64K..1G, a power of two", "auto|epoll",
// "0..1000000 microseconds", or tu_accepted of an external row.
void tp__tunable_bounds(const tp_tunable *t, char *buf, size_t len);

#endif
