/* A fence one rank never joins, as a plain PMIx client: `fencefail`.
 * Every rank but the last calls PMIx_Fence (collecting) over the whole job and waits in it;
 * the last rank exits with status 3 without calling it (and without PMIx_Finalize), so the job
 * fails and the DVM kills the ranks waiting in the fence. Each waiting rank prints
 * "FENCING rank <r>" first; a fence that returns prints "FENCED rank <r> rc <status>" and the
 * rank then waits to be ended with the job. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(void)
{
    pmix_proc_t me, wild;
    if (PMIX_SUCCESS != PMIx_Init(&me, NULL, 0)) {
        return 1;
    }
    pmix_value_t *v = NULL;
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    if (PMIX_SUCCESS != PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v)) {
        return 1;
    }
    uint32_t size = v->data.uint32;
    if (me.rank == size - 1) {
        /* Let the others reach the fence first. */
        usleep(500 * 1000);
        return 3;
    }
    pmix_info_t info;
    bool yes = true;
    PMIx_Info_load(&info, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    printf("FENCING rank %u\n", me.rank);
    fflush(stdout);
    pmix_status_t rc = PMIx_Fence(&wild, 1, &info, 1);
    printf("FENCED rank %u rc %d\n", me.rank, rc);
    fflush(stdout);
    /* The job is failing: wait to be ended with it, so the last rank's exit is its status. */
    sleep(60);
    return 0;
}
