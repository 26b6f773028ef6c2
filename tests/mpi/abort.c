/* Rank 1 (or rank 0 if alone) calls MPI_Abort with the code given as argv[1] (default 42). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rank, size, code = argc > 1 ? atoi(argv[1]) : 42;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == (size > 1 ? 1 : 0)) {
        fprintf(stderr, "rank %d aborting with %d\n", rank, code);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    sleep(60);
    MPI_Finalize();
    return 0;
}
