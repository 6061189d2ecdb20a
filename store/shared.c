// SPDX-License-Identifier: Apache-2.0
// shared.c - the tcp servers that ranks host for tcp:// and env://, shared
// within a process: a second open of one address as rank 0 (RPC and a
// process group on one tcp://host:port, as PyTorch allows) gets the server
// the first one started, not EADDRINUSE. Refcounted; the last release
// stops it.
//
// Lock order: shared_mtx only. A server starts under it (two racing opens
// start one), and stops outside it.

#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "store_int.h"

typedef struct shared_srv {
    struct shared_srv *h_next;
    char *h_addr;
    tp_store_server *h_srv;
    int h_refs; // under shared_mtx
} shared_srv;

static pthread_mutex_t shared_mtx = PTHREAD_MUTEX_INITIALIZER;
static shared_srv *shared_list;

tp_status
tp__store_server_acquire(const char *addr, tp_store_server **srv_p,
                         tp_error **err_p)
{
    pthread_mutex_lock(&shared_mtx);
    shared_srv *h = shared_list;
    while (h != NULL && strcmp(h->h_addr, addr) != 0) {
        h = h->h_next;
    }
    if (h != NULL) {
        h->h_refs++;
        *srv_p = h->h_srv;
        pthread_mutex_unlock(&shared_mtx);
        return TP_OK;
    }
    h = tp__zalloc(sizeof(*h));
    char *a = tp__strdup(addr);
    if (h == NULL || a == NULL) {
        tp__free(h);
        tp__free(a);
        pthread_mutex_unlock(&shared_mtx);
        return tp__error_set(err_p, TP_ENOMEM, "store: out of memory");
    }
    tp_status st = tp_store_server_start(addr, &h->h_srv, err_p);
    if (st != TP_OK) {
        tp__free(h);
        tp__free(a);
        pthread_mutex_unlock(&shared_mtx);
        return st;
    }
    h->h_addr = a;
    h->h_refs = 1;
    h->h_next = shared_list;
    shared_list = h;
    *srv_p = h->h_srv;
    pthread_mutex_unlock(&shared_mtx);
    return TP_OK;
}

void
tp__store_server_release(tp_store_server *srv)
{
    if (srv == NULL) {
        return;
    }
    pthread_mutex_lock(&shared_mtx);
    shared_srv **pp = &shared_list;
    while (*pp != NULL && (*pp)->h_srv != srv) {
        pp = &(*pp)->h_next;
    }
    shared_srv *h = *pp;
    bool last = h != NULL && --h->h_refs == 0;
    if (last) {
        *pp = h->h_next;
    }
    pthread_mutex_unlock(&shared_mtx);
    if (h == NULL) {
        tp_store_server_stop(srv); // not shared: the caller's own
    } else if (last) {
        tp_store_server_stop(h->h_srv);
        tp__free(h->h_addr);
        tp__free(h);
    }
}
