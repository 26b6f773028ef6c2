/* MPI_Init, then barriers every 10 ms until argv[1] seconds passed (default 60), then
 * MPI_Finalize: a job that is inside MPI when the DVM is terminated or loses a daemon. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    double limit = argc > 1 ? atof(argv[1]) : 60.0;
    double t0 = MPI_Wtime();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        printf("linger started\n");
        fflush(stdout);
    }
    struct timespec pause = {0, 10 * 1000 * 1000};
    while (MPI_Wtime() - t0 < limit) {
        MPI_Barrier(MPI_COMM_WORLD);
        nanosleep(&pause, NULL);
    }
    MPI_Finalize();
    return 0;
}
