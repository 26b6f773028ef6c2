/* A small MPI benchmark: 8-byte ping-pong between ranks 0 and 1 (half round trip) and an
 * 8-double MPI_Allreduce over all ranks, ITERS timed iterations each after a warm-up (ITERS
 * from argv[1], default 20000). Rank 0 prints "pingpong_us X allreduce_us Y". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int rank, size;
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    double buf[8] = {0}, out[8];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2 || iters < 1) {
        if (rank == 0) fprintf(stderr, "pingpong: needs 2 or more ranks and ITERS >= 1\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double pp = 0, ar = 0;
    for (int phase = 0; phase < 2; phase++) {
        int n = phase == 0 ? iters / 10 + 1 : iters;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < n && rank < 2; i++) {
            if (rank == 0) {
                MPI_Send(buf, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD);
                MPI_Recv(buf, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD);
            }
        }
        double t1 = MPI_Wtime();
        MPI_Barrier(MPI_COMM_WORLD);
        double t2 = MPI_Wtime();
        for (int i = 0; i < n; i++) {
            buf[0] = rank + i;
            MPI_Allreduce(buf, out, 8, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        }
        double t3 = MPI_Wtime();
        pp = (t1 - t0) / n / 2 * 1e6;
        ar = (t3 - t2) / n * 1e6;
    }
    double want = (double)size * (size - 1) / 2 + (double)size * (iters - 1);
    if (out[0] != want) {
        fprintf(stderr, "pingpong rank %d: allreduce gave %g, want %g\n", rank, out[0], want);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) printf("pingpong_us %.3f allreduce_us %.3f\n", pp, ar);
    MPI_Finalize();
    return 0;
}
