/* PMIx groups as a plain PMIx client (no MPI): `group ROUNDS`.
 * Every round constructs, then destructs, three groups, each asking the host for a context id
 * (PMIX_GROUP_ASSIGN_CONTEXT_ID):
 *   same   id "dvm-grp-same"      every rank, listed in reverse order
 *   named  id "dvm-grp-<round>"   every rank
 *   sub    id "dvm-grp-sub"       round % 3 == 0: the even ranks; 1: the odd ranks; 2: every
 *          rank but 0 (one id, a different member set each round: a member list libpmix
 *          kept from an earlier round would show here; with `--map-by node` on 4 daemons
 *          the even and the odd ranks are on two daemons each, the odd ones not the HNP)
 * Each member prints "GRP <round> <kind> rank <r> ctx <id> members <n>"; the test checks that
 * every member printed the same id and that ids never repeat. After the first construct each
 * rank checks that the group's endpoint data reached its server: every member's key
 * "dvm.grp.ep" (1000 + rank, put before) is found with PMIX_IMMEDIATE (no direct modex).
 * Any failure prints "FAIL ..." and exits 1. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pmix_proc_t me;

static void fail(const char *what, pmix_status_t rc)
{
    printf("FAIL rank %u: %s: %s\n", me.rank, what, PMIx_Error_string(rc));
    fflush(stdout);
    exit(1);
}

static size_t construct(const char *id, pmix_proc_t *members, size_t n)
{
    pmix_info_t info;
    bool yes = true;
    pmix_info_t *results = NULL;
    size_t nresults = 0, ctx = SIZE_MAX;
    PMIx_Info_load(&info, PMIX_GROUP_ASSIGN_CONTEXT_ID, &yes, PMIX_BOOL);
    pmix_status_t rc = PMIx_Group_construct(id, members, n, &info, 1, &results, &nresults);
    if (PMIX_SUCCESS != rc) {
        fail(id, rc);
    }
    for (size_t i = 0; i < nresults; i++) {
        if (0 == strcmp(results[i].key, PMIX_GROUP_CONTEXT_ID) && PMIX_SIZE == results[i].value.type) {
            ctx = results[i].value.data.size;
        }
    }
    if (NULL != results) {
        PMIX_INFO_FREE(results, nresults);
    }
    if (SIZE_MAX == ctx) {
        fail("construct returned no context id", PMIX_ERR_NOT_FOUND);
    }
    return ctx;
}

static void destruct(const char *id)
{
    pmix_status_t rc = PMIx_Group_destruct(id, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fail("destruct", rc);
    }
}

static void check_endpoints(pmix_proc_t *members, size_t n)
{
    pmix_info_t info;
    bool yes = true;
    PMIx_Info_load(&info, PMIX_IMMEDIATE, &yes, PMIX_BOOL);
    for (size_t i = 0; i < n; i++) {
        pmix_value_t *v = NULL;
        pmix_status_t rc = PMIx_Get(&members[i], "dvm.grp.ep", &info, 1, &v);
        if (PMIX_SUCCESS != rc) {
            fprintf(stderr, "rank %u: endpoint data of rank %u: %s\n", me.rank, members[i].rank,
                    PMIx_Error_string(rc));
            fail("endpoint data of a member missing", rc);
        }
        if (PMIX_UINT32 != v->type || v->data.uint32 != 1000 + members[i].rank) {
            fail("endpoint data of a member is wrong", PMIX_ERR_BAD_PARAM);
        }
        PMIX_VALUE_RELEASE(v);
    }
    printf("GRPEP rank %u saw %zu members' endpoint data\n", me.rank, n);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *v = NULL;
    rc = PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &v);
    if (PMIX_SUCCESS != rc) {
        fail("job size", rc);
    }
    uint32_t size = v->data.uint32;
    PMIX_VALUE_RELEASE(v);

    pmix_value_t ep;
    uint32_t mine = 1000 + me.rank;
    PMIx_Value_load(&ep, &mine, PMIX_UINT32);
    if (PMIX_SUCCESS != (rc = PMIx_Put(PMIX_GLOBAL, "dvm.grp.ep", &ep)) || PMIX_SUCCESS != (rc = PMIx_Commit())) {
        fail("put", rc);
    }
    PMIX_VALUE_DESTRUCT(&ep);

    pmix_proc_t *all = calloc(size, sizeof(pmix_proc_t));
    pmix_proc_t *sub = calloc(size, sizeof(pmix_proc_t));
    for (uint32_t r = 0; r < size; r++) {
        PMIX_LOAD_PROCID(&all[r], me.nspace, size - 1 - r);
    }
    char id[64];
    for (int round = 0; round < rounds; round++) {
        size_t ctx = construct("dvm-grp-same", all, size);
        printf("GRP %d same rank %u ctx %zu members %u\n", round, me.rank, ctx, size);
        if (0 == round) {
            check_endpoints(all, size);
        }
        destruct("dvm-grp-same");

        snprintf(id, sizeof id, "dvm-grp-%d", round);
        ctx = construct(id, all, size);
        printf("GRP %d named rank %u ctx %zu members %u\n", round, me.rank, ctx, size);
        destruct(id);

        size_t n = 0;
        int member = 0;
        for (uint32_t r = 0; r < size; r++) {
            int in = (0 == round % 3) ? (0 == r % 2) : (1 == round % 3) ? (1 == r % 2) : (0 != r);
            if (in) {
                PMIX_LOAD_PROCID(&sub[n], me.nspace, r);
                n++;
                member |= (r == me.rank);
            }
        }
        if (member) {
            ctx = construct("dvm-grp-sub", sub, n);
            printf("GRP %d sub rank %u ctx %zu members %zu\n", round, me.rank, ctx, n);
            destruct("dvm-grp-sub");
        }
        fflush(stdout);
    }
    free(all);
    free(sub);
    rc = PMIx_Finalize(NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fail("finalize", rc);
    }
    return 0;
}
