// SPDX-License-Identifier: Apache-2.0
// gen_corpus.c - writes the seed corpus of the fuzz targets from valid
// encodings made by the real encoders (plus a few near misses: one byte
// off, one bound over). Usage, from the build directory:
//   tests/fuzz/fuzz_gen_corpus <source>/tests/fuzz/corpus
// It rewrites the seed files in place (deterministic output, so an
// unchanged wire format gives an unchanged corpus). Run it again after a
// change of the wire format and commit the result.

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "agent/agent_int.h"
#include "agent/wire.h"
#include "core/wire.h"
#include "fuzz.h"
#include "pipe/wire.h"
#include "rref/wire.h"

static const char *gen_root;
static int gen_count;

static void
gen_write(const char *target, const char *name, const uint8_t *data,
          size_t size)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", gen_root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", path, strerror(errno));
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", gen_root, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    gen_count++;
}

// fuzz_handshake inputs start with a selector byte.
static void
gen_write_hs(unsigned sel, const char *name, const uint8_t *data, size_t size)
{
    static uint8_t buf[1 + TP_WIRE_MAX_HANDSHAKE];
    FUZZ_CHECK(size < sizeof(buf));
    buf[0] = (uint8_t)sel;
    memcpy(buf + 1, data, size);
    gen_write("fuzz_handshake", name, buf, size + 1);
}

static void
gen_fill(char *dst, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = (char)('!' + (seed + i * 7) % 90);
    }
    dst[n] = '\0';
}

// ---- descriptor ----

static void
gen_desc(const char *name, uint32_t np, uint32_t nt, uint64_t mlen,
         unsigned info_len, uint64_t buf_len)
{
    tp_message *msg = NULL;
    FUZZ_CHECK(tp__message_create(np, nt, mlen, &msg) == TP_OK);
    for (uint64_t i = 0; i < mlen; i++) {
        ((uint8_t *)msg->metadata)[i] = (uint8_t)('a' + i % 26);
    }
    tp__chan_info *infos = nt > 0 ? calloc(nt, sizeof(*infos)) : NULL;
    for (uint32_t i = 0; i < np; i++) {
        msg->payloads[i].len = buf_len + i;
    }
    for (uint32_t i = 0; i < nt; i++) {
        msg->tensors[i].len = buf_len * 2 + i;
        infos[i].ci_len = (uint8_t)info_len;
        for (unsigned k = 0; k < info_len; k++) {
            infos[i].ci_bytes[k] = (uint8_t)(i * 16 + k);
        }
    }
    uint64_t size = tp__desc_size(msg, infos);
    uint8_t *out = malloc((size_t)size);
    FUZZ_CHECK(out != NULL);
    FUZZ_CHECK(tp__desc_encode(msg, infos, out, size) == size);
    gen_write("fuzz_desc", name, out, (size_t)size);
    free(out);
    free(infos);
    tp_message_destroy(msg);
}

static void
gen_desc_all(void)
{
    gen_desc("empty", 0, 0, 0, 0, 0);
    gen_desc("metadata-only", 0, 0, 40, 0, 0);
    gen_desc("one-payload", 1, 0, 8, 0, 100);
    gen_desc("one-tensor-cma-info", 0, 1, 0, 16, 4096);
    gen_desc("typical", 3, 5, 100, 12, 1000);
    gen_desc("tiny-limits-max", 4, 4, 64, 32, 1000);
    gen_desc("max-info", 0, 8, 0, TP_WIRE_MAX_CHAN_INFO, 1);
    gen_desc("huge-lengths", 2, 2, 0, 0, UINT64_C(1) << 62);
    // Near misses.
    uint8_t b[64] = {0};
    tp__put_u32le(b + 8, 2); // two payloads of 2^63: the sum overflows
    tp__put_u64le(b + 16, UINT64_C(1) << 63);
    tp__put_u64le(b + 24, UINT64_C(1) << 63);
    gen_write("fuzz_desc", "bad-sum-overflow", b, 32);
    memset(b, 0, sizeof(b));
    tp__put_u32le(b + 12, 1); // one tensor on device type 2 (unknown)
    b[24] = 2;
    gen_write("fuzz_desc", "bad-device", b, 27);
    memset(b, 0, sizeof(b));
    gen_write("fuzz_desc", "bad-trailing", b, 17);
}

// ---- brochure ----

static tp__brochure gen_b;

static void
gen_brochure(const char *name)
{
    static uint8_t out[TP_WIRE_MAX_HANDSHAKE];
    size_t n = tp__brochure_encode(&gen_b, out, sizeof(out));
    FUZZ_CHECK(n > 0);
    gen_write("fuzz_brochure", name, out, n);
}

static void
gen_brochure_all(void)
{
    memset(&gen_b, 0, sizeof(gen_b));
    gen_brochure("empty");
    strcpy(gen_b.b_ctxname, "trainer-3");
    gen_b.b_ntransports = 2;
    strcpy(gen_b.b_transports[0].be_name, "shm");
    strcpy(gen_b.b_transports[0].be_domain, "boot:4f2a");
    strcpy(gen_b.b_transports[0].be_addr, "shm://tpipe-4242-1");
    strcpy(gen_b.b_transports[1].be_name, "tcp");
    strcpy(gen_b.b_transports[1].be_addr, "tcp://127.0.0.1:29500");
    gen_b.b_nchannels = 4;
    strcpy(gen_b.b_channels[0].be_name, "cma");
    strcpy(gen_b.b_channels[0].be_domain, "boot:4f2a/uid:1000");
    strcpy(gen_b.b_channels[1].be_name, "xth");
    strcpy(gen_b.b_channels[1].be_domain, "pid:4242");
    strcpy(gen_b.b_channels[2].be_name, "mpt");
    strcpy(gen_b.b_channels[3].be_name, "basic");
    gen_brochure("typical");

    memset(&gen_b, 0, sizeof(gen_b));
    gen_fill(gen_b.b_ctxname, TP_WIRE_MAX_CTXNAME, 0);
    gen_b.b_ntransports = TP_WIRE_MAX_BACKENDS;
    gen_b.b_nchannels = TP_WIRE_MAX_BACKENDS;
    for (unsigned i = 0; i < TP_WIRE_MAX_BACKENDS; i++) {
        gen_fill(gen_b.b_transports[i].be_name, TP_WIRE_MAX_NAME, i);
        gen_fill(gen_b.b_transports[i].be_domain, TP_WIRE_MAX_DOMAIN, i + 1);
        gen_fill(gen_b.b_transports[i].be_addr, TP_WIRE_MAX_ADDR, i + 2);
        gen_fill(gen_b.b_channels[i].be_name, TP_WIRE_MAX_NAME, i + 3);
        gen_fill(gen_b.b_channels[i].be_domain, TP_WIRE_MAX_DOMAIN, i + 4);
    }
    gen_brochure("max");

    // Near miss: 17 transports.
    uint8_t b[8] = {17, 0, 0, 0, 0};
    gen_write("fuzz_brochure", "bad-count", b, 5);
}

// ---- answer, join, frame header ----

static tp__answer gen_a;

static void
gen_answer(const char *name)
{
    static uint8_t out[TP_WIRE_MAX_HANDSHAKE];
    size_t n = tp__answer_encode(&gen_a, out, sizeof(out));
    FUZZ_CHECK(n > 0);
    gen_write_hs(1, name, out, n);
}

static void
gen_handshake_all(void)
{
    for (unsigned t = TP_FRAME_BROCHURE; t <= TP_FRAME_ACK; t++) {
        tp__frame_hdr h = {(uint8_t)t, TP_PIPE_WIRE_VERSION, t * 3, 100 * t};
        uint8_t out[TP_FRAME_HDR_LEN];
        tp__frame_hdr_encode(out, &h);
        char name[32];
        snprintf(name, sizeof(name), "hdr-type%u", t);
        gen_write_hs(0, name, out, sizeof(out));
    }

    memset(&gen_a, 0, sizeof(gen_a));
    strcpy(gen_a.a_ctxname, "server");
    strcpy(gen_a.a_reason, "no common transport");
    gen_answer("answer-refused");
    memset(&gen_a, 0, sizeof(gen_a));
    gen_a.a_accepted = true;
    strcpy(gen_a.a_ctxname, "server");
    strcpy(gen_a.a_transport, "shm");
    strcpy(gen_a.a_transport_addr, "shm://tpipe-77-3");
    gen_a.a_transport_reg_id = 5;
    strcpy(gen_a.a_channel, "mpt");
    gen_a.a_nconns = 2;
    strcpy(gen_a.a_conns[0].ac_addr, "tcp://127.0.0.1:29501");
    gen_a.a_conns[0].ac_reg_id = 6;
    strcpy(gen_a.a_conns[1].ac_addr, "tcp://127.0.0.1:29501");
    gen_a.a_conns[1].ac_reg_id = 7;
    gen_answer("answer-accepted");
    gen_a.a_nconns = TP_WIRE_MAX_CONNS;
    for (unsigned i = 0; i < TP_WIRE_MAX_CONNS; i++) {
        gen_fill(gen_a.a_conns[i].ac_addr, 40, i);
        gen_a.a_conns[i].ac_reg_id = 100 + i;
    }
    gen_answer("answer-max-conns");

    uint8_t j[TP_JOIN_LEN];
    tp__join_encode(42, 3, j);
    gen_write_hs(2, "join", j, sizeof(j));
    tp__join_encode(0, 0, j);
    gen_write_hs(2, "join-bad-reg-id", j, sizeof(j));
}

// ---- RPC agent messages (fuzz_rpc) ----

// Writes the fuzz_rpc input of a message @h with @nt f32 tensors of 4
// elements (arriving on @targets, NULL: the CPU) and @np payloads.
static void
gen_rpc_on(const char *name, const ag_hdr *h, uint32_t nt, uint32_t np,
           const tp_device *targets)
{
    tp_args *args = NULL;
    FUZZ_CHECK(tp__ag_args_create_empty(nt, &args) == TP_OK);
    for (uint32_t i = 0; i < nt; i++) {
        int64_t shape[2] = {2, 2};
        tp_tensor *t = NULL;
        FUZZ_CHECK(tp_tensor_empty(TP_F32, 2, shape, &t, NULL) == TP_OK);
        tp__ag_args_push_tensor(args, t);
    }
    size_t msize = tp__ag_wire_size(h->h_fn_name_len, h->h_ext_len, args);
    size_t size = 2 + 8u * nt + msize;
    uint8_t *buf = malloc(size);
    FUZZ_CHECK(buf != NULL);
    buf[0] = (uint8_t)nt;
    buf[1] = (uint8_t)np;
    for (uint32_t i = 0; i < nt; i++) {
        tp__put_u64le(buf + 2 + 8 * i, 16);
    }
    tp__ag_wire_encode(buf + 2 + 8u * nt, h, args, targets);
    gen_write("fuzz_rpc", name, buf, size);
    free(buf);
    tp_args_unref(args);
}

static void
gen_rpc(const char *name, const ag_hdr *h, uint32_t nt, uint32_t np)
{
    gen_rpc_on(name, h, nt, np, NULL);
}

// Appends section @id of @n bytes to @ext at *@off.
static void
gen_section(uint8_t *ext, size_t *off, unsigned id, const uint8_t *p, size_t n)
{
    ext[*off] = (uint8_t)id;
    memset(ext + *off + 1, 0, 3);
    tp__put_u32le(ext + *off + 4, (uint32_t)n);
    memcpy(ext + *off + AG_WIRE_SEC_HDR, p, n);
    *off += AG_WIRE_SEC_HDR + n;
}

static void
gen_rpc_all(void)
{
    ag_hdr h;
    memset(&h, 0, sizeof(h));
    h.h_kind = AG_KIND_REQUEST;
    h.h_call_id = 7;
    h.h_fn_name = "tp.noop";
    h.h_fn_name_len = 7;
    h.h_fn_id = 0x1234;
    gen_rpc("request-noop", &h, 0, 0);
    h.h_fn_name = "tp.echo";
    gen_rpc("request-echo-2t", &h, 2, 1);
    // Device maps: one tensor to the receiver's cuda:3, one to its CPU.
    const tp_device targets[2] = {{TP_DEVICE_CUDA, 3}, {TP_DEVICE_CPU, 0}};
    gen_rpc_on("request-echo-cuda-target", &h, 2, 1, targets);
    // A request carrying two RRefs in the rref protocol's section.
    rr_desc d[2] = {
        {.d_id = {1, 5}, .d_fork = {0, 9}, .d_owner = 1},
        {.d_id = {2, 1}, .d_fork = {0, 10}, .d_owner = 2, .d_flags = 1},
    };
    uint8_t sec[256], ext[512];
    tp__rr_sec_encode(d, 2, sec);
    size_t off = 0;
    gen_section(ext, &off, 1, sec, tp__rr_sec_size(2));
    h.h_ext = ext;
    h.h_ext_len = (uint32_t)off;
    gen_rpc("request-rrefs", &h, 1, 1);
    memset(&h, 0, sizeof(h));
    h.h_kind = AG_KIND_RESPONSE;
    h.h_call_id = 7;
    gen_rpc("response-1t", &h, 1, 1);
    h.h_ext = ext;
    h.h_ext_len = (uint32_t)off;
    gen_rpc("response-rrefs", &h, 0, 0);
    memset(&h, 0, sizeof(h));
    h.h_kind = AG_KIND_ERROR;
    h.h_call_id = 8;
    h.h_status = TP_EINVAL;
    gen_rpc("error", &h, 0, 1);
    // RRef protocol messages: section 0 is the kind's header.
    static const struct {
        unsigned kind;
        const char *name, *fn;
    } kinds[] = {
        {RR_KIND_REMOTE, "rref-remote", "t.make"},
        {RR_KIND_FETCH, "rref-fetch", NULL},
        {RR_KIND_FORK, "rref-fork", NULL},
        {RR_KIND_CHILD_ACCEPT, "rref-child-accept", NULL},
        {RR_KIND_DELETE, "rref-delete", NULL},
        {RR_KIND_CALL, "rref-call", "forward"},
    };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        rr_msg m = {.m_id = {0, 3}, .m_fork = {0, 3}};
        uint8_t kh[64];
        tp__rr_hdr_encode(kinds[i].kind, &m, kh);
        off = 0;
        gen_section(ext, &off, 0, kh, tp__rr_hdr_size(kinds[i].kind));
        memset(&h, 0, sizeof(h));
        h.h_kind = (ag_kind)kinds[i].kind;
        h.h_call_id = 40 + i;
        h.h_fn_name = kinds[i].fn;
        h.h_fn_name_len =
            kinds[i].fn != NULL ? (uint16_t)strlen(kinds[i].fn) : 0;
        h.h_ext = ext;
        h.h_ext_len = (uint32_t)off;
        gen_rpc(kinds[i].name, &h, 0, 0);
    }
    // Near misses: sections out of order, a section 0 in a request.
    off = 0;
    gen_section(ext, &off, 1, sec, tp__rr_sec_size(2));
    gen_section(ext, &off, 0, sec, 8);
    memset(&h, 0, sizeof(h));
    h.h_kind = (ag_kind)RR_KIND_FETCH;
    h.h_ext = ext;
    h.h_ext_len = (uint32_t)off;
    gen_rpc("bad-section-order", &h, 0, 0);
    h.h_kind = AG_KIND_REQUEST;
    h.h_fn_name = "tp.noop";
    h.h_fn_name_len = 7;
    off = 0;
    gen_section(ext, &off, 0, sec, 8);
    h.h_ext_len = (uint32_t)off;
    gen_rpc("bad-section-zero", &h, 0, 0);
}

// ---- RRef protocol (fuzz_rref) ----

static void
gen_rref(const char *name, unsigned what, uint8_t from, uint8_t world,
         const uint8_t *p, size_t n)
{
    uint8_t buf[4096];
    FUZZ_CHECK(n + 3 <= sizeof(buf));
    buf[0] = (uint8_t)what;
    buf[1] = from;
    buf[2] = world;
    memcpy(buf + 3, p, n);
    gen_write("fuzz_rref", name, buf, n + 3);
}

static void
gen_rref_all(void)
{
    static const char *const names[] = {"remote",       "fetch",  "fork",
                                        "child-accept", "delete", "call"};
    for (unsigned k = 0; k < 6; k++) {
        rr_msg m = {.m_id = {1, 3}, .m_fork = {1, 3}};
        if (k == 0) {
            m.m_flags = RR_REMOTE_PROXY;
            m.m_target = (rr_id){2, 8};
        }
        if (k == 5) {
            m.m_flags = RR_CALL_METHOD;
        }
        uint8_t h[64];
        tp__rr_hdr_encode(RR_KIND_REMOTE + k, &m, h);
        gen_rref(names[k], k, 1, 4, h, tp__rr_hdr_size(RR_KIND_REMOTE + k));
    }
    rr_desc d[3] = {
        {.d_id = {0, 1}, .d_fork = {2, 4}, .d_owner = 0},
        {.d_id = {3, 77}, .d_fork = {2, 5}, .d_owner = 1, .d_flags = 1},
        {.d_id = {2, 2}, .d_fork = {2, 6}, .d_owner = 2},
    };
    uint8_t sec[256];
    tp__rr_sec_encode(d, 3, sec);
    gen_rref("section", 6, 2, 4, sec, tp__rr_sec_size(3));
    // Near misses: a fork not made by its sender, an owner out of range.
    gen_rref("bad-section-fork", 6, 1, 4, sec, tp__rr_sec_size(3));
    gen_rref("bad-section-world", 6, 2, 3, sec, tp__rr_sec_size(3));
    rr_msg m = {.m_id = {1, 3}, .m_fork = {1, 4}};
    uint8_t h[64];
    tp__rr_hdr_encode(RR_KIND_REMOTE, &m, h);
    gen_rref("bad-remote-fork", 0, 1, 4, h, tp__rr_hdr_size(RR_KIND_REMOTE));
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
        return 2;
    }
    gen_root = argv[1];
    if (mkdir(gen_root, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", gen_root, strerror(errno));
        return 1;
    }
    gen_desc_all();
    gen_brochure_all();
    gen_handshake_all();
    gen_rpc_all();
    gen_rref_all();
    printf("wrote %d seed files under %s\n", gen_count, gen_root);
    return 0;
}
