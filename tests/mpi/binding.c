/* Where a rank runs, as it sees it: its node-local peers (MPI_COMM_TYPE_SHARED), the peers
 * Open MPI finds on its core and on its package (from the locality the launcher published),
 * and its CPU binding as hwloc reads it from the kernel. One line per rank. */
#include <hwloc.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int split_size(int type, int rank) {
    MPI_Comm c;
    int n = -1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, type, rank, MPI_INFO_NULL, &c) == MPI_SUCCESS) {
        if (c == MPI_COMM_NULL) return 0;
        MPI_Comm_size(c, &n);
        MPI_Comm_free(&c);
    }
    return n;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int shared = split_size(MPI_COMM_TYPE_SHARED, rank);
    int core = split_size(OMPI_COMM_TYPE_CORE, rank);
    int package = split_size(OMPI_COMM_TYPE_SOCKET, rank);
    hwloc_topology_t topo;
    hwloc_topology_init(&topo);
    hwloc_topology_load(topo);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    char *cpus = NULL;
    if (hwloc_get_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
        hwloc_bitmap_list_asprintf(&cpus, set);
    }
    printf("rank %d shared %d core %d package %d cpus %s\n", rank, shared, core, package, cpus ? cpus : "?");
    fflush(stdout);
    free(cpus);
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(topo);
    MPI_Finalize();
    return 0;
}
