/* Prints what a launcher's PMIx server tells one rank: its own proc-level keys, its job's,
 * each app's (PMIX_APP_INFO), and its node's (PMIX_NODE_INFO), one "rank R SCOPE KEY = VALUE"
 * line each ("NOT FOUND (status)" when PMIx_Get fails). Run it under PRRTE's mpirun and under
 * prun with the same job and compare (docs/mpi-keys.md). Plain libpmix, no MPI. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pmix_proc_t me;

static void show(const char *scope, const char *key, const pmix_value_t *v, pmix_status_t rc) {
    printf("rank %u %s %s = ", me.rank, scope, key);
    if (PMIX_SUCCESS != rc) {
        printf("NOT FOUND (%s)\n", PMIx_Error_string(rc));
        return;
    }
    switch (v->type) {
    case PMIX_STRING: printf("\"%s\"", v->data.string ? v->data.string : "(null)"); break;
    case PMIX_UINT32: printf("%u (u32)", v->data.uint32); break;
    case PMIX_UINT16: printf("%u (u16)", v->data.uint16); break;
    case PMIX_INT: printf("%d (int)", v->data.integer); break;
    case PMIX_UINT64: printf("%lu (u64)", (unsigned long)v->data.uint64); break;
    case PMIX_SIZE: printf("%zu (size)", v->data.size); break;
    case PMIX_BOOL: printf("%s (bool)", v->data.flag ? "true" : "false"); break;
    case PMIX_PROC_RANK: printf("%u (rank)", v->data.rank); break;
    case PMIX_PROC:
        printf("%s.%u (proc)", v->data.proc->nspace, v->data.proc->rank);
        break;
    case PMIX_DATA_ARRAY:
        printf("array of %zu (type %s)", v->data.darray->size, PMIx_Data_type_string(v->data.darray->type));
        break;
    default: printf("(type %s)", PMIx_Data_type_string(v->type)); break;
    }
    printf("\n");
}

static void get(const pmix_proc_t *p, const char *scope, const char *key, pmix_info_t *info, size_t ninfo) {
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(p, key, info, ninfo, &v);
    show(scope, key, v, rc);
    if (v) PMIX_VALUE_RELEASE(v);
}

int main(void) {
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    pmix_proc_t job;
    PMIX_PROC_CONSTRUCT(&job);
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);

    const char *proc_keys[] = {PMIX_APPNUM, PMIX_APP_RANK, PMIX_LOCAL_RANK, PMIX_NODE_RANK, PMIX_NODEID,
                               PMIX_HOSTNAME, PMIX_GLOBAL_RANK, PMIX_RANK, PMIX_LOCALITY_STRING,
                               PMIX_PROCDIR, PMIX_REINCARNATION, NULL};
    for (int i = 0; proc_keys[i]; i++) get(&me, "proc", proc_keys[i], NULL, 0);

    const char *job_keys[] = {PMIX_JOBID, PMIX_JOB_SIZE, PMIX_MAX_PROCS, PMIX_UNIV_SIZE, PMIX_NSDIR, PMIX_TMPDIR,
                              PMIX_MAPBY, PMIX_RANKBY, PMIX_BINDTO, PMIX_JOB_NUM_APPS, PMIX_NUM_NODES,
                              PMIX_NODE_LIST, PMIX_APPNUM, PMIX_APP_SIZE, PMIX_APPLDR,
                              PMIX_LOCAL_PEERS, PMIX_LOCAL_SIZE, PMIX_NODE_SIZE, PMIX_LOCALLDR,
                              PMIX_LOCAL_CPUSETS, PMIX_HOSTNAME, PMIX_NODEID, NULL};
    for (int i = 0; job_keys[i]; i++) get(&job, "job", job_keys[i], NULL, 0);

    /* Each app's: as Open MPI 5 asks (wildcard rank, PMIX_APP_INFO + PMIX_APPNUM). */
    pmix_value_t *nv = NULL;
    uint32_t napps = 1;
    if (PMIX_SUCCESS == PMIx_Get(&job, PMIX_JOB_NUM_APPS, NULL, 0, &nv) && nv) {
        PMIX_VALUE_GET_NUMBER(rc, nv, napps, uint32_t);
        PMIX_VALUE_RELEASE(nv);
    }
    const char *app_keys[] = {PMIX_APP_SIZE, PMIX_APPLDR, PMIX_APP_ARGV, PMIX_WDIR, PMIX_APPNUM, NULL};
    for (uint32_t a = 0; a < napps + 1 && a < 8; a++) {
        pmix_info_t info[2];
        bool t = true;
        PMIX_INFO_LOAD(&info[0], PMIX_APP_INFO, &t, PMIX_BOOL);
        PMIX_INFO_LOAD(&info[1], PMIX_APPNUM, &a, PMIX_UINT32);
        char scope[32];
        snprintf(scope, sizeof scope, "app%u", a);
        for (int i = 0; app_keys[i]; i++) get(&job, scope, app_keys[i], info, 2);
    }
    /* Its own node's, by hostname: as PRRTE registers PMIX_NODE_INFO_ARRAY. */
    pmix_value_t *hv = NULL;
    if (PMIX_SUCCESS == PMIx_Get(&me, PMIX_HOSTNAME, NULL, 0, &hv) && hv && hv->type == PMIX_STRING) {
        pmix_info_t info[2];
        bool t = true;
        PMIX_INFO_LOAD(&info[0], PMIX_NODE_INFO, &t, PMIX_BOOL);
        PMIX_INFO_LOAD(&info[1], PMIX_HOSTNAME, hv->data.string, PMIX_STRING);
        const char *node_keys[] = {PMIX_LOCAL_PEERS, PMIX_LOCAL_SIZE, PMIX_NODE_SIZE, PMIX_LOCALLDR,
                                   PMIX_NODEID, PMIX_HOSTNAME, PMIX_MAX_PROCS, NULL};
        for (int i = 0; node_keys[i]; i++) get(&job, "node", node_keys[i], info, 2);
        PMIX_VALUE_RELEASE(hv);
    }
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
