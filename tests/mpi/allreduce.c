/* Sum of ranks by MPI_Allreduce, checked against n(n-1)/2 on every rank. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size;
    long mine, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mine = rank;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long want = (long)size * (size - 1) / 2;
    if (sum != want) {
        fprintf(stderr, "allreduce rank %d: got %ld, want %ld\n", rank, sum, want);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("allreduce rank %d ok %ld\n", rank, sum);
    MPI_Finalize();
    return 0;
}
