// SPDX-License-Identifier: Apache-2.0
// devmap.c - PyTorch's device maps (TensorPipeRpcBackendOptions
// .set_device_map / devices): which CUDA device of the callee a CUDA
// tensor of the caller arrives on.
//
// tp_agent_options.device_maps is "WORKER=L:R,L:R;WORKER=...": a tensor
// on cuda:L sent to WORKER arrives on its cuda:R. Checked at init: the
// syntax, one-to-one maps, local devices that exist here (and are in
// `devices` when that is given), then after the rendezvous, workers that
// are in the job and remote devices that exist there (each worker
// publishes its CUDA device count in the store right after the
// rendezvous, under the job's generation, and reads those of the workers
// its maps name, waiting for them until the init deadline). A worker with
// neither device_maps nor devices publishes "-" without loading the CUDA
// runtime; a map to it is then checked when a tensor arrives there. A reply's
// tensors go back through the inverse of the request's pairs (the device each
// request tensor came from), else through this worker's own map to the caller.

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_impl.h"
#include "core/alloc.h"
#include "core/cuda.h"

#define DM_MAX_PAIRS 16
#define DM_MAX_DEV   255

typedef struct ag_devmap {
    char dm_worker[TP_RPC_MAX_NAME + 1];
    int dm_rank; // after the rendezvous; -1 before
    int dm_n;
    int dm_local[DM_MAX_PAIRS];
    int dm_remote[DM_MAX_PAIRS];
} ag_devmap;

struct ag_devmaps {
    ag_devmap *d_maps;
    int d_n;
};

static int
dm_int(const char *s, size_t len, bool *ok)
{
    if (len == 0 || len > 3 || strspn(s, "0123456789") < len) {
        *ok = false;
        return -1;
    }
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        v = v * 10 + (s[i] - '0');
    }
    if (v > DM_MAX_DEV) {
        *ok = false;
    }
    return v;
}

// "L:R,L:R" of @s[0..len) into @m.
static tp_status
dm_parse_pairs(ag_devmap *m, const char *s, size_t len, tp_error **err_p)
{
    size_t i = 0;
    while (i < len) {
        size_t end = i;
        while (end < len && s[end] != ',') {
            end++;
        }
        const char *colon = memchr(s + i, ':', end - i);
        bool ok = colon != NULL;
        int l = -1, r = -1;
        if (ok) {
            l = dm_int(s + i, (size_t)(colon - (s + i)), &ok);
            r = dm_int(colon + 1, (size_t)(s + end - colon - 1), &ok);
        }
        if (!ok || m->dm_n >= DM_MAX_PAIRS) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "device map to %s: \"%.*s\": expected "
                                 "LOCAL:REMOTE CUDA device indexes (0..%d, "
                                 "at most %d pairs)",
                                 m->dm_worker, (int)(end - i), s + i,
                                 DM_MAX_DEV, DM_MAX_PAIRS);
        }
        for (int k = 0; k < m->dm_n; k++) {
            if (m->dm_local[k] == l) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "device map to %s: local device cuda:%d "
                                     "is mapped twice",
                                     m->dm_worker, l);
            }
            if (m->dm_remote[k] == r) {
                return tp__error_set(
                    err_p, TP_EINVAL,
                    "device map to %s: cuda:%d and cuda:%d both map to its "
                    "cuda:%d (a device map must be one-to-one)",
                    m->dm_worker, m->dm_local[k], l, r);
            }
        }
        m->dm_local[m->dm_n] = l;
        m->dm_remote[m->dm_n] = r;
        m->dm_n++;
        i = end + 1;
    }
    return TP_OK;
}

// @devices: "0,1" (NULL/"": every device of the maps).
static bool
dm_in_devices(const char *devices, int d)
{
    if (devices == NULL || devices[0] == '\0') {
        return true;
    }
    const char *p = devices;
    while (*p != '\0') {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno != 0) {
            return false;
        }
        if (v == d) {
            return true;
        }
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') {
            return false;
        }
    }
    return false;
}

static tp_status
dm_check_devices(const char *devices, int ndev, tp_error **err_p)
{
    if (devices == NULL || devices[0] == '\0') {
        return TP_OK;
    }
    const char *p = devices;
    while (*p != '\0') {
        size_t len = strcspn(p, ",");
        bool ok = true;
        int d = dm_int(p, len, &ok);
        if (!ok) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "devices \"%s\": expected CUDA device "
                                 "indexes separated by commas",
                                 devices);
        }
        if (d >= ndev) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "devices: cuda:%d does not exist (%d CUDA "
                                 "devices here)",
                                 d, ndev);
        }
        p += len;
        p += *p == ',';
    }
    return TP_OK;
}

void
tp__ag_devmaps_free(ag_devmaps *d)
{
    if (d != NULL) {
        tp__free(d->d_maps);
        tp__free(d);
    }
}

tp_status
tp__ag_devmaps_parse(const char *maps, const char *devices, ag_devmaps **d_p,
                     tp_error **err_p)
{
    *d_p = NULL;
    bool any_maps = maps != NULL && maps[0] != '\0';
    bool any_devs = devices != NULL && devices[0] != '\0';
    if (!any_maps && !any_devs) {
        return TP_OK;
    }
    char why[256] = "";
    int ndev =
        tp__cuda_available(why, sizeof(why)) ? tp__cuda_device_count() : 0;
    if (ndev == 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s set, but CUDA is not usable here: %s",
                             any_maps ? "device_maps" : "devices", why);
    }
    tp_status st = dm_check_devices(devices, ndev, err_p);
    if (st != TP_OK) {
        return st;
    }
    ag_devmaps *d = tp__zalloc(sizeof(*d));
    if (d == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "device_maps: out of memory");
    }
    const char *p = any_maps ? maps : "";
    while (*p != '\0') {
        size_t len = strcspn(p, ";");
        const char *eq = memchr(p, '=', len);
        size_t nlen = eq != NULL ? (size_t)(eq - p) : 0;
        if (eq == NULL || nlen == 0 || nlen > TP_RPC_MAX_NAME) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "device_maps: \"%.*s\": expected "
                               "WORKER=LOCAL:REMOTE[,LOCAL:REMOTE...]",
                               (int)len, p);
            goto fail;
        }
        for (int k = 0; k < d->d_n; k++) {
            if (strlen(d->d_maps[k].dm_worker) == nlen &&
                memcmp(d->d_maps[k].dm_worker, p, nlen) == 0) {
                st = tp__error_set(err_p, TP_EINVAL,
                                   "device_maps: worker %.*s has two maps",
                                   (int)nlen, p);
                goto fail;
            }
        }
        ag_devmap *nm =
            tp__realloc(d->d_maps, (size_t)(d->d_n + 1) * sizeof(*nm));
        if (nm == NULL) {
            st = tp__error_set(err_p, TP_ENOMEM, "device_maps: out of memory");
            goto fail;
        }
        d->d_maps = nm;
        ag_devmap *m = &d->d_maps[d->d_n++];
        memset(m, 0, sizeof(*m));
        memcpy(m->dm_worker, p, nlen);
        m->dm_rank = -1;
        st = dm_parse_pairs(m, eq + 1, len - nlen - 1, err_p);
        if (st != TP_OK) {
            goto fail;
        }
        for (int k = 0; k < m->dm_n; k++) {
            int l = m->dm_local[k];
            if (l >= ndev || !dm_in_devices(devices, l)) {
                st = tp__error_set(
                    err_p, TP_EINVAL,
                    "device map to %s: local device cuda:%d %s", m->dm_worker,
                    l, l >= ndev ? "does not exist here" : "is not in devices");
                goto fail;
            }
        }
        p += len;
        p += *p == ';';
    }
    *d_p = d;
    return TP_OK;
fail:
    tp__ag_devmaps_free(d);
    return st;
}

// Store key of rank @r's device count.
static void
dm_key(const tp_agent *a, int r, char *key, size_t cap)
{
    snprintf(key, cap, "%scuda_devices/%d", a->a_prefix, r);
}

static tp_status
dm_publish(tp_agent *a, uint64_t deadline, tp_error **err_p)
{
    char key[96];
    char val[16] = "-";
    dm_key(a, a->a_rank, key, sizeof(key));
    // Only a worker configured for CUDA loads the runtime here: on a GPU
    // host that initialises the driver (slow, and a process that forks
    // afterwards cannot use CUDA in its children). "-": not known.
    int n = 1;
    if (a->a_devmaps != NULL) {
        n = snprintf(val, sizeof(val), "%d",
                     tp__cuda_available(NULL, 0) ? tp__cuda_device_count() : 0);
    }
    return tp_store_set(a->a_store, key, val, (size_t)n, tp__ms_left(deadline),
                        err_p);
}

tp_status
tp__ag_devmaps_check_peers(tp_agent *a, uint64_t deadline, tp_error **err_p)
{
    tp_status pst = dm_publish(a, deadline, err_p);
    if (pst != TP_OK) {
        return tp__error_wrap(err_p, pst,
                              "device_maps: publishing the CUDA device count");
    }
    ag_devmaps *d = a->a_devmaps;
    for (int i = 0; d != NULL && i < d->d_n; i++) {
        ag_devmap *m = &d->d_maps[i];
        ag_peer *p = tp__ag_peer_by_name(a, m->dm_worker);
        if (p == NULL) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "device_maps: worker %s is not in the job",
                                 m->dm_worker);
        }
        m->dm_rank = p->p_info.rank;
        char key[96];
        dm_key(a, m->dm_rank, key, sizeof(key));
        void *v = NULL;
        size_t vlen = 0;
        tp_status st = tp_store_get(a->a_store, key, tp__ms_left(deadline), &v,
                                    &vlen, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st,
                                  "device_maps: the CUDA device count of %s",
                                  m->dm_worker);
        }
        char buf[16] = "";
        memcpy(buf, v, vlen < sizeof(buf) - 1 ? vlen : sizeof(buf) - 1);
        tp_free(v);
        if (strcmp(buf, "-") == 0) {
            // Not configured for CUDA: its devices are checked when a
            // tensor arrives there.
            continue;
        }
        bool ok = true;
        int rn = dm_int(buf, strlen(buf), &ok);
        if (!ok) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "device_maps: %s published a CUDA device "
                                 "count of \"%s\"",
                                 m->dm_worker, buf);
        }
        for (int k = 0; k < m->dm_n; k++) {
            if (m->dm_remote[k] >= rn) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "device map to %s: cuda:%d maps to its "
                                     "cuda:%d, but %s has %d CUDA devices",
                                     m->dm_worker, m->dm_local[k],
                                     m->dm_remote[k], m->dm_worker, rn);
            }
        }
    }
    return TP_OK;
}

tp_status
tp__ag_devmaps_target(const tp_agent *a, int to, const tp_args *req, size_t i,
                      tp_device src, tp_device *dst_p, tp_error **err_p)
{
    if (src.type == TP_DEVICE_CPU) {
        *dst_p = src;
        return TP_OK;
    }
    // A reply: back to the device the request's tensor on @src came from.
    for (size_t k = 0; req != NULL && k < req->a_ntensors; k++) {
        tp_device rd = tp_tensor_device(req->a_tensors[k]);
        if (req->a_src_devs != NULL && rd.type == src.type &&
            rd.index == src.index) {
            *dst_p = req->a_src_devs[k];
            return TP_OK;
        }
    }
    const ag_devmaps *d = a->a_devmaps;
    for (int m = 0; d != NULL && m < d->d_n; m++) {
        const ag_devmap *dm = &d->d_maps[m];
        if (dm->dm_rank != to) {
            continue;
        }
        for (int k = 0; k < dm->dm_n; k++) {
            if (dm->dm_local[k] == src.index) {
                *dst_p = (tp_device){TP_DEVICE_CUDA, dm->dm_remote[k]};
                return TP_OK;
            }
        }
    }
    const char *name =
        to >= 0 && to < a->a_world ? a->a_peers[to].p_info.name : "the peer";
    return tp__error_set(
        err_p, TP_EINVAL,
        "rpc %s: tensor %zu is on cuda:%d, and no device map to worker %s "
        "covers that device. Only CPU tensors are sent by default: move "
        "the tensor to the CPU, or set a device map for %s (device_maps "
        "\"%s=%d:REMOTE\", PyTorch's set_device_map)",
        a->a_self->p_info.name, i, src.index, name, name, name, src.index);
}
