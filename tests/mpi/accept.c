/* Server side of a connect/accept between two separately launched jobs: opens a port,
 * publishes it as service argv[1], accepts, checks the intercommunicator with an allreduce
 * (the server side contributes 1000+rank, the client side rank+1), unpublishes, disconnects.
 * `accept SERVICE wait`: after the check every rank waits for a message nobody sends (only
 * being told that the connected job failed can end it). */
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
    if (rank == 0) {
        MPI_Open_port(MPI_INFO_NULL, port);
        MPI_Publish_name(service, MPI_INFO_NULL, port);
        printf("published %s\n", service);
        fflush(stdout);
    }
    MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
    MPI_Comm_remote_size(inter, &remote);
    mine = 1000 + rank;
    MPI_Allreduce(&mine, &got, 1, MPI_INT, MPI_SUM, inter);
    for (int r = 0; r < remote; r++) want += r + 1;
    printf("accept rank %d of %d: remote %d sum %d %s\n", rank, size, remote, got, got == want ? "ok" : "FAIL");
    fflush(stdout);
    if (argc > 2 && !strcmp(argv[2], "wait")) {
        int never;
        MPI_Recv(&never, 1, MPI_INT, MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (rank == 0) {
        MPI_Unpublish_name(service, MPI_INFO_NULL, port);
        MPI_Close_port(port);
    }
    MPI_Comm_disconnect(&inter);
    MPI_Finalize();
    return got == want ? 0 : 1;
}
