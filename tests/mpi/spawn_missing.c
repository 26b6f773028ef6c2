/* MPI_Comm_spawn of an executable that does not exist, from MPI_COMM_SELF: the call must
 * return an error (MPI_ERRORS_RETURN), not hang and not start anything. Exits 0 when it did. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    MPI_Comm inter;
    int codes[2], len;
    char msg[MPI_MAX_ERROR_STRING];
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_spawn("/nonexistent/dvm-no-such-program", MPI_ARGV_NULL, 2, MPI_INFO_NULL, 0,
                            MPI_COMM_SELF, &inter, codes);
    if (rc == MPI_SUCCESS) {
        printf("spawn of a missing executable succeeded\n");
        MPI_Finalize();
        return 1;
    }
    MPI_Error_string(rc, msg, &len);
    printf("spawn failed as expected: %s\n", msg);
    MPI_Finalize();
    return 0;
}
