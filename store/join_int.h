/* SPDX-License-Identifier: Apache-2.0 */
/* join_int.h (private to store/join*.c) - what join.c (joining) and
 * join_gen.c (a generation's record and keys, the removal of old ones)
 * share. The keys are listed at the top of join.c. */
#ifndef TP_STORE_JOIN_INT_H
#define TP_STORE_JOIN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/join.h"

// A generation past its opener's init deadline by this much is abandoned.
#define JOIN_EXPIRY_SLACK_MS 2000
// Generations a rank 0 looks at for removal when it opens one.
#define JOIN_CLEAN_MAX 64
#define JOIN_JOB_MAX   64

// A generation's record (g/<G>/info).
typedef struct tp__join_info {
    int ji_world;
    long long ji_expiry;
    int ji_hosted;
    char ji_job[JOIN_JOB_MAX + 1]; // "" for none
} tp__join_info;

// Parses a record "<world> <expiry> [<hosted> <job>]"; false if malformed.
bool tp__join_info_parse(const char *s, tp__join_info *ji);
// This job's id (see join_gen.c), at most JOIN_JOB_MAX characters.
void tp__join_job_id(char *buf, size_t len);
// "job \"ID\"" or "a job with no id (TP_JOB_ID)", for messages.
void tp__join_job_label(const char *job, char *buf, size_t len);
int64_t tp__join_realtime_ms(void);
// "<ns>g/<gen>/<leaf>".
void tp__join_key(const tp__store_member *j, int64_t gen, const char *leaf,
                  char *buf, size_t len);
// The value of @key now (*@v_p NULL when it is not set); store errors other
// than "not set" are returned.
tp_status tp__join_peek(tp__store_member *j, const char *key, char **v_p,
                        tp_error **err_p);
// Rank 0, having opened generation @mine: removes the keys of older
// generations that are over (see join_gen.c).
void tp__join_clean(tp__store_member *j, int64_t mine);

#endif
