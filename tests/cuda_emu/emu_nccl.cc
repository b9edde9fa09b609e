/* The fake NCCL of the CPU execution harness: the functions of NVIDIA's nccl.h that luna calls,
 * with their exact signatures, for ranks that are processes of one machine (mpirun -np N, each
 * with its own fake GPU).
 *
 * Transport: a POSIX shared-memory segment named in the ncclUniqueId (rank 0 creates it in
 * ncclCommInitRank, the others open it; unlinked once all joined). ncclAllReduce runs at once,
 * synchronously like every operation of the harness: each rank copies a chunk of its send buffer
 * into its slot, waits for all, sums the slots in rank order 0, 1, ..., N-1 (so the result is the
 * same bits on every rank and in every run, as NCCL's is within one configuration), waits again
 * (nobody overwrites a slot still being read), next chunk. The ranks must issue the same
 * collectives in the same order with the same counts and types: a mismatch is detected (each
 * arrival publishes its operation's signature) and reported instead of summing garbage.
 *
 * Argument checks, each a message on stderr ("luna-cuda-emu: ncclAllReduce: ...") and an error
 * code as NCCL returns it: a NULL or destroyed communicator; count beyond the buffers' allocations
 * (send and receive must lie inside cudaMalloc'ed memory, as NCCL needs device memory); send and
 * receive partially overlapping (in place means equal pointers); an unsupported data type or
 * reduction; an unknown or destroyed stream; rank/nranks out of range at init.
 *
 * ncclCommAbort sets a flag in the segment: every rank blocked in a collective returns
 * ncclRemoteError, and ncclCommGetAsyncError reports it. Not emulated: asynchronous progress
 * on a stream (work is done at the call), other collectives, several communicators per segment
 * with interleaved use, ranks on several machines. */
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emu_internal.h"

namespace {

constexpr uint64_t MAGIC = 0x6c756e615f6e636cull; /* "luna_ncl" */
constexpr int MAX_RANKS = 64;
constexpr size_t SLOT_BYTES = (size_t)1 << 20;
constexpr double JOIN_TIMEOUT_S = 120;

struct rank_state {
    std::atomic<uint64_t> arrived; /* barrier generation this rank reached */
    /* the collective it is in (sequence, count, type), by barrier generation parity: a rank can
     * be one barrier ahead of another (not two), so the slot a slower rank reads stays put */
    std::atomic<uint64_t> signature[2];
};

struct segment {
    std::atomic<uint64_t> magic;
    int nranks;
    std::atomic<int> joined;
    std::atomic<int> aborted; /* a rank called ncclCommAbort */
    rank_state ranks[MAX_RANKS];
    /* then nranks slots of SLOT_BYTES */
};

size_t segment_bytes(int nranks) { return sizeof(segment) + (size_t)nranks * SLOT_BYTES; }

}  // namespace

struct ncclComm {
    uint64_t magic;
    int rank, nranks, device;
    segment *seg;
    uint64_t generation; /* barriers passed */
    uint64_t sequence;   /* collectives issued */
    bool aborted;
};

namespace {

char g_last_error[512];

ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "luna-cuda-emu: %s\n", g_last_error);
    return r;
}

double now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *slot(ncclComm *c, int r) { return (char *)(c->seg + 1) + (size_t)r * SLOT_BYTES; }

/* Every rank arrives with the same signature; returns when all have. */
ncclResult_t barrier(ncclComm *c, uint64_t signature, const char *fn) {
    uint64_t gen = ++c->generation;
    c->seg->ranks[c->rank].signature[gen & 1].store(signature);
    c->seg->ranks[c->rank].arrived.store(gen);
    for (int r = 0; r < c->nranks; r++) {
        unsigned spins = 0;
        while (c->seg->ranks[r].arrived.load() < gen) {
            if (c->seg->aborted.load())
                return fail(ncclRemoteError, "%s: rank %d: the communicator was aborted", fn,
                            c->rank);
            if (++spins > 64) usleep(50);
            else sched_yield();
        }
        uint64_t theirs = c->seg->ranks[r].signature[gen & 1].load();
        if (theirs != signature)
            return fail(ncclInvalidUsage,
                        "%s: rank %d and rank %d are in different collectives (signature %#llx vs "
                        "%#llx): the ranks must issue the same calls with the same counts and types",
                        fn, c->rank, r, (unsigned long long)signature,
                        (unsigned long long)theirs);
    }
    return ncclSuccess;
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    case ncclBfloat16: return 2;
    case ncclInt32: return 4;
    default: return 0;
    }
}

float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t float_to_bf16(float f) { /* round to nearest even, NaN kept */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* dst[i] = slot0[i] + slot1[i] + ... (rank order), n elements of type t. */
void sum_slots(ncclComm *c, void *dst, size_t n, ncclDataType_t t) {
    for (size_t i = 0; i < n; i++) {
        if (t == ncclFloat32) {
            float s = ((const float *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) s += ((const float *)slot(c, r))[i];
            ((float *)dst)[i] = s;
        } else if (t == ncclFloat64) {
            double s = ((const double *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) s += ((const double *)slot(c, r))[i];
            ((double *)dst)[i] = s;
        } else if (t == ncclInt32) {
            int32_t s = ((const int32_t *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) s += ((const int32_t *)slot(c, r))[i];
            ((int32_t *)dst)[i] = s;
        } else { /* bf16: each partial sum rounded to bf16, as a bf16 reduction does */
            uint16_t s = ((const uint16_t *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++)
                s = float_to_bf16(bf16_to_float(s) + bf16_to_float(((const uint16_t *)slot(c, r))[i]));
            ((uint16_t *)dst)[i] = s;
        }
    }
}

bool valid_comm(const ncclComm *c) { return c && c->magic == MAGIC; }

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: NULL version");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t) { return g_last_error; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL id");
    static std::atomic<unsigned> counter{0};
    memset(id, 0, sizeof *id);
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "/luna-emu-nccl-%ld-%u-%ld", (long)getpid(),
             counter++, (long)ts.tv_nsec);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (!out) return fail(ncclInvalidArgument, "ncclCommInitRank: NULL communicator pointer");
    *out = nullptr;
    if (nranks < 1 || nranks > MAX_RANKS)
        return fail(ncclInvalidArgument, "ncclCommInitRank: nranks %d outside [1, %d]", nranks,
                    MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d outside [0, %d)", rank, nranks);
    if (strncmp(id.internal, "/luna-emu-nccl-", 15) != 0)
        return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by "
                                         "ncclGetUniqueId (was it broadcast to every rank?)");
    int device = 0;
    cudaGetDevice(&device);
    size_t bytes = segment_bytes(nranks);
    int fd = -1;
    if (rank == 0) {
        fd = shm_open(id.internal, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0)
            return fail(ncclSystemError, "ncclCommInitRank: shm_open(%s): %s", id.internal,
                        strerror(errno));
    } else {
        double t0 = now();
        struct stat st;
        while ((fd = shm_open(id.internal, O_RDWR, 0600)) < 0 || fstat(fd, &st) != 0 ||
               (size_t)st.st_size < bytes) {
            if (fd >= 0) close(fd);
            if (now() - t0 > JOIN_TIMEOUT_S)
                return fail(ncclSystemError, "ncclCommInitRank: rank %d: rank 0 did not create %s "
                                             "within %.0f s", rank, id.internal, JOIN_TIMEOUT_S);
            usleep(1000);
        }
    }
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return fail(ncclSystemError, "ncclCommInitRank: mmap: %s", strerror(errno));
    segment *seg = (segment *)p;
    if (rank == 0) {
        seg->nranks = nranks;
        seg->magic.store(MAGIC);
    } else {
        double t0 = now();
        while (seg->magic.load() != MAGIC) {
            if (now() - t0 > JOIN_TIMEOUT_S) {
                munmap(p, bytes);
                return fail(ncclSystemError, "ncclCommInitRank: %s was never initialised",
                            id.internal);
            }
            usleep(1000);
        }
        if (seg->nranks != nranks) {
            munmap(p, bytes);
            return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d says nranks %d, rank 0 %d",
                        rank, nranks, seg->nranks);
        }
    }
    ncclComm *c = new ncclComm{MAGIC, rank, nranks, device, seg, 0, 0, false};
    seg->joined.fetch_add(1);
    ncclResult_t r = barrier(c, 0, "ncclCommInitRank");
    if (r != ncclSuccess) {
        munmap(p, bytes);
        delete c;
        return r;
    }
    if (rank == 0) shm_unlink(id.internal); /* everyone has it open: the name can go */
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
    if (!valid_comm(c) || !count) return fail(ncclInvalidArgument, "ncclCommCount: bad argument");
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
    if (!valid_comm(c) || !rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank: bad argument");
    *rank = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *async) {
    if (!valid_comm(c) || !async)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: bad argument");
    *async = c->aborted || c->seg->aborted.load() ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

static int g_group_depth = 0;
ncclResult_t ncclGroupStart() {
    g_group_depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
    if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    g_group_depth--;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t stream) {
    const char *fn = "ncclAllReduce";
    if (!valid_comm(c)) return fail(ncclInvalidArgument, "%s: invalid or destroyed communicator", fn);
    if (c->aborted) return fail(ncclInvalidUsage, "%s: the communicator was aborted", fn);
    size_t elem = type_size(datatype);
    if (elem == 0)
        return fail(ncclInvalidArgument, "%s: data type %d is not emulated (float32, float64, "
                                         "bfloat16, int32 are)", fn, (int)datatype);
    if (op != ncclSum)
        return fail(ncclInvalidArgument, "%s: reduction %d is not emulated (ncclSum is)", fn, (int)op);
    if (!luna_emu::stream_valid(stream))
        return fail(ncclInvalidArgument, "%s: unknown or destroyed stream %p", fn, (void *)stream);
    bool captured = false; // a collective runs at the call here: it cannot be recorded
    if (luna_emu::capture_enqueue(fn, stream, &captured)) return ncclInvalidUsage;
    if (captured) {
        fail(ncclInvalidUsage,
             "%s during stream capture: capturing a collective is not emulated "
             "(the capture is invalidated)",
             fn);
        luna_emu::set_message(g_last_error);
        luna_emu::capture_failed(stream, cudaErrorNotSupported);
        return ncclInvalidUsage;
    }
    int device = 0;
    cudaGetDevice(&device);
    if (device != c->device)
        return fail(ncclInvalidUsage, "%s: the current device is %d, the communicator's %d", fn,
                    device, c->device);
    if (count == 0) return ncclSuccess;
    size_t bytes = count * elem;
    if (!luna_emu::device_range(sendbuff, bytes) || !luna_emu::device_range(recvbuff, bytes))
        return fail(ncclInvalidArgument, "%s: %zu elements of %zu bytes: the send (%p) or receive "
                                         "(%p) buffer is not that much device memory", fn, count,
                    elem, sendbuff, recvbuff);
    const char *s = (const char *)sendbuff, *r = (const char *)recvbuff;
    if (s != r && s < r + bytes && r < s + bytes)
        return fail(ncclInvalidArgument, "%s: send and receive buffers overlap without being "
                                         "equal (in place means sendbuff == recvbuff)", fn);
    uint64_t signature = (++c->sequence << 24) ^ ((uint64_t)count << 8) ^ (uint64_t)datatype;
    size_t per = SLOT_BYTES / elem;
    for (size_t off = 0; off < count; off += per) {
        size_t n = count - off < per ? count - off : per;
        memcpy(slot(c, c->rank), s + off * elem, n * elem);
        ncclResult_t res = barrier(c, signature, fn);
        if (res != ncclSuccess) return res;
        sum_slots(c, (char *)recvbuff + off * elem, n, datatype);
        res = barrier(c, signature, fn);
        if (res != ncclSuccess) return res;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (!valid_comm(c)) return fail(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
    c->aborted = true;
    c->seg->aborted.store(1);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (!valid_comm(c)) return fail(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
    munmap(c->seg, segment_bytes(c->nranks));
    c->magic = 0;
    delete c;
    return ncclSuccess;
}

}  // extern "C"
