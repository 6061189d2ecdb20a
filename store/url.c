// SPDX-License-Identifier: Apache-2.0
// url.c - the syntax of an init method and the rank and world size a
// member opens it as: checked before anything is opened, bound or read
// from the environment, so that a malformed URL is reported as such and
// not as the "rank -1" it was given with.

#include <stdio.h>
#include <string.h>

#include "store_int.h"
#include "transport/sockaddr.h"

tp_status
tp__store_url_check(const char *url, tp_error **err_p)
{
    if (url == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "store: no init method");
    }
    if (strcmp(url, "env://") == 0 || strncmp(url, "mem://", 6) == 0) {
        return TP_OK;
    }
    if (strncmp(url, "file://", 7) == 0) {
        if (url[7] != '/') {
            return tp__error_set(err_p, TP_EINVAL,
                                 "store %s: the path must be absolute "
                                 "(file:///path)",
                                 url);
        }
        return TP_OK;
    }
    if (strncmp(url, "tcp://", 6) != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "store %s: unknown init method (accepted: "
                             "env://, tcp://HOST:PORT, file:///PATH, "
                             "mem://NAME)",
                             url);
    }
    char addr[TP_SOCKADDR_STRLEN + 256];
    const char *q = strchr(url, '?');
    size_t alen = q ? (size_t)(q - url) : strlen(url);
    if (alen >= sizeof(addr)) {
        return tp__error_set(err_p, TP_EINVAL, "store %.64s...: too long", url);
    }
    memcpy(addr, url, alen);
    addr[alen] = 0;
    if (q != NULL && strcmp(q, "?server=0") != 0 &&
        strcmp(q, "?server=1") != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "store %s: unknown option \"%s\" (accepted: "
                             "?server=0, ?server=1)",
                             url, q);
    }
    tp_hostport hp;
    tp_status st = tp__sockaddr_split(addr, 0, &hp, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "store");
    }
    return TP_OK;
}

tp_status
tp__store_resolve_ranks(const char *url, int *rank_p, int *world_p,
                        tp_error **err_p)
{
    tp_status st = tp__store_url_check(url, err_p);
    if (st != TP_OK) {
        return st;
    }
    int rank = *rank_p, world = *world_p;
    if (rank == -1 || world == -1) {
        int r, w, l;
        st = tp__store_env_ranks(&r, &w, &l, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st,
                                  "store %s: rank %d, world size %d (-1: "
                                  "from the environment)",
                                  url, rank, world);
        }
        rank = rank == -1 ? r : rank;
        world = world == -1 ? w : world;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        return tp__error_set(err_p, TP_EINVAL,
                             "store %s: rank %d of world size %d (world size "
                             "1 or more, rank 0..world size - 1, or -1 for "
                             "the environment's)",
                             url, rank, world);
    }
    *rank_p = rank;
    *world_p = world;
    return TP_OK;
}
