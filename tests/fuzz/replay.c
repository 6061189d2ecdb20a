// SPDX-License-Identifier: Apache-2.0
// replay.c - main() for builds without libFuzzer: feeds every file named
// on the command line (directories: every regular file inside, not
// recursive) to LLVMFuzzerTestOneInput once. The default (gcc) build runs
// the seed corpus this way as ctest fuzz_<target>_replay, and a crash
// input found by a fuzzer can be replayed in a debugger the same way.

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

// Reads @path into an exact-size buffer (so ASan sees any overread) and
// runs it. Returns 0 on success, -1 if the file cannot be read.
static int
replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: open %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fprintf(stderr, "replay: stat %s: %s\n", path, strerror(errno));
        fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *data = malloc(size > 0 ? size : 1);
    if (data == NULL || fread(data, 1, size, f) != size) {
        fprintf(stderr, "replay: read %s failed\n", path);
        free(data);
        fclose(f);
        return -1;
    }
    fclose(f);
    // libFuzzer passes a NULL-or-dangling pointer for empty inputs; NULL
    // here checks that size 0 never dereferences it.
    LLVMFuzzerTestOneInput(size > 0 ? data : NULL, size);
    free(data);
    return 0;
}

int
main(int argc, char **argv)
{
    long n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i]) != 0) {
                return 1;
            }
            n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (d == NULL) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') {
                continue;
            }
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
            if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
                continue;
            }
            if (replay_file(path) != 0) {
                closedir(d);
                return 1;
            }
            n++;
        }
        closedir(d);
    }
    if (n == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    printf("replayed %ld inputs\n", n);
    return 0;
}
