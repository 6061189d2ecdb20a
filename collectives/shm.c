/* SPDX-License-Identifier: Apache-2.0 */
/* shm.c - the shared-memory collectives engine (shm.h): its segment, open
 * and close, and the members' agreement. Phases and contributions are in
 * shm_phase.c, the algorithms in shm_algo.c (see shm_impl.h).
 *
 * Segment. Rank 0 creates a POSIX shm segment ("/tp-coll-<pid>-<hex>",
 * O_EXCL, 0600, ftruncate + posix_fallocate so a full /dev/shm is an error
 * now rather than a SIGBUS later) and publishes its name in the store
 * ("<prefix>shm/name"). Every rank maps it and publishes its status
 * ("<prefix>shm/ok/<rank>": its pid, cma domain and viability, or why it
 * failed), then reads every rank's status: the engine is used only if
 * every rank mapped the segment and every cma domain is equal and viable,
 * else every rank gets the same answer naming the first rank that could
 * not. Rank 0 unlinks the name once it has read every status, so nothing
 * is left in /dev/shm even if processes die later. Layout:
 *   header (64 B) | control line per rank (64 B) | all_to_all table per
 *   rank and parity ([size][2][size] entries) | 2 data slots per rank */

#include "collectives/shm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/host.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/platform.h"

static bool
shm_layout_of(int n, size_t slot, shm_layout *l)
{
    size_t un = (size_t)n;
    size_t tab = un * 2 * un * sizeof(shm_ent);
    tab = (tab + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
    l->l_ctl = sizeof(shm_hdr);
    l->l_tab = l->l_ctl + un * sizeof(shm_ctl);
    l->l_slots = l->l_tab + tab;
    if (slot > (SIZE_MAX - l->l_slots) / (2 * un)) {
        return false;
    }
    l->l_total = l->l_slots + 2 * un * slot;
    return true;
}

// ---- open and close --------------------------------------------------------

void
tp__shm_cancel(tp__shm *shm)
{
    if (shm != NULL) {
        atomic_store_explicit(&shm->m_closing, true, memory_order_release);
    }
}

void
tp__shm_close(tp__shm *shm)
{
    if (shm == NULL) {
        return;
    }
    if (shm->m_base != NULL) {
        munmap(shm->m_base, shm->m_len);
    }
    if (shm->m_pidfd != NULL) {
        for (int q = 0; q < shm->m_size; q++) {
            if (shm->m_pidfd[q] >= 0) {
                close(shm->m_pidfd[q]);
            }
        }
    }
    tp__free(shm->m_group);
    tp__free(shm->m_world);
    tp__free(shm->m_pid);
    tp__free(shm->m_pidfd);
    tp__free(shm->m_view);
    tp__free(shm->m_tmp);
    tp__free(shm);
}

static tp_status
shm_engine_create(const tp__shm_setup *s, tp__shm **m_p, tp_error **err_p)
{
    size_t n = (size_t)s->size;
    tp__shm *m = tp__zalloc(sizeof(*m));
    if (m == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "shm open: out of memory");
    }
    m->m_rank = s->rank;
    m->m_size = s->size;
    m->m_slot = (s->slot_bytes + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
    m->m_group = tp__strdup(s->group != NULL ? s->group : "?");
    m->m_world = tp__alloc(n * sizeof(int));
    m->m_pid = tp__zalloc(n * sizeof(pid_t));
    m->m_pidfd = tp__alloc(n * sizeof(int));
    m->m_view = tp__zalloc(n * sizeof(shm_view));
    if (n > 1) {
        m->m_tmp = tp__alloc(3 * (size_t)SHM_SUB);
    }
    if (m->m_group == NULL || m->m_world == NULL || m->m_pid == NULL ||
        m->m_pidfd == NULL || m->m_view == NULL ||
        (n > 1 && m->m_tmp == NULL)) {
        tp__shm_close(m);
        return tp__error_set(err_p, TP_ENOMEM,
                             "shm open (group \"%s\", rank %d): out of memory",
                             s->group != NULL ? s->group : "?", s->rank);
    }
    for (size_t q = 0; q < n; q++) {
        m->m_world[q] = s->world_ranks != NULL ? s->world_ranks[q] : (int)q;
        m->m_pidfd[q] = -1;
    }
    m->m_pid[s->rank] = getpid();
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    m->m_spin = cpus > 0 && (long)s->size <= cpus;
    m->m_spin_ns = SHM_SPIN_NS;
    *m_p = m;
    return TP_OK;
}

static void
shm_errno_text(int e, char *buf, size_t len)
{
    snprintf(buf, len, "%s (%s)", strerror(e), tp__errno_name(e));
}

static void
shm_set_layout(tp__shm *m, const shm_layout *l)
{
    m->m_ctl = (shm_ctl *)(void *)(m->m_base + l->l_ctl);
    m->m_tab = (shm_ent *)(void *)(m->m_base + l->l_tab);
    m->m_slots = m->m_base + l->l_slots;
}

// Rank 0: creates and maps the segment; on failure @fail says why.
static void
shm_segment_create(tp__shm *m, const shm_layout *l, char *name, size_t name_len,
                   char *fail, size_t fail_len)
{
    int fd = -1;
    char et[160];
    for (int i = 0; i < 16 && fd < 0; i++) {
        snprintf(name, name_len, "/tp-coll-%d-%016" PRIx64, (int)getpid(),
                 tp__random_u64());
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    if (fd < 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "shm_open /dev/shm%s: %s", name, et);
        name[0] = '\0';
        return;
    }
    if (ftruncate(fd, (off_t)l->l_total) != 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "ftruncate /dev/shm%s to %zu bytes: %s", name,
                 l->l_total, et);
        goto fail_unlink;
    }
    // Allocate every page now: on a full /dev/shm (Docker's default is 64
    // MB) a later first touch would be a SIGBUS instead of this error.
    int e = posix_fallocate(fd, 0, (off_t)l->l_total);
    if (e != 0) {
        shm_errno_text(e, et, sizeof(et));
        snprintf(fail, fail_len,
                 "posix_fallocate of %zu bytes for /dev/shm%s: %s%s",
                 l->l_total, name, et,
                 e == ENOSPC ? ": /dev/shm is full or too small (Docker: "
                               "--shm-size; or a smaller TP_COLL_SHM_SLOT)"
                             : "");
        goto fail_unlink;
    }
    void *p = mmap(NULL, l->l_total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "mmap of %zu bytes of /dev/shm%s: %s",
                 l->l_total, name, et);
        goto fail_unlink;
    }
    close(fd);
    m->m_base = p;
    m->m_len = l->l_total;
    shm_hdr *h = p;
    h->h_magic = SHM_MAGIC;
    h->h_size = (uint64_t)m->m_size;
    h->h_slot_bytes = m->m_slot;
    h->h_total = l->l_total;
    shm_set_layout(m, l);
    return;

fail_unlink:
    close(fd);
    shm_unlink(name);
    name[0] = '\0';
}

// Ranks > 0: maps the segment rank 0 created.
static void
shm_segment_map(tp__shm *m, const shm_layout *l, const char *name, char *fail,
                size_t fail_len)
{
    char et[160];
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "shm_open /dev/shm%s: %s", name, et);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "fstat /dev/shm%s: %s", name, et);
        close(fd);
        return;
    }
    if ((uint64_t)st.st_size != (uint64_t)l->l_total) {
        snprintf(fail, fail_len,
                 "/dev/shm%s has %jd bytes, expected %zu (do the ranks "
                 "agree on the group size and slot?)",
                 name, (intmax_t)st.st_size, l->l_total);
        close(fd);
        return;
    }
    void *p = mmap(NULL, l->l_total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "mmap of %zu bytes of /dev/shm%s: %s",
                 l->l_total, name, et);
        close(fd);
        return;
    }
    close(fd);
    const shm_hdr *h = p;
    if (h->h_magic != SHM_MAGIC || h->h_size != (uint64_t)m->m_size ||
        h->h_slot_bytes != m->m_slot || h->h_total != l->l_total) {
        snprintf(fail, fail_len,
                 "/dev/shm%s: header does not match (size %" PRIu64
                 ", slot %" PRIu64 "; this rank: size %d, slot %zu)",
                 name, h->h_size, h->h_slot_bytes, m->m_size, m->m_slot);
        munmap(p, l->l_total);
        return;
    }
    m->m_base = p;
    m->m_len = l->l_total;
    shm_set_layout(m, l);
}

// A rank's status record: "ok\n<pid>\n<viable 0|1>\n<domain>\n<why>" or
// "err\n<why>".
typedef struct shm_rec {
    bool r_ok;
    bool r_viable;
    pid_t r_pid;
    char r_domain[TP_CMA_DOMAIN_MAX];
    char r_why[512];
} shm_rec;

static void
shm_rec_parse(const char *v, shm_rec *r)
{
    memset(r, 0, sizeof(*r));
    if (strncmp(v, "err\n", 4) == 0) {
        snprintf(r->r_why, sizeof(r->r_why), "%s", v + 4);
        return;
    }
    int pid = 0, viable = 0, used = 0;
    if (strncmp(v, "ok\n", 3) != 0 ||
        sscanf(v + 3, "%d\n%d\n%n", &pid, &viable, &used) != 2 || used == 0) {
        snprintf(r->r_why, sizeof(r->r_why), "malformed status \"%.64s\"", v);
        return;
    }
    const char *d = v + 3 + used;
    const char *nl = strchr(d, '\n');
    size_t dl = nl != NULL ? (size_t)(nl - d) : strlen(d);
    if (dl >= sizeof(r->r_domain)) {
        snprintf(r->r_why, sizeof(r->r_why), "cma domain too long");
        return;
    }
    memcpy(r->r_domain, d, dl);
    r->r_domain[dl] = '\0';
    snprintf(r->r_why, sizeof(r->r_why), "%s", nl != NULL ? nl + 1 : "");
    r->r_ok = true;
    r->r_viable = viable != 0;
    r->r_pid = (pid_t)pid;
}

// Publishes this rank's status: mapped (with the cma facts) or @fail.
static tp_status
shm_publish_status(const tp__shm_setup *s, tp__shm *m, const char *fail,
                   tp_error **err_p)
{
    char rec[1024], key[TP_STORE_MAX_KEY + 1];
    if (fail[0] != '\0') {
        snprintf(rec, sizeof(rec), "err\n%s", fail);
    } else {
        char domain[TP_CMA_DOMAIN_MAX] = "", cwhy[512] = "";
        tp_error *e = NULL;
        bool viable = false;
        if (tp__cma_domain(domain, sizeof(domain), &e) != TP_OK) {
            snprintf(cwhy, sizeof(cwhy), "cma domain: %s", tp_error_message(e));
            tp_error_unref(e);
            snprintf(domain, sizeof(domain), "?");
        } else {
            viable = tp__cma_viable(cwhy, sizeof(cwhy));
        }
        snprintf(rec, sizeof(rec), "ok\n%d\n%d\n%s\n%s", (int)getpid(),
                 viable ? 1 : 0, domain, cwhy);
        m->m_ctl[m->m_rank].c_pid = (int32_t)getpid();
    }
    snprintf(key, sizeof(key), "%sshm/ok/%d", s->prefix, s->rank);
    tp_status st = tp_store_set(s->store, key, rec, strlen(rec),
                                tp__ms_left(s->deadline_ns), err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st,
                              "shm open (group \"%s\", rank %d): publishing "
                              "this rank's status",
                              m->m_group, m->m_rank);
    }
    return TP_OK;
}

// Reads every rank's status; *@usable_p false: @why names the first rank
// that cannot use the engine, and why.
static tp_status
shm_read_status(const tp__shm_setup *s, tp__shm *m, char *why, size_t why_len,
                bool *usable_p, tp_error **err_p)
{
    shm_rec *rec = tp__alloc(sizeof(shm_rec) * 2);
    if (rec == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "shm open (group \"%s\", rank %d): out of memory",
                             m->m_group, m->m_rank);
    }
    shm_rec *r0 = &rec[0], *rq = &rec[1];
    bool found = false;
    char buf[TP_CMA_DOMAIN_MAX * 2 + 600];
    buf[0] = '\0';
    for (int q = 0; q < s->size; q++) {
        char key[TP_STORE_MAX_KEY + 1];
        snprintf(key, sizeof(key), "%sshm/ok/%d", s->prefix, q);
        void *val = NULL;
        size_t len = 0;
        tp_status st = tp_store_get(s->store, key, tp__ms_left(s->deadline_ns),
                                    &val, &len, err_p);
        if (st != TP_OK) {
            tp__free(rec);
            return tp__error_wrap(err_p, st,
                                  "shm open (group \"%s\", rank %d): waiting "
                                  "for the status of rank %d (world rank %d)",
                                  m->m_group, m->m_rank, q, m->m_world[q]);
        }
        shm_rec *r = q == 0 ? r0 : rq;
        shm_rec_parse(val, r);
        free(val);
        m->m_pid[q] = r->r_pid;
        if (found) {
            continue; // read every status anyway: rank 0 unlinks after
        }
        if (!r->r_ok) {
            snprintf(buf, sizeof(buf), "rank %d: %s", q, r->r_why);
            found = true;
        } else if (!r->r_viable) {
            snprintf(buf, sizeof(buf),
                     "rank %d: cross-memory attach not "
                     "usable: %s",
                     q, r->r_why);
            found = true;
        } else if (q > 0 && strcmp(r->r_domain, r0->r_domain) != 0) {
            snprintf(buf, sizeof(buf),
                     "rank %d: cma domain %s differs from rank 0's %s", q,
                     r->r_domain, r0->r_domain);
            found = true;
        }
    }
    if (why_len > 0) {
        snprintf(why, why_len, "%s", buf);
    }
    tp__free(rec);
    *usable_p = !found;
    return TP_OK;
}

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static tp_status
shm_open_pidfds(tp__shm *m, tp_error **err_p)
{
    for (int q = 0; q < m->m_size; q++) {
        if (q == m->m_rank) {
            continue;
        }
        long fd = syscall(SYS_pidfd_open, m->m_pid[q], 0);
        if (fd >= 0) {
            m->m_pidfd[q] = (int)fd; // pidfds are always close-on-exec
        } else if (errno == ESRCH) {
            return tp__error_set(err_p, TP_ECONNRESET,
                                 "shm open (group \"%s\", rank %d): rank %d "
                                 "(world rank %d, pid %d) exited",
                                 m->m_group, m->m_rank, q, m->m_world[q],
                                 (int)m->m_pid[q]);
        }
        // Otherwise (ENOSYS: kernel < 5.3; seccomp): kill(pid, 0).
    }
    return TP_OK;
}

tp_status
tp__shm_open(const tp__shm_setup *s, tp__shm **shm_p, char *why, size_t why_len,
             tp_error **err_p)
{
    if (s == NULL || shm_p == NULL || s->size < 1 || s->size > SHM_MAX_SIZE ||
        s->rank < 0 || s->rank >= s->size || s->slot_bytes == 0 ||
        s->slot_bytes > SIZE_MAX / 4 ||
        (s->size > 1 && (s->store == NULL || s->prefix == NULL))) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm open: bad setup (rank %d, size %d, slot "
                             "%zu bytes)",
                             s != NULL ? s->rank : -1, s != NULL ? s->size : -1,
                             s != NULL ? s->slot_bytes : 0);
    }
    if (why_len > 0) {
        why[0] = '\0';
    }
    tp__cma_allow_peers();
    tp__shm *m = NULL;
    tp_status st = shm_engine_create(s, &m, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (s->size == 1) {
        *shm_p = m;
        return TP_OK;
    }
    shm_layout l;
    if (!shm_layout_of(s->size, m->m_slot, &l)) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "shm open (group \"%s\", rank %d): %d slots of "
                           "%zu bytes do not fit the address space",
                           m->m_group, s->rank, 2 * s->size, s->slot_bytes);
        tp__shm_close(m);
        return st;
    }
    char key[TP_STORE_MAX_KEY + 1];
    snprintf(key, sizeof(key), "%sshm/name", s->prefix);
    char name[64] = "", fail[768] = "";
    if (s->rank == 0) {
        shm_segment_create(m, &l, name, sizeof(name), fail, sizeof(fail));
        // "!<why>" tells the others there is no segment.
        char val[sizeof(fail) + 1];
        snprintf(val, sizeof(val), "%s%s", fail[0] != '\0' ? "!" : "",
                 fail[0] != '\0' ? fail : name);
        st = tp_store_set(s->store, key, val, strlen(val),
                          tp__ms_left(s->deadline_ns), err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st,
                           "shm open (group \"%s\", rank 0): publishing the "
                           "segment name",
                           m->m_group);
            goto out_unlink;
        }
    } else {
        void *val = NULL;
        size_t len = 0;
        st = tp_store_get(s->store, key, tp__ms_left(s->deadline_ns), &val,
                          &len, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st,
                           "shm open (group \"%s\", rank %d): waiting for "
                           "rank 0's segment name",
                           m->m_group, m->m_rank);
            goto out_close;
        }
        const char *v = val;
        if (v[0] == '!' || len == 0 || len >= sizeof(name)) {
            snprintf(fail, sizeof(fail), "no segment (rank 0 failed)");
        } else {
            snprintf(name, sizeof(name), "%s", v);
            shm_segment_map(m, &l, name, fail, sizeof(fail));
        }
        free(val);
    }
    st = shm_publish_status(s, m, fail, err_p);
    if (st == TP_OK) {
        char buf[1200];
        bool usable = false;
        st = shm_read_status(s, m, buf, sizeof(buf), &usable, err_p);
        if (st == TP_OK && !usable) {
            // Unusable: every rank read the same statuses, so the same why.
            if (why_len > 0) {
                snprintf(why, why_len, "%s", buf);
            }
            if (s->rank == 0 && name[0] != '\0') {
                shm_unlink(name);
            }
            tp__shm_close(m);
            *shm_p = NULL;
            return TP_OK;
        }
    }
    // Every rank reported (or we give up): the name is no longer needed.
out_unlink:
    if (s->rank == 0 && name[0] != '\0') {
        shm_unlink(name);
    }
    if (st == TP_OK) {
        st = shm_open_pidfds(m, err_p);
    }
    if (st == TP_OK) {
        *shm_p = m;
        return TP_OK;
    }
out_close:
    tp__shm_close(m);
    return st;
}

bool
tp__shm_viable(char *why, size_t why_len)
{
    char cma[256];
    if (!tp__cma_viable(cma, sizeof(cma))) {
        snprintf(why, why_len, "cross-memory attach: %s", cma);
        return false;
    }
    char name[64];
    snprintf(name, sizeof(name), "/tp-coll-probe-%d-%016" PRIx64, (int)getpid(),
             tp__random_u64());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, why_len, "shm_open of /dev/shm%s: %s", name,
                 strerror(errno));
        return false;
    }
    shm_unlink(name);
    int e = posix_fallocate(fd, 0, 1 << 20);
    close(fd);
    if (e != 0) {
        snprintf(why, why_len, "posix_fallocate of 1 MiB in /dev/shm: %s",
                 strerror(e));
        return false;
    }
    return true;
}
