/* Rank 1 (or 0 if alone) dies by SIGSEGV after MPI_Init; the others wait in a barrier. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == (size > 1 ? 1 : 0)) {
        fprintf(stderr, "rank %d crashing\n", rank);
        fflush(stderr);
        raise(SIGSEGV);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
