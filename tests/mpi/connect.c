/* Client side of accept.c: looks service argv[1] up, connects, checks, disconnects.
 * `connect SERVICE abort`: rank 0 calls MPI_Abort(3) after the check instead. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    int rank, size, remote, mine, got, want = 0;
    char port[MPI_MAX_PORT_NAME];
    MPI_Comm inter;
    const char *service = argc > 1 ? argv[1] : "dvm-test-service";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) MPI_Lookup_name(service, MPI_INFO_NULL, port);
    MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
    MPI_Comm_remote_size(inter, &remote);
    mine = rank + 1;
    MPI_Allreduce(&mine, &got, 1, MPI_INT, MPI_SUM, inter);
    for (int r = 0; r < remote; r++) want += 1000 + r;
    printf("connect rank %d of %d: remote %d sum %d %s\n", rank, size, remote, got, got == want ? "ok" : "FAIL");
    fflush(stdout);
    if (argc > 2 && !strcmp(argv[2], "abort") && rank == 0) MPI_Abort(MPI_COMM_WORLD, 3);
    MPI_Comm_disconnect(&inter);
    MPI_Finalize();
    return got == want ? 0 : 1;
}
