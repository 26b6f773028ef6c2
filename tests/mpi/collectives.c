/* Many short collectives: ROUNDS (argv[1], default 2000) rounds of MPI_Allreduce + MPI_Barrier,
 * the sum checked every round. Prints one line from rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long rounds = argc > 1 ? atol(argv[1]) : 2000;
    for (long i = 0; i < rounds; i++) {
        long mine = rank + i, sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        long want = (long)size * (size - 1) / 2 + (long)size * i;
        if (sum != want) {
            fprintf(stderr, "collectives rank %d round %ld: got %ld, want %ld\n", rank, i, sum, want);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    if (rank == 0)
        printf("collectives %ld rounds on %d ranks ok\n", rounds, size);
    MPI_Finalize();
    return 0;
}
