// SPDX-License-Identifier: Apache-2.0
// hash.c - XXH3 through libxxhash. The only file that includes <xxhash.h>,
// so a built-in fallback would stay a local change.

#include "hash.h"

#include <string.h>
#include <xxhash.h>

uint64_t
tp__hash64(const void *p, size_t len)
{
    return (uint64_t)XXH3_64bits(p, len);
}

uint64_t
tp__hash64_str(const char *s)
{
    return tp__hash64(s, strlen(s));
}

void
tp__hash128_hex(const void *p, size_t len, char out[33])
{
    static const char hex[] = "0123456789abcdef";
    // The canonical form is big-endian (high half first), as xxhsum prints.
    XXH128_hash_t h = XXH3_128bits(p, len);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    for (size_t i = 0; i < sizeof(c.digest); i++) {
        out[2 * i] = hex[c.digest[i] >> 4];
        out[2 * i + 1] = hex[c.digest[i] & 0xf];
    }
    out[32] = '\0';
}
