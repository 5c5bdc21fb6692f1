/* OpenMPI's collectives timed like nccl-tests, the reference that `concord-bench --mpi` prints
 * next to a Concord backend (it compiles this file with mpicc and runs it under mpirun).
 *
 * usage: mpi_collectives OP TYPE REDOP ROOT ITERS WARMUP BUDGET SIZE...
 *   OP: all_reduce all_gather reduce_scatter all_to_all broadcast reduce sendrecv
 *       (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Bcast,
 *        MPI_Reduce, MPI_Sendrecv to rank+1 from rank-1)
 *   TYPE: float double int32 int64;  REDOP: sum prod min max;  SIZE: bytes, as concord-bench
 *   (count = SIZE / sizeof(TYPE), per-rank chunk count / ranks for the chunked ops); BUDGET: bytes
 *   of buffers the calls cycle through (concord-bench's --check-budget window rule).
 * Prints nccl-tests' columns (size count type redop root time algbw busbw #wrong), out of place
 * only (the in-place columns print N/A). Time: mean over ranks of the mean over ITERS
 * back-to-back blocking calls after WARMUP calls and a barrier. #wrong: wrong elements of the
 * last timed call's output, checked after the clock stops. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n, rank;
static MPI_Datatype mtype;
static size_t esize;
static int tcode; /* 0 float 1 double 2 int32 3 int64 */

static double val(int r, size_t i) { return (double)((r * 7 + i) % 13); }

static void put(void *b, size_t i, double v) {
    switch (tcode) {
    case 0: ((float *)b)[i] = (float)v; break;
    case 1: ((double *)b)[i] = v; break;
    case 2: ((int32_t *)b)[i] = (int32_t)v; break;
    default: ((int64_t *)b)[i] = (int64_t)v; break;
    }
}

static double get(const void *b, size_t i) {
    switch (tcode) {
    case 0: return ((const float *)b)[i];
    case 1: return ((const double *)b)[i];
    case 2: return ((const int32_t *)b)[i];
    default: return (double)((const int64_t *)b)[i];
    }
}

static double red(const char *op, double a, double b) {
    if (!strcmp(op, "prod")) return a * b;
    if (!strcmp(op, "min")) return a < b ? a : b;
    if (!strcmp(op, "max")) return a > b ? a : b;
    return a + b;
}

/* Reduction over ranks of val(r, i). */
static double reduced(const char *op, size_t i) {
    double acc = val(0, i);
    for (int r = 1; r < n; r++) acc = red(op, acc, val(r, i));
    return acc;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 9) {
        if (rank == 0) fprintf(stderr, "usage: %s OP TYPE REDOP ROOT ITERS WARMUP BUDGET SIZE...\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *op = argv[1], *type = argv[2], *redop = argv[3];
    int root = atoi(argv[4]), iters = atoi(argv[5]), warmup = atoi(argv[6]);
    /* Bytes of buffers one timed window may use, as concord-bench's --check-budget: the calls
     * cycle through min(iters, BUDGET / bytes per call) buffer pairs, so both sides of the table
     * see the same cache state (one pair reused would stay in cache at small sizes). */
    size_t budget = (size_t)atoll(argv[7]);
    if (!strcmp(type, "float")) { mtype = MPI_FLOAT; esize = 4; tcode = 0; }
    else if (!strcmp(type, "double")) { mtype = MPI_DOUBLE; esize = 8; tcode = 1; }
    else if (!strcmp(type, "int32")) { mtype = MPI_INT32_T; esize = 4; tcode = 2; }
    else if (!strcmp(type, "int64")) { mtype = MPI_INT64_T; esize = 8; tcode = 3; }
    else { if (rank == 0) fprintf(stderr, "unsupported type %s\n", type); MPI_Abort(MPI_COMM_WORLD, 2); }
    MPI_Op mop = MPI_SUM;
    if (!strcmp(redop, "prod")) mop = MPI_PROD;
    else if (!strcmp(redop, "min")) mop = MPI_MIN;
    else if (!strcmp(redop, "max")) mop = MPI_MAX;
    else if (strcmp(redop, "sum")) { if (rank == 0) fprintf(stderr, "unsupported redop %s\n", redop); MPI_Abort(MPI_COMM_WORLD, 2); }
    int chunked = !strcmp(op, "all_gather") || !strcmp(op, "reduce_scatter") || !strcmp(op, "all_to_all");
    int reduction = !strcmp(op, "all_reduce") || !strcmp(op, "reduce_scatter") || !strcmp(op, "reduce");
    int rooted = !strcmp(op, "broadcast") || !strcmp(op, "reduce");
    double factor = 1.0;
    if (!strcmp(op, "all_reduce")) factor = 2.0 * (n - 1) / n;
    else if (chunked) factor = (double)(n - 1) / n;
    for (int s = 8; s < argc; s++) {
        size_t bytes = (size_t)atoll(argv[s]);
        size_t count = bytes / esize / (chunked ? n : 1); /* per-rank chunk for the chunked ops */
        if (count == 0) continue;
        size_t in_n = count, out_n = count;
        if (!strcmp(op, "all_gather")) out_n = count * n;
        if (!strcmp(op, "reduce_scatter")) in_n = count * n;
        if (!strcmp(op, "all_to_all")) in_n = out_n = count * n;
        size_t size = (chunked ? count * n : count) * esize;
        size_t per_call = (in_n + out_n) * esize, nbuf = per_call ? budget / per_call : 1;
        if (nbuf > (size_t)iters) nbuf = (size_t)iters;
        if (nbuf < 1) nbuf = 1;
        void **ins = malloc(nbuf * sizeof(void *)), **outs = malloc(nbuf * sizeof(void *));
        for (size_t b = 0; b < nbuf; b++) {
            ins[b] = malloc(in_n * esize);
            outs[b] = malloc(out_n * esize);
            for (size_t i = 0; i < in_n; i++) put(ins[b], i, val(rank, i));
            for (size_t i = 0; i < out_n; i++) put(outs[b], i, -1);
        }
        void *in = ins[0], *out = outs[0];
        int prev = (rank + n - 1) % n, next = (rank + 1) % n;
#define CALL()                                                                                                   \
    do {                                                                                                         \
        if (!strcmp(op, "all_reduce")) MPI_Allreduce(in, out, (int)count, mtype, mop, MPI_COMM_WORLD);          \
        else if (!strcmp(op, "all_gather")) MPI_Allgather(in, (int)count, mtype, out, (int)count, mtype, MPI_COMM_WORLD); \
        else if (!strcmp(op, "reduce_scatter")) MPI_Reduce_scatter_block(in, out, (int)count, mtype, mop, MPI_COMM_WORLD); \
        else if (!strcmp(op, "all_to_all")) MPI_Alltoall(in, (int)count, mtype, out, (int)count, mtype, MPI_COMM_WORLD); \
        else if (!strcmp(op, "broadcast")) MPI_Bcast(in, (int)count, mtype, root, MPI_COMM_WORLD);              \
        else if (!strcmp(op, "reduce")) MPI_Reduce(in, out, (int)count, mtype, mop, root, MPI_COMM_WORLD);      \
        else if (!strcmp(op, "sendrecv"))                                                                        \
            MPI_Sendrecv(in, (int)count, mtype, next, 0, out, (int)count, mtype, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE); \
        else { if (rank == 0) fprintf(stderr, "unknown op %s\n", op); MPI_Abort(MPI_COMM_WORLD, 2); }             \
    } while (0)
        /* Warm-up touches every buffer pair at least once, as concord-bench's does. */
        int warm = warmup > (int)nbuf ? warmup : (int)nbuf;
        for (int w = 0; w < warm; w++) {
            in = ins[w % nbuf];
            out = outs[w % nbuf];
            CALL();
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            in = ins[i % nbuf];
            out = outs[i % nbuf];
            CALL();
        }
        double mine = (MPI_Wtime() - t0) / (iters > 0 ? iters : 1), sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double us = sum / n * 1e6;
        /* Check the last output (not timed). */
        long wrong = 0;
        if (!strcmp(op, "broadcast")) {
            for (size_t i = 0; i < count; i++) wrong += get(in, i) != val(root, i);
        } else if (!strcmp(op, "all_reduce") || (!strcmp(op, "reduce") && rank == root)) {
            for (size_t i = 0; i < count; i++) wrong += get(out, i) != reduced(redop, i);
        } else if (!strcmp(op, "reduce_scatter")) {
            for (size_t i = 0; i < count; i++) wrong += get(out, i) != reduced(redop, rank * count + i);
        } else if (!strcmp(op, "all_gather")) {
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++) wrong += get(out, r * count + i) != val(r, i);
        } else if (!strcmp(op, "all_to_all")) {
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++) wrong += get(out, r * count + i) != val(r, rank * count + i);
        } else if (!strcmp(op, "sendrecv")) {
            for (size_t i = 0; i < count; i++) wrong += get(out, i) != val(prev, i);
        }
        long wrong_all = 0;
        MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0) {
            double algbw = (double)size / us / 1e3;
            printf("%12zu  %12zu  %8s  %6s  %6i  %7.2f  %6.2f  %6.2f  %5ld      N/A     N/A     N/A    N/A\n", size, count, type,
                   reduction ? redop : "none", rooted ? root : -1, us, algbw, algbw * factor, wrong_all);
            fflush(stdout);
        }
        for (size_t b = 0; b < nbuf; b++) {
            free(ins[b]);
            free(outs[b]);
        }
        free(ins);
        free(outs);
    }
    MPI_Finalize();
    return 0;
}
