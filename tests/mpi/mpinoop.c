/* MPI_Init + MPI_Finalize only; rank 0 prints its MPI_Init time in microseconds. */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    double t0 = now_us();
    MPI_Init(&argc, &argv);
    double t1 = now_us();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) printf("mpinoop MPI_Init_us %.0f\n", t1 - t0);
    MPI_Finalize();
    return 0;
}
