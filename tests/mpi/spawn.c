/* MPI_Comm_spawn of itself: `spawn N DEPTH [MAP_BY [LEVEL [fail]]]` spawns N children (each
 * again with DEPTH-1, so DEPTH 2 is a nested spawn), checks the intercommunicator both ways
 * with an allreduce across it (each side receives the other side's sum), then disconnects.
 * `fail` (passed on to the children): child rank 0 exits with status 7 after the check, without
 * MPI_Finalize; the parents then skip the disconnect (nothing of theirs waits on it) and end
 * normally, so the child's is the only failure. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int check(MPI_Comm inter, int am_parent, int level, int rank, int size) {
    int remote, mine, got, want = 0;
    MPI_Comm_remote_size(inter, &remote);
    /* parents contribute 1000+rank, children rank+1: each side can predict the other's sum */
    mine = am_parent ? 1000 + rank : rank + 1;
    MPI_Allreduce(&mine, &got, 1, MPI_INT, MPI_SUM, inter);
    for (int r = 0; r < remote; r++) want += am_parent ? r + 1 : 1000 + r;
    if (got != want) {
        printf("level %d rank %d: intercomm sum %d want %d FAIL\n", level, rank, got, want);
        return 1;
    }
    const char *node = getenv("DVM_NODE");
    printf("level %d rank %d of %d: intercomm ok remote %d sum %d as %s node %s\n", level, rank, size, remote, got,
           am_parent ? "parent" : "child", node ? node : "?");
    return 0;
}

int main(int argc, char **argv) {
    int rank, size, bad = 0;
    MPI_Comm parent, inter;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int n = argc > 1 ? atoi(argv[1]) : 2;
    int depth = argc > 2 ? atoi(argv[2]) : 1;
    int level = argc > 4 ? atoi(argv[4]) : 0;
    const char *map_by = argc > 3 ? argv[3] : "";
    int fail = argc > 5 && !strcmp(argv[5], "fail");
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        bad |= check(parent, 0, level, rank, size);
        if (fail && rank == 0) {
            fflush(stdout);
            _exit(7);
        }
    }
    if (depth > 0) {
        char ns[16], ds[16], ls[16];
        snprintf(ns, sizeof ns, "%d", n);
        snprintf(ds, sizeof ds, "%d", depth - 1);
        snprintf(ls, sizeof ls, "%d", level + 1);
        const char *pass_fail = argc > 5 ? argv[5] : "";
        char *args[] = {ns, ds, (char *)(map_by[0] ? map_by : "slot"), ls, (char *)pass_fail, NULL};
        MPI_Info info = MPI_INFO_NULL;
        if (map_by[0]) {
            MPI_Info_create(&info);
            MPI_Info_set(info, "map_by", map_by);
        }
        int *codes = malloc(sizeof(int) * n);
        MPI_Comm_spawn(argv[0], args, n, info, 0, MPI_COMM_WORLD, &inter, codes);
        free(codes);
        if (info != MPI_INFO_NULL) MPI_Info_free(&info);
        bad |= check(inter, 1, level, rank, size);
        if (!fail) MPI_Comm_disconnect(&inter);
    }
    if (parent != MPI_COMM_NULL) MPI_Comm_disconnect(&parent);
    if (rank == 0 && !bad) printf("spawn level %d done\n", level);
    MPI_Finalize();
    return bad;
}
