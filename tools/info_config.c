// SPDX-License-Identifier: Apache-2.0
// info_config.c - `tpipe info --config[=COMPONENT]`: every component's
// tunables (tp_config_visit), with the component, the variable, its
// effective value and where it came from, the default, what it accepts and
// its doc line; as a table or one JSON object.

#include <stdlib.h>
#include <string.h>
#include <tpipe/tpipe.h>

#include "tool.h"

typedef struct info_item {
    char *ii_component, *ii_name, *ii_env, *ii_def, *ii_value, *ii_source;
    char *ii_accepted, *ii_doc;
} info_item;

typedef struct info_items {
    info_item *is_v;
    size_t is_n, is_cap;
    const char *is_only; // component filter, NULL = all
    bool is_oom;
    char is_components[512]; // every component seen, "a, b, c"
} info_items;

static char *
info_dup(const char *s)
{
    return strdup(s ? s : "");
}

static void
info_note_component(info_items *is, const char *c)
{
    // Components arrive grouped: a new one differs from the last listed.
    const char *last = strrchr(is->is_components, ' ');
    last = last != NULL ? last + 1 : is->is_components;
    if (strcmp(last, c) == 0) {
        return;
    }
    size_t len = strlen(is->is_components);
    snprintf(is->is_components + len, sizeof(is->is_components) - len, "%s%s",
             len > 0 ? ", " : "", c);
}

static void
info_collect_cb(const tp_config_item *item, void *arg)
{
    info_items *is = arg;
    const char *component = item->component ? item->component : "";
    info_note_component(is, component);
    if (is->is_only != NULL && strcmp(is->is_only, component) != 0) {
        return;
    }
    if (is->is_n == is->is_cap) {
        size_t cap = is->is_cap ? 2 * is->is_cap : 64;
        info_item *nv = realloc(is->is_v, cap * sizeof(*nv));
        if (nv == NULL) {
            is->is_oom = true;
            return;
        }
        is->is_v = nv;
        is->is_cap = cap;
    }
    info_item *ii = &is->is_v[is->is_n++];
    ii->ii_component = info_dup(component);
    ii->ii_name = info_dup(item->name);
    ii->ii_env = info_dup(item->env);
    ii->ii_def = info_dup(item->def);
    ii->ii_value = info_dup(item->value);
    ii->ii_source = info_dup(item->source);
    ii->ii_accepted = info_dup(item->accepted);
    ii->ii_doc = info_dup(item->doc);
}

static void
info_items_free(info_items *is)
{
    for (size_t i = 0; i < is->is_n; i++) {
        info_item *ii = &is->is_v[i];
        free(ii->ii_component);
        free(ii->ii_name);
        free(ii->ii_env);
        free(ii->ii_def);
        free(ii->ii_value);
        free(ii->ii_source);
        free(ii->ii_accepted);
        free(ii->ii_doc);
    }
    free(is->is_v);
}

static void
info_print_json(const info_items *is, tp_status st, const tp_error *err)
{
    static const char *const keys[] = {"component", "name",  "env",
                                       "default",   "value", "source",
                                       "accepted",  "doc"};
    fputs("{\"config\":[", stdout);
    for (size_t i = 0; i < is->is_n; i++) {
        const info_item *ii = &is->is_v[i];
        const char *vals[] = {ii->ii_component, ii->ii_name,  ii->ii_env,
                              ii->ii_def,       ii->ii_value, ii->ii_source,
                              ii->ii_accepted,  ii->ii_doc};
        fputs(i ? ",{" : "{", stdout);
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
            printf("%s\"%s\":", k ? "," : "", keys[k]);
            tool_json_str(stdout, vals[k]);
        }
        fputc('}', stdout);
    }
    fputs("],\"error\":", stdout);
    if (st != TP_OK) {
        tool_json_str(stdout, err ? tp_error_message(err) : tp_status_name(st));
    } else {
        fputs("null", stdout);
    }
    fputs("}\n", stdout);
}

static void
info_print_text(const info_items *is)
{
    tool_table t;
    tool_table_init(&t, 7);
    const char *hdr[] = {"COMPONENT", "VARIABLE", "VALUE", "SOURCE",
                         "DEFAULT",   "ACCEPTS",  "DOC"};
    tool_table_add(&t, hdr);
    for (size_t i = 0; i < is->is_n; i++) {
        const info_item *ii = &is->is_v[i];
        // Empty strings show as "-" so the columns stay readable.
        const char *row[] = {ii->ii_component,
                             ii->ii_env,
                             ii->ii_value[0] ? ii->ii_value : "-",
                             ii->ii_source,
                             ii->ii_def[0] ? ii->ii_def : "-",
                             ii->ii_accepted[0] ? ii->ii_accepted : "-",
                             ii->ii_doc};
        tool_table_add(&t, row);
    }
    tool_table_print(&t, stdout);
    tool_table_fini(&t);
}

int
tool_info_config(bool json, const char *component)
{
    info_items is = {.is_only = component};
    tp_error *err = NULL;
    tp_status st = tp_config_visit(info_collect_cb, &is, &err);
    int rc = st == TP_OK ? TOOL_EXIT_OK : TOOL_EXIT_USAGE;

    if (is.is_oom) {
        tool_err("info --config: out of memory");
        rc = TOOL_EXIT_FAIL;
    } else if (component != NULL && is.is_n == 0) {
        tool_err("info: --config=%s: no such component (components: %s)",
                 component, is.is_components);
        rc = TOOL_EXIT_USAGE;
    } else {
        if (json) {
            info_print_json(&is, st, err);
        } else {
            info_print_text(&is);
        }
        fflush(stdout);
    }
    if (st != TP_OK) {
        tool_err("%s", err ? tp_error_message(err) : tp_status_name(st));
    }
    tp_error_unref(err);
    info_items_free(&is);
    return rc;
}
