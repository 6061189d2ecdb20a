// SPDX-License-Identifier: Apache-2.0
// backends.c - the transports and channels compiled in, through the public
// introspection API (tpipe/info.h): name checks that list the valid names,
// and viability checks that say why not.

#include <string.h>
#include <tpipe/info.h>

#include "tool.h"

// The list of @kind; its count in *n_p (0 when the call failed).
static void
tool_backend_list(tool_backend_kind kind, tp_backend_info *out, size_t *n_p)
{
    tp_status st = kind == TOOL_TRANSPORT
                       ? tp_info_transports(0, out, TP_INFO_MAX, n_p, NULL)
                       : tp_info_channels(0, out, TP_INFO_MAX, n_p, NULL);
    if (st != TP_OK) {
        *n_p = 0;
    } else if (*n_p > TP_INFO_MAX) {
        *n_p = TP_INFO_MAX;
    }
    if (kind == TOOL_PIPE_CHANNEL) {
        // Device channels are taken beside the pipe's channel, never as it.
        size_t k = 0;
        for (size_t i = 0; i < *n_p; i++) {
            if (!out[i].device_channel) {
                out[k++] = out[i];
            }
        }
        *n_p = k;
    }
}

const char *
tool_backend_kind_name(tool_backend_kind kind)
{
    return kind == TOOL_TRANSPORT ? "transport" : "channel";
}

void
tool_device_channels(char *buf, size_t len)
{
    tp_backend_info all[TP_INFO_MAX];
    size_t n = 0, off = 0;
    tool_backend_list(TOOL_CHANNEL, all, &n);
    buf[0] = '\0';
    for (size_t i = 0; i < n && off < len; i++) {
        if (all[i].device_channel) {
            off += (size_t)snprintf(buf + off, len - off, "%s%s",
                                    off ? "," : "", all[i].name);
        }
    }
}

void
tool_backend_names(tool_backend_kind kind, char *buf, size_t len)
{
    tp_backend_info all[TP_INFO_MAX];
    size_t n = 0, off = 0;
    tool_backend_list(kind, all, &n);
    buf[0] = '\0';
    for (size_t i = 0; i < n && off < len; i++) {
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "",
                                all[i].name);
    }
}

bool
tool_backend_known(tool_backend_kind kind, const char *name)
{
    tp_backend_info all[TP_INFO_MAX];
    size_t n = 0;
    tool_backend_list(kind, all, &n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(all[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}

bool
tool_backend_viable(tool_backend_kind kind, const char *name, char *why,
                    size_t why_len)
{
    tp_backend_info all[TP_INFO_MAX];
    size_t n = 0;
    tool_backend_list(kind, all, &n);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(all[i].name, name) == 0) {
            if (!all[i].viable) {
                snprintf(why, why_len, "%s", all[i].reason);
            }
            return all[i].viable;
        }
    }
    snprintf(why, why_len, "not built in");
    return false;
}

void
tool_backend_unknown(const char *what, tool_backend_kind kind, const char *name,
                     const char *extra)
{
    char known[256];
    tool_backend_names(kind, known, sizeof(known));
    tool_err("%s: unknown %s \"%s\" (valid: %s%s%s)", what,
             tool_backend_kind_name(kind), name, known, extra ? ", " : "",
             extra ? extra : "");
}
