/* MPMD: prints each rank's MPI_APPNUM and MPI_UNIVERSE_SIZE (attributes of MPI_COMM_WORLD),
 * and the size of its application's part of MPI_COMM_WORLD (split by MPI_APPNUM, as coupled
 * codes do). `prun -n 2 ./appnum : -n 2 ./appnum` prints appnum 0, 0, 1, 1. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, flag, *appnum = NULL, *usize = NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    int app = flag ? *appnum : -1;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_UNIVERSE_SIZE, &usize, &flag);
    int universe = flag ? *usize : -1;
    MPI_Comm part;
    MPI_Comm_split(MPI_COMM_WORLD, app < 0 ? 0 : app, rank, &part);
    int app_rank, app_size;
    MPI_Comm_rank(part, &app_rank);
    MPI_Comm_size(part, &app_size);
    printf("rank %d of %d appnum %d universe %d app_rank %d app_size %d argc %d\n", rank, size, app, universe,
           app_rank, app_size, argc);
    MPI_Comm_free(&part);
    MPI_Finalize();
    return 0;
}
