// Host cost per op of the ways to mark a small NCCL op's completion on its stream (issues 12 /
// 16: the progress thread records one CUDA event after every launch). One rank, one GPU, a
// blocking communicator, 8-byte float all_reduce out of place, N launches back to back:
//   A  ncclAllReduce alone (raw NCCL's loop)
//   B  A + cuEventRecord of a pooled event after each (what the backend does)
//   C  A + cuStreamWriteValue64 of the op's sequence number into pinned host memory after each
//      (completion = one load of that word: no driver call to poll)
//   D  cuEventRecord alone, E  cuStreamWriteValue64 alone
// Build: nvcc -O2 completion-cost-experiment.c -I$NCCL/include -L$NCCL/lib -l:libnccl.so.2 -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x) do { int e = (int)(x); if (e) { fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, e); exit(1); } } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    CK(cudaSetDevice(0));
    ncclComm_t comm;
    ncclUniqueId id;
    CK(ncclGetUniqueId(&id));
    CK(ncclCommInitRank(&comm, 1, id, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *in, *out;
    CK(cudaMalloc(&in, 64));
    CK(cudaMalloc(&out, 64));
    enum { POOL = 256 };
    CUevent ev[POOL];
    for (int i = 0; i < POOL; i++) CK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
    volatile unsigned long long *word;
    CK(cuMemHostAlloc((void **)&word, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dword;
    CK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    *word = 0;
    const char *name[] = {"A nccl alone", "B nccl + event", "C nccl + writevalue", "D event alone", "E writevalue alone"};
    for (int rep = 0; rep < 3; rep++) {
        for (int mode = 0; mode < 5; mode++) {
            for (int warm = 0; warm < 2; warm++) {
                CK(cudaStreamSynchronize(s));
                double t0 = now_us();
                for (int i = 0; i < n; i++) {
                    if (mode <= 2) CK(ncclAllReduce(in, out, 2, ncclFloat, ncclSum, comm, s));
                    if (mode == 1 || mode == 3) CK(cuEventRecord(ev[i % POOL], (CUstream)s));
                    if (mode == 2 || mode == 4) CK(cuStreamWriteValue64((CUstream)s, dword, (cuuint64_t)(i + 1), 0));
                }
                double issued = now_us() - t0;
                CK(cudaStreamSynchronize(s));
                double done = now_us() - t0;
                if (warm) printf("rep %d  %-22s host issue %6.2f us/op   until the stream drained %6.2f us/op\n", rep, name[mode], issued / n, done / n);
            }
        }
    }
    printf("last sequence word read by the host: %llu (expect %d)\n", *word, n);
    // Poll cost: an event query against a load of the word.
    double t0 = now_us();
    for (int i = 0; i < n; i++) (void)cuEventQuery(ev[i % POOL]);
    double q = (now_us() - t0) / n;
    t0 = now_us();
    unsigned long long acc = 0;
    for (int i = 0; i < n; i++) acc += *word;
    double l = (now_us() - t0) / n;
    printf("poll: cuEventQuery %.3f us, load of the word %.4f us (%llu)\n", q, l, acc);
    ncclCommDestroy(comm);
    return 0;
}
