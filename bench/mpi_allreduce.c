/* MPI_Allreduce f32 sum at 1, 16, 64 MiB (or the sizes given in MiB as arguments), out of place,
 * 3 warm-up + ITERS timed iterations, printed like concord-shm-bench / nccl-tests:
 * size(B) count type redop time(us) algbw busbw (GB/s, busbw = algbw * 2(n-1)/n). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const int iters = getenv("ITERS") ? atoi(getenv("ITERS")) : 20;
    long sizes_mib[16] = {1, 16, 64};
    int nsizes = 3;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 16; i++) sizes_mib[nsizes++] = atol(argv[i]);
    }
    if (rank == 0) {
        printf("# mpi_allreduce: MPI_Allreduce, %d ranks, %d iterations, out of place\n", n, iters);
        printf("# %10s %12s %8s %6s %10s %8s %8s\n", "size(B)", "count", "type", "redop", "time(us)", "algbw", "busbw");
    }
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = (size_t)sizes_mib[s] << 20, count = bytes / sizeof(float);
        float *in = malloc(bytes), *out = malloc(bytes);
        for (size_t i = 0; i < count; i++) in[i] = 1.0f;
        for (int w = 0; w < 3; w++) MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double us = (MPI_Wtime() - t0) * 1e6 / iters;
        if (out[count - 1] != (float)n) { fprintf(stderr, "wrong result %f\n", out[count - 1]); MPI_Abort(MPI_COMM_WORLD, 1); }
        if (rank == 0) {
            double algbw = bytes / us / 1e3;
            printf("%12zu %12zu %8s %6s %10.1f %8.2f %8.2f\n", bytes, count, "float", "sum", us, algbw, algbw * 2.0 * (n - 1) / n);
        }
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}
