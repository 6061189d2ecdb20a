/* SPDX-License-Identifier: Apache-2.0 */
/* coll.c - names of the collectives (coll.h). */
#include "collectives/coll.h"

const char *
tp__coll_kind_name(tp__coll_kind k)
{
    static const char *const names[TP__COLL_KIND_COUNT] = {
        [TP__COLL_BARRIER] = "barrier",
        [TP__COLL_BROADCAST] = "broadcast",
        [TP__COLL_ALL_REDUCE] = "all_reduce",
        [TP__COLL_REDUCE] = "reduce",
        [TP__COLL_ALL_GATHER] = "all_gather",
        [TP__COLL_GATHER] = "gather",
        [TP__COLL_SCATTER] = "scatter",
        [TP__COLL_REDUCE_SCATTER] = "reduce_scatter",
        [TP__COLL_ALL_TO_ALL] = "all_to_all",
    };
    return (unsigned)k < TP__COLL_KIND_COUNT ? names[k] : "?";
}
