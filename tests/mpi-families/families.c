/* One MPI program for every MPI family, built with each family's own compiler (mpicc of
 * MPICH, Intel MPI or Open MPI) and run under prun: `families MODE`, MODE one of
 *   hello     rank, size, allreduce of the ranks checked, and MPI_Comm_split_type(SHARED)
 *   appnum    MPI_APPNUM and MPI_UNIVERSE_SIZE
 *   abort     rank 1 calls MPI_Abort(MPI_COMM_WORLD, 7); the others wait
 *   pubname   rank 0 publishes a service name, every rank looks it up, rank 0 unpublishes
 *   spawn     two children of itself, which call back through the intercommunicator
 *   sleep     a barrier, then 120 s asleep (a job to kill)
 * Every line starts with the mode in capitals; a check that fails exits 3. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int hello(void) {
    int rank, size, sum = 0, lsize = 0;
    MPI_Comm node;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &lsize);
    MPI_Comm_free(&node);
    int ok = sum == size * (size - 1) / 2;
    printf("HELLO rank %d of %d sum %d node_size %d %s\n", rank, size, sum, lsize, ok ? "ok" : "WRONG");
    return ok ? 0 : 3;
}

static int appnum(void) {
    int rank, flag, *app = NULL, *univ = NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &app, &flag);
    int a = flag ? *app : -1;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_UNIVERSE_SIZE, &univ, &flag);
    printf("APPNUM rank %d appnum %d universe %d\n", rank, a, flag ? *univ : -1);
    return 0;
}

static int abort_(void) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 1) {
        printf("ABORT rank 1 calls MPI_Abort(7)\n");
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 7);
    }
    sleep(60);
    return 0;
}

static int pubname(void) {
    int rank, rc;
    char port[MPI_MAX_PORT_NAME] = "port-of-dvm-families";
    char found[MPI_MAX_PORT_NAME] = "";
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (rank == 0 && (rc = MPI_Publish_name("dvm-families", MPI_INFO_NULL, port)) != MPI_SUCCESS) {
        printf("PUBNAME publish failed %d\n", rc);
        return 3;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    rc = MPI_Lookup_name("dvm-families", MPI_INFO_NULL, found);
    int ok = rc == MPI_SUCCESS && strcmp(found, port) == 0;
    printf("PUBNAME rank %d found '%s' %s\n", rank, found, ok ? "ok" : "WRONG");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        MPI_Unpublish_name("dvm-families", MPI_INFO_NULL, port);
    return ok ? 0 : 3;
}

static int spawn(char *self) {
    MPI_Comm parent, inter;
    int rank, size, errs[2];
    MPI_Comm_get_parent(&parent);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (parent != MPI_COMM_NULL) {
        int psize;
        MPI_Comm_remote_size(parent, &psize);
        printf("SPAWN child %d of %d parents %d\n", rank, size, psize);
        MPI_Comm_disconnect(&parent);
        return 0;
    }
    char *args[] = {"spawn", NULL};
    int rc = MPI_Comm_spawn(self, args, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, errs);
    int children = 0;
    if (rc == MPI_SUCCESS)
        MPI_Comm_remote_size(inter, &children);
    printf("SPAWN parent %d of %d children %d %s\n", rank, size, children, children == 2 ? "ok" : "WRONG");
    if (rc == MPI_SUCCESS)
        MPI_Comm_disconnect(&inter);
    return children == 2 ? 0 : 3;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "hello";
    int rc = 2;
    if (!strcmp(mode, "hello")) rc = hello();
    else if (!strcmp(mode, "appnum")) rc = appnum();
    else if (!strcmp(mode, "abort")) rc = abort_();
    else if (!strcmp(mode, "pubname")) rc = pubname();
    else if (!strcmp(mode, "spawn")) rc = spawn(argv[0]);
    else if (!strcmp(mode, "sleep")) { MPI_Barrier(MPI_COMM_WORLD); sleep(120); rc = 0; }
    else fprintf(stderr, "families: unknown mode %s\n", mode);
    fflush(stdout);
    MPI_Finalize();
    return rc;
}
