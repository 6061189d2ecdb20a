// SPDX-License-Identifier: Apache-2.0
// cuda_ipc.c - the cuda_ipc channel: CUDA tensors between two processes
// (or two contexts of one process) on one host, without a copy through
// host memory. The pipe gives it the tensors whose buffer is on a CUDA
// device at the writer (it is the pipe's device channel, chosen beside the
// CPU channel; docs/cuda.md). The sender puts the memory handle of the
// tensor's allocation and the tensor's offset in it in the descriptor; the
// receiver opens the handle (cudaIpcOpenMemHandle, peer access enabled
// lazily: NVLink or PCIe between two GPUs), copies the bytes once to the
// destination it chose, a CUDA device or host memory, closes the handle
// and acknowledges on the channel's own connection (the ack frame of
// chan_ack.h), so the sender can release the buffer: the sender's write
// completes on that ack.
//
// Streams: the pipe synchronises each source device before it hands the
// tensor to the channel (pipe_cuda.c), and the receiver's copy has
// returned before its read completes, as on the staging path.
//
// Only tensors that travel by cuda_ipc depend on this channel's
// connection: its failure fails the pipe only while an op waits on it; a
// peer that read its last message and exited does not fail the writes
// whose bytes it already has (as cma).

#include "channel/cuda_ipc/cuda_ipc_impl.h"

#include "core/host.h"

static unsigned
cipc_nconns(const tp_config *cfg, bool *lanes_p)
{
    (void)cfg;
    *lanes_p = false;
    return 1;
}

// cuda_ipc's own tunables (TP_TUNABLES_OWN, table at the end).
typedef struct cipc_tunables {
    int64_t ct_mode;           // TP_CUDA_IPC: 0 auto, 1 on, 2 off
    int64_t ct_cache;          // TP_CUDA_IPC_CACHE: idle mappings kept per pipe
    int64_t ct_reader_wait_ms; // TP_CUDA_IPC_READER_WAIT_MS
} cipc_tunables;

extern const tp_tunables tp__cuda_ipc_tunables;

// Must not initialise the CUDA runtime (every context creation asks).
static bool
cipc_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    const cipc_tunables *ct = tp__config_own_const(cfg, &tp__cuda_ipc_tunables);
    if (ct->ct_mode == 2) {
        snprintf(why, why_len, "off (TP_CUDA_IPC=off)");
        return false;
    }
    return tp__cuda_probe(ct->ct_mode == 0, why, why_len);
}

// Same host (boot id), same PID and IPC namespaces: a memory handle is
// opened by the driver of this host, and a pid in the info names the same
// process on both ends.
static tp_status
cipc_domain(const tp_config *cfg, char *buf, size_t len, tp_error **err_p)
{
    (void)cfg;
    char boot[64];
    uint64_t pidns = 0, ipcns = 0;
    int e = tp__host_boot_id(boot, sizeof(boot));
    if (e == 0) {
        e = tp__host_ns_inode("pid", &pidns);
    }
    if (e == 0) {
        e = tp__host_ns_inode("ipc", &ipcns);
    }
    if (e != 0) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "cuda_ipc: cannot tell which host and namespaces "
                             "this is (%s)",
                             strerror(e));
    }
    int n = snprintf(buf, len, "cuda_ipc:%s:pid=%" PRIu64 ":ipc=%" PRIu64, boot,
                     pidns, ipcns);
    if (n < 0 || (size_t)n >= len) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "cuda_ipc: domain descriptor longer than %zu "
                             "bytes",
                             len);
    }
    return TP_OK;
}

static void cipc_read_acks(tp_chan *ch);

void
tp__cipc_maybe_free(tp_chan *ch)
{
    if (ch->c_destroy_req && !ch->c_rbusy && !ch->c_acks.ca_wbusy &&
        ch->c_copies == 0) {
        tp__loop_defer(ch->c_env.ce_loop, &ch->c_free_task);
    }
}

static void
cipc_free_task(void *arg)
{
    tp_chan *ch = arg;
    TP_LOG_DEBUG("TP-CUDA-IPC-CACHE",
                 "cuda_ipc: pipe to %s: %" PRIu64 " handles opened, %" PRIu64
                 " tensors from cached ones",
                 ch->c_env.ce_peer, ch->c_cache.cc_opens, ch->c_cache.cc_hits);
    tp__cipc_cache_fini(&ch->c_cache);
    tp__aio_fini(&ch->c_raio);
    tp__chan_acks_fini(&ch->c_acks);
    tp__free(ch);
}

void
tp__cipc_fail(tp_chan *ch, tp_error *err)
{
    if (!ch->c_closed) {
        ch->c_env.ce_fail(ch->c_env.ce_pipe, err);
    } else {
        tp_error_unref(err);
    }
}

// The connection failed with @err (taken): fatal only for a protocol
// error or while a send waits for its ack (see the top of this file).
static void
cipc_broken(tp_chan *ch, tp_error *err)
{
    if (ch->c_closed) {
        tp_error_unref(err);
        return;
    }
    err = tp__chan_acks_broken(&ch->c_acks, err, false);
    if (err != NULL) {
        tp__cipc_fail(ch, err);
    }
}

static void
cipc_write_failed(void *owner, tp_error *err)
{
    cipc_broken(owner, err);
}

static void
cipc_write_ended(void *owner)
{
    tp__cipc_maybe_free(owner);
}

static void
cipc_raio_cb(void *arg)
{
    tp_chan *ch = arg;
    ch->c_rbusy = false;
    if (ch->c_closed) {
        tp__cipc_maybe_free(ch);
        return;
    }
    if (tp_aio_status(&ch->c_raio) != TP_OK) {
        cipc_broken(ch, tp__error_new(tp_aio_status(&ch->c_raio), 0,
                                      tp_aio_error(&ch->c_raio),
                                      "cuda_ipc: pipe to %s: ack connection",
                                      ch->c_env.ce_peer));
        return;
    }
    tp_error *err = NULL;
    if (tp__chan_acks_got(&ch->c_acks, ch->c_rbuf, &err) != TP_OK) {
        tp__cipc_fail(ch, err);
        return;
    }
    cipc_read_acks(ch);
}

static void
cipc_read_acks(tp_chan *ch)
{
    if (ch->c_closed || ch->c_rbusy || ch->c_acks.ca_err != NULL) {
        return;
    }
    tp_aio_set_timeout(&ch->c_raio, 0); // acks come when reads are done
    tp_iov iov = {ch->c_rbuf, sizeof(ch->c_rbuf)};
    tp_aio_set_iov(&ch->c_raio, 1, &iov);
    ch->c_rbusy = true;
    tp__conn_read(ch->c_conn, &ch->c_raio);
}

static tp_status
cipc_create(const tp_chan_env *env, tp_chan **ch_p, tp_error **err_p)
{
    if (env->ce_nconns != 1) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "cuda_ipc: needs 1 connection, got %u",
                             env->ce_nconns);
    }
    tp_chan *ch = tp__zalloc(sizeof(*ch));
    if (ch == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "cuda_ipc: out of memory");
    }
    ch->c_env = *env;
    ch->c_conn = env->ce_conns[0];
    tp__chan_acks_init(&ch->c_acks, "cuda_ipc", env, ch->c_conn,
                       cipc_write_failed, cipc_write_ended, ch);
    ch->c_acks.ca_send_done = tp__cipc_send_done;
    ch->c_acks.ca_down_code = "TP-CUDA-IPC-DOWN";
    tp__aio_init(&ch->c_raio, cipc_raio_cb, ch);
    tp__task_init(&ch->c_free_task, cipc_free_task, ch);
    const cipc_tunables *ct =
        tp__config_own_const(env->ce_cfg, &tp__cuda_ipc_tunables);
    tp__cipc_cache_init(&ch->c_cache, (unsigned)ct->ct_cache);
    ch->c_reader_wait_ms = ct->ct_reader_wait_ms;
    cipc_read_acks(ch);
    *ch_p = ch;
    return TP_OK;
}

static void
cipc_close(tp_chan *ch, const tp_error *err)
{
    ch->c_closed = true;
    tp__chan_acks_close(&ch->c_acks, err);
    tp_aio_cancel(&ch->c_raio);
}

static void
cipc_destroy(tp_chan *ch)
{
    ch->c_destroy_req = true;
    tp__cipc_maybe_free(ch);
}

static const char *const cipc_modes[] = {"auto", "on", "off", NULL};

static const tp_tunable cipc_tunable_rows[] = {
    {
        .tu_name = "cuda_ipc",
        .tu_env = "TP_CUDA_IPC",
        .tu_def = "auto",
        .tu_doc = "the cuda_ipc channel: auto offers it where an NVIDIA "
                  "driver (/dev/nvidiactl), libcuda.so.1 and libcudart are "
                  "found, on skips the /dev/nvidiactl check, off never "
                  "(auto|on|off)",
        .tu_type = TP_TUNABLE_ENUM,
        TP_TUNABLE_FIELD(cipc_tunables, ct_mode),
        .tu_min = 0,
        .tu_max = 2,
        .tu_choices = cipc_modes,
    },
    {
        .tu_name = "cuda_ipc_cache",
        .tu_env = "TP_CUDA_IPC_CACHE",
        // 0: CUDA leaves cudaFree of an exported allocation that an
        // importer still has open undefined, so keeping mappings is for
        // senders that never free what they sent while the pipe lives.
        .tu_def = "0",
        .tu_doc = "cuda_ipc: the peer's allocations a pipe keeps open after "
                  "their copy, for the next tensor (0: close each after its "
                  "copy); only where the sender never frees memory it sent "
                  "while the pipe lives (cudaFree of a mapped allocation is "
                  "undefined)",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(cipc_tunables, ct_cache),
        .tu_min = 0,
        .tu_max = 4096,
    },
    {
        .tu_name = "cuda_ipc_reader_wait_ms",
        .tu_env = "TP_CUDA_IPC_READER_WAIT_MS",
        .tu_def = "30000",
        .tu_doc = "cuda_ipc: how long the sends a closing pipe fails wait, "
                  "all together, for readers in their own process still "
                  "copying from their tensors before they complete without "
                  "them (logged: the buffer may still be read until that "
                  "copy returns), in ms",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(cipc_tunables, ct_reader_wait_ms),
        .tu_min = 1,
        .tu_max = 3600000,
    },
};

const tp_tunables tp__cuda_ipc_tunables = {
    .ts_component = "cuda_ipc",
    .ts_rows = cipc_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(cipc_tunable_rows),
    .ts_store = TP_TUNABLES_OWN,
    .ts_size = sizeof(cipc_tunables),
};

const tp_channel_ops tp__channel_cuda_ipc_ops = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "cuda_ipc",
    // CUDA at the writer; the reader's destination a device or the host.
    .devices = TP_CHAN_DEV_CUDA_CUDA | TP_CHAN_DEV_CPU_CUDA,
    .tunables = &tp__cuda_ipc_tunables,
    .nconns = cipc_nconns,
    .is_viable = cipc_is_viable,
    .domain = cipc_domain,
    .create = cipc_create,
    .accepts = tp__cipc_accepts,
    .send = tp__cipc_send,
    .recv = tp__cipc_recv,
    .close = cipc_close,
    .destroy = cipc_destroy,
};
