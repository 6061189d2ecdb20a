// SPDX-License-Identifier: Apache-2.0
// run_spawn.c - `tpipe run`: the ranks' job secret, job id and master port, the
// child's side of starting a rank (see the top of run.c on signals and
// fork), signalling the ranks, and how a reaped rank ended.

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run_impl.h"
#include "tool.h"
#include "tp_config.h"

// Fills @hex with 2 x @nbytes random hex digits (and a NUL); @what names
// them in the error. False after reporting.
static bool
run_random_hex(char *hex, size_t nbytes, const char *what)
{
    unsigned char rnd[32];
    size_t got = 0;
    if (nbytes > sizeof(rnd)) {
        nbytes = sizeof(rnd); // callers ask for at most 32
    }
    while (got < nbytes) {
        ssize_t r = getrandom(rnd + got, nbytes - got, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            tool_err("run: getrandom for %s: %s", what, strerror(errno));
            return false;
        }
        got += (size_t)r;
    }
    for (size_t k = 0; k < nbytes; k++) {
        snprintf(hex + 2 * k, 3, "%02x", rnd[k]);
    }
    return true;
}

// Gives the ranks a job secret: a fresh random TP_JOB_TOKEN (64 hex
// digits), unless the user set TP_JOB_TOKEN or TP_JOB_TOKEN_FILE (several
// launchers sharing one secret). Never printed. With @nnodes > 1 the
// launchers of the other nodes could not know a fresh one, so the user
// must give it. Returns TOOL_EXIT_OK, or the exit status after reporting.
int
run_job_token(bool none, uint64_t nnodes)
{
    if (none) {
        unsetenv("TP_JOB_TOKEN");
        unsetenv("TP_JOB_TOKEN_FILE");
        return TOOL_EXIT_OK;
    }
    if (getenv("TP_JOB_TOKEN") != NULL || getenv("TP_JOB_TOKEN_FILE") != NULL) {
        return TOOL_EXIT_OK;
    }
#if !TP_HAVE_CRYPTO
    (void)nnodes;
    return TOOL_EXIT_OK; // the library could not check one: run without
#else
    if (nnodes > 1) {
        tool_err("run: --nnodes %llu: the nodes must share one job secret, "
                 "and a fresh one made here would be unknown to the others: "
                 "set TP_JOB_TOKEN (or TP_JOB_TOKEN_FILE) to the same value "
                 "on every node (e.g. TP_JOB_TOKEN=$(openssl rand -hex 32)), "
                 "or pass --no-job-token to run without one "
                 "(docs/security.md)",
                 (unsigned long long)nnodes);
        return TOOL_EXIT_USAGE;
    }
    char hex[2 * 32 + 1];
    if (!run_random_hex(hex, 32, "the job secret")) {
        return TOOL_EXIT_FAIL;
    }
    setenv("TP_JOB_TOKEN", hex, 1);
    return TOOL_EXIT_OK;
#endif
}

// Longest job id the store's join keeps (JOIN_JOB_MAX in store/join.h).
#define RUN_JOB_ID_MAX 64

// Gives the ranks a job id every rank of the job agrees on, in TP_JOB_ID:
// the store's join keeps concurrent jobs on one store apart by it
// (docs/store.md). @rdzv_id (--rdzv-id) wins; else an inherited TP_JOB_ID
// is passed on; else with one node a fresh random "run-<16 hex>"; else
// (@nnodes > 1, the launchers cannot share a random one) one derived from
// what every node is given alike: "run-<addr>:<port>-<M>x<N>", or
// "run-<16 hex of its FNV-1a hash>" when that is too long. Returns
// TOOL_EXIT_OK, or the exit status after reporting.
int
run_job_id(const char *rdzv_id, uint64_t nnodes, uint64_t nproc,
           const char *addr, unsigned port)
{
    if (rdzv_id != NULL) {
        size_t len = strlen(rdzv_id);
        bool ok = len > 0 && len <= RUN_JOB_ID_MAX;
        for (size_t k = 0; ok && k < len; k++) {
            unsigned char c = (unsigned char)rdzv_id[k];
            ok = c > ' ' && c < 0x7f;
        }
        if (!ok) {
            tool_err("run: --rdzv-id needs 1..%d printable characters "
                     "without spaces (the same on every node), not \"%s\"",
                     RUN_JOB_ID_MAX, rdzv_id);
            return TOOL_EXIT_USAGE;
        }
        setenv("TP_JOB_ID", rdzv_id, 1);
        return TOOL_EXIT_OK;
    }
    const char *inherited = getenv("TP_JOB_ID");
    if (inherited != NULL && inherited[0] != '\0') {
        return TOOL_EXIT_OK; // the user's (or an outer launcher's)
    }
    char id[RUN_JOB_ID_MAX + 1];
    if (nnodes <= 1) {
        char hex[2 * 8 + 1];
        if (!run_random_hex(hex, 8, "the job id")) {
            return TOOL_EXIT_FAIL;
        }
        snprintf(id, sizeof(id), "run-%s", hex);
    } else {
        char full[512];
        int fl =
            snprintf(full, sizeof(full), "run-%s:%u-%llux%llu", addr, port,
                     (unsigned long long)nnodes, (unsigned long long)nproc);
        if (fl > 0 && (size_t)fl < sizeof(id)) {
            memcpy(id, full, (size_t)fl + 1);
        } else {
            uint64_t h = UINT64_C(14695981039346656037); // FNV-1a
            for (const char *c = full; *c != '\0'; c++) {
                h = (h ^ (unsigned char)*c) * UINT64_C(1099511628211);
            }
            snprintf(id, sizeof(id), "run-%016llx", (unsigned long long)h);
        }
    }
    setenv("TP_JOB_ID", id, 1);
    return TOOL_EXIT_OK;
}

// Finds a free tcp port by binding port 0 on @addr. Returns the port, or
// 0 after reporting the error.
unsigned
run_free_port(const char *addr)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(addr, "0", &hints, &ai);
    if (rc != 0) {
        tool_err("run: cannot resolve master address \"%s\": %s", addr,
                 gai_strerror(rc));
        return 0;
    }
    unsigned port = 0;
    int err = 0;
    for (struct addrinfo *p = ai; p != NULL && port == 0; p = p->ai_next) {
        int fd =
            socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (bind(fd, p->ai_addr, p->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            if (ss.ss_family == AF_INET) {
                port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            } else if (ss.ss_family == AF_INET6) {
                port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
            }
        } else {
            err = errno;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    if (port == 0) {
        tool_err("run: cannot find a free port on \"%s\": %s", addr,
                 strerror(err ? err : EADDRNOTAVAIL));
    }
    return port;
}

// Status of a reaped child as a shell reports it.
int
run_exit_code(int status)
{
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return TOOL_EXIT_FAIL;
}

// "SIGSEGV", or "signal 42" for one without a name; into @buf.
const char *
run_sig_name(int sig, char *buf, size_t len)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev != NULL) {
        snprintf(buf, len, "SIG%s", abbrev);
    } else {
        snprintf(buf, len, "signal %d", sig);
    }
    return buf;
}

// How a reaped child ended, for the launcher's messages: "exited with code
// 3", "was killed by signal 11 (SIGSEGV: Segmentation fault)".
void
run_describe(int status, char *buf, size_t len)
{
    if (WIFEXITED(status)) {
        snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        char nm[32];
        int sig = WTERMSIG(status);
        snprintf(buf, len, "was killed by signal %d (%s: %s)%s", sig,
                 run_sig_name(sig, nm, sizeof(nm)), strsignal(sig),
                 WCOREDUMP(status) ? ", core dumped" : "");
    } else {
        snprintf(buf, len, "ended with wait status 0x%x", (unsigned)status);
    }
}

// Sends @sig to every running rank; returns how many got it.
int
run_signal_all(run_rank *r, int n, int sig)
{
    int sent = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].rr_pid > 0 && kill(r[i].rr_pid, sig) == 0) {
            sent++;
        }
    }
    return sent;
}

// The child's side of a fork, entered with every signal blocked (see the
// top of run.c); the environment is already set by the parent.
void
run_child(pid_t parent, int out_w, int err_w, char **prog,
          const struct rlimit *nofile)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(TOOL_EXIT_FAIL); // the launcher already died
    }
    // Default dispositions first, then unblock: a SIGTERM sent since the
    // fork is pending and now kills the child, as it should.
    static const int caught[] = {SIGPIPE, SIGINT, SIGTERM, SIGCHLD};
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    for (size_t k = 0; k < sizeof(caught) / sizeof(caught[0]); k++) {
        sigaction(caught[k], &dfl, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setrlimit(RLIMIT_NOFILE, nofile);
    if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) {
        _exit(TOOL_EXIT_FAIL);
    }
    if (out_w > 2) {
        close(out_w);
    }
    if (err_w > 2) {
        close(err_w);
    }
    execvp(prog[0], prog);
    int e = errno;
    dprintf(2, "tpipe: run: cannot execute \"%s\": %s\n", prog[0], strerror(e));
    _exit(RUN_EXIT_NOEXEC);
}
