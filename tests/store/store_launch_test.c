// SPDX-License-Identifier: Apache-2.0
// store_launch_test.c - env:// without MASTER_ADDR/MASTER_PORT: the Slurm
// node list parser (expansions and malformed lists with their messages),
// the port derived from the job id, and two processes that meet through
// env:// with only fake SLURM_* variables. The PMIx exchange is tested
// under mpirun by tests/tools/run_pmix_test.sh.

#include "tp_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/store.h>

#include "core/platform.h"
#include "store/launch.h"

typedef struct hosts {
    char h_all[1024]; // "a,b,c"
    size_t h_n;
} hosts;

static bool
collect_cb(void *arg, const char *host)
{
    hosts *h = arg;
    size_t l = strlen(h->h_all);
    snprintf(h->h_all + l, sizeof(h->h_all) - l, "%s%s", h->h_n ? "," : "",
             host);
    h->h_n++;
    return true;
}

static void
expect_hosts(const char *list, const char *want, size_t n)
{
    hosts h = {.h_all = "", .h_n = 0};
    tp_error *err = NULL;
    TP_CHECK_OK(tp__slurm_nodelist_visit(list, collect_cb, &h, &err), err);
    TP_CHECKF(strcmp(h.h_all, want) == 0 && h.h_n == n,
              "%s expanded to \"%s\" (%zu), want \"%s\" (%zu)", list, h.h_all,
              h.h_n, want, n);
}

static void
test_nodelist_expand(void)
{
    expect_hosts("node[01-03,07]", "node01,node02,node03,node07", 4);
    expect_hosts("a1,b[2-3]", "a1,b2,b3", 3);
    expect_hosts("gpu-[001-004]-ib",
                 "gpu-001-ib,gpu-002-ib,gpu-003-ib,"
                 "gpu-004-ib",
                 4);
    expect_hosts("localhost", "localhost", 1);
    expect_hosts("127.0.0.1", "127.0.0.1", 1);
    expect_hosts("n[8-11]", "n8,n9,n10,n11", 4);
    expect_hosts("r[1-2]n[1-2],x", "r1n1,r1n2,r2n1,r2n2,x", 5);
    expect_hosts("c[5],d[09-10]", "c5,d09,d10", 3);
}

static void
expect_bad(const char *list, const char *why)
{
    hosts h = {.h_all = "", .h_n = 0};
    tp_error *err = NULL;
    tp_status st = tp__slurm_nodelist_visit(list, collect_cb, &h, &err);
    TP_CHECKF(st == TP_EINVAL, "\"%s\": status %s, want TP_EINVAL", list,
              tp_status_name(st));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), why);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "slurm node list");
    tp_error_unref(err);
}

static void
test_nodelist_malformed(void)
{
    expect_bad("node[01-", "unclosed \"[\"");
    expect_bad("node[01-03", "unclosed \"[\"");
    expect_bad("node[3-1]", "descending range");
    expect_bad("node[]", "empty range");
    expect_bad("", "empty");
    expect_bad("a,,b", "empty host name");
    expect_bad(",a", "empty host name");
    expect_bad("a,", "empty host name");
    expect_bad("node[a-b]", "not a number");
    expect_bad("node[1-]", "without a HIGH");
    expect_bad("node[1,]", "ending in \",\"");
    expect_bad("node]1", "\"]\" without \"[\"");
    expect_bad("n[1-2[3]]", "nested");
    expect_bad("a b", "white space");
    expect_bad("n[0-999999999]", "more than 1000000 hosts");
    char longname[300];
    memset(longname, 'x', 299);
    longname[299] = '\0';
    expect_bad(longname, "longer than 255");
}

static void
test_first_host_and_port(void)
{
    char host[64];
    tp_error *err = NULL;
    TP_CHECK_OK(tp__slurm_first_host("gpu-[001-004]-ib,login", host,
                                     sizeof(host), &err),
                err);
    TP_CHECK(strcmp(host, "gpu-001-ib") == 0);
    TP_CHECK_EQ(tp__slurm_port(12345), 22345);
    TP_CHECK_EQ(tp__slurm_port(0), 20000);
    TP_CHECK_EQ(tp__slurm_port(9999), 29999);
    TP_CHECK_EQ(tp__slurm_port(10000), 20000);

    // From the environment: only where MASTER_* left a gap.
    setenv("SLURM_JOB_NODELIST", "node[07-08]", 1);
    setenv("SLURM_JOB_ID", "12345", 1);
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_NODELIST");
    char h[64] = "", p[16] = "";
    bool found = false;
    TP_CHECK_OK(tp__slurm_master(h, sizeof(h), p, sizeof(p), &found, &err),
                err);
    TP_CHECK(found);
    TP_CHECK(strcmp(h, "node07") == 0);
    TP_CHECK(strcmp(p, "22345") == 0);
    // The step's list wins over the job's.
    setenv("SLURM_STEP_NODELIST", "node08", 1);
    h[0] = p[0] = '\0';
    snprintf(p, sizeof(p), "29500"); // MASTER_PORT given
    TP_CHECK_OK(tp__slurm_master(h, sizeof(h), p, sizeof(p), &found, &err),
                err);
    TP_CHECK(strcmp(h, "node08") == 0 && strcmp(p, "29500") == 0);
    // Malformed values are named.
    setenv("SLURM_STEP_NODELIST", "node[1-", 1);
    h[0] = p[0] = '\0';
    TP_CHECK(tp__slurm_master(h, sizeof(h), p, sizeof(p), &found, &err) ==
             TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "SLURM_STEP_NODELIST");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "unclosed");
    tp_error_unref(err);
    err = NULL;
    unsetenv("SLURM_STEP_NODELIST");
    setenv("SLURM_JOB_ID", "12x", 1);
    TP_CHECK(tp__slurm_master(h, sizeof(h), p, sizeof(p), &found, &err) ==
             TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "SLURM_JOB_ID=12x");
    tp_error_unref(err);
    err = NULL;
    // Not under Slurm.
    unsetenv("SLURM_JOB_ID");
    found = true;
    TP_CHECK_OK(tp__slurm_master(h, sizeof(h), p, sizeof(p), &found, &err),
                err);
    TP_CHECK(!found);
}

// A job id whose derived port is free on 127.0.0.1: that port stays
// reserved by a bound, never-listening SO_REUSEADDR socket (as
// tp_test_free_port does), so no other test takes it.
static unsigned long
free_slurm_job_id(void)
{
    unsigned start = (unsigned)getpid() % TP__SLURM_PORT_SPAN;
    for (unsigned k = 0; k < TP__SLURM_PORT_SPAN; k++) {
        unsigned long id = 100000u + (start + k) % TP__SLURM_PORT_SPAN;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        TP_CHECK(fd >= 0);
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port =
                                     htons((uint16_t)tp__slurm_port(id))};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            return id; // fd stays open for the life of the case
        }
        close(fd);
    }
    tp_test_skip("no free port in 20000..29999");
}

static void
slurm_task(int rank)
{
    char v[16];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("SLURM_PROCID", v, 1);
    setenv("SLURM_LOCALID", v, 1);
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open("env://", -1, -1, tp_test_ms(20000), &s, &err),
                err);
    char key[16];
    snprintf(key, sizeof(key), "k%d", rank);
    TP_CHECK_OK(tp_store_set(s, key, "v", 1, tp_test_ms(20000), &err), err);
    void *val = NULL;
    size_t len = 0;
    TP_CHECK_OK(tp_store_get(s, rank ? "k0" : "k1", tp_test_ms(20000), &val,
                             &len, &err),
                err);
    TP_CHECK(len == 1);
    free(val);
    // Rank 0 hosts the server: it leaves last.
    if (rank == 0) {
        val = NULL;
        TP_CHECK_OK(tp_store_get(s, "bye", tp_test_ms(20000), &val, &len, &err),
                    err);
        free(val);
    } else {
        TP_CHECK_OK(tp_store_set(s, "bye", "1", 1, tp_test_ms(20000), &err),
                    err);
    }
    tp_store_close(s);
}

static void
test_env_under_slurm(void)
{
    unsigned long id = free_slurm_job_id();
    char v[32];
    snprintf(v, sizeof(v), "%lu", id);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("PMIX_RANK");
    setenv("SLURM_JOB_NODELIST", "localhost,node[2-9]", 1);
    setenv("SLURM_JOB_ID", v, 1);
    setenv("SLURM_NTASKS", "2", 1);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        TP_CHECK(pids[r] >= 0);
        if (pids[r] == 0) {
            slurm_task(r);
            _exit(0);
        }
    }
    uint64_t dl = tp__now_ns() + (uint64_t)tp_test_ms(30000) * 1000000u;
    for (int r = 0; r < 2; r++) {
        int status = 0;
        for (;;) {
            pid_t w = waitpid(pids[r], &status, WNOHANG);
            if (w == pids[r]) {
                break;
            }
            if (tp__now_ns() > dl) {
                kill(pids[0], SIGKILL);
                kill(pids[1], SIGKILL);
                waitpid(pids[r], &status, 0);
                TP_CHECKF(false, "slurm task %d did not finish", r);
            }
            usleep(2000);
        }
        TP_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "slurm task %d failed (status 0x%x)", r, status);
    }
}

static void
test_env_without_launcher(void)
{
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    unsetenv("SLURM_JOB_NODELIST");
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_NODELIST");
    unsetenv("SLURM_JOB_ID");
    unsetenv("PMIX_RANK");
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK(tp_store_open("env://", -1, -1, 1000, &s, &err) == TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "MASTER_ADDR");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "SLURM_JOB_NODELIST");
    tp_error_unref(err);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_nodelist_expand),
    TP_TEST_CASE(test_nodelist_malformed),
    TP_TEST_CASE(test_first_host_and_port),
    TP_TEST_CASE_T(test_env_under_slurm, 60),
    TP_TEST_CASE(test_env_without_launcher),
};
TP_TEST_MAIN(cases)
