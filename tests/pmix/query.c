/* PMIx_Query_info as a plain PMIx client: `query ROUNDS`. Rank 0 asks, each round:
 *   PMIX_QUERY_NUM_PSETS                       -> "QRY psets <n>"
 *   PMIX_QUERY_NAMESPACES                      -> "QRY namespaces <a,b,...>"
 *   PMIX_JOB_SIZE {PMIX_NSPACE: each listed}   -> "QRY size <nspace> <n>"
 *   PMIX_JOB_SIZE of its own job, with PMIX_QUERY_REFRESH_CACHE (always reaches the host)
 *                                              -> "QRY ownsize <n>"
 *   PMIX_JOB_SIZE of a namespace no job has    -> "QRY bogus <status name>"
 *   PMIX_TIME_REMAINING (not hosted)           -> "QRY unsupported <status name>"
 * and prints "QRY me <nspace> <job size>" first. The test compares with the jobs it started.
 * Other ranks only init and finalize. Any unexpected failure prints "FAIL ..." and exits 1. */
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

/* One query of one key; qualifier nspace (NULL: none), optionally refreshing the cache. */
static pmix_status_t ask(const char *key, const char *nspace, bool refresh, pmix_value_t *out)
{
    pmix_query_t q;
    PMIX_QUERY_CONSTRUCT(&q);
    char *keys[2] = {(char *) key, NULL};
    q.keys = keys;
    pmix_info_t quals[2];
    size_t nq = 0;
    if (NULL != nspace) {
        PMIx_Info_load(&quals[nq++], PMIX_NSPACE, nspace, PMIX_STRING);
    }
    if (refresh) {
        PMIx_Info_load(&quals[nq++], PMIX_QUERY_REFRESH_CACHE, &refresh, PMIX_BOOL);
    }
    q.qualifiers = nq ? quals : NULL;
    q.nqual = nq;
    pmix_info_t *results = NULL;
    size_t nresults = 0;
    pmix_status_t rc = PMIx_Query_info(&q, 1, &results, &nresults);
    for (size_t i = 0; i < nq; i++) {
        PMIX_INFO_DESTRUCT(&quals[i]);
    }
    if (PMIX_SUCCESS == rc) {
        rc = PMIX_ERR_NOT_FOUND;
        for (size_t i = 0; i < nresults; i++) {
            if (0 == strcmp(results[i].key, key)) {
                PMIx_Value_xfer(out, &results[i].value);
                rc = PMIX_SUCCESS;
            }
        }
    }
    if (NULL != results) {
        PMIX_INFO_FREE(results, nresults);
    }
    return rc;
}

static uint64_t number(const pmix_value_t *v)
{
    switch (v->type) {
    case PMIX_UINT32: return v->data.uint32;
    case PMIX_SIZE: return v->data.size;
    case PMIX_UINT64: return v->data.uint64;
    default: fail("a number of an unexpected type", PMIX_ERR_TYPE_MISMATCH);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    if (0 == me.rank) {
        pmix_proc_t job;
        PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
        pmix_value_t *sz = NULL;
        if (PMIX_SUCCESS != (rc = PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &sz))) {
            fail("job size", rc);
        }
        printf("QRY me %s %u\n", me.nspace, sz->data.uint32);
        PMIX_VALUE_RELEASE(sz);
        for (int round = 0; round < rounds; round++) {
            pmix_value_t v;
            if (PMIX_SUCCESS != (rc = ask(PMIX_QUERY_NUM_PSETS, NULL, false, &v))) {
                fail("PMIX_QUERY_NUM_PSETS", rc);
            }
            printf("QRY psets %lu\n", (unsigned long) number(&v));
            PMIX_VALUE_DESTRUCT(&v);

            if (PMIX_SUCCESS != (rc = ask(PMIX_QUERY_NAMESPACES, NULL, false, &v))) {
                fail("PMIX_QUERY_NAMESPACES", rc);
            }
            if (PMIX_STRING != v.type) {
                fail("PMIX_QUERY_NAMESPACES is no string", PMIX_ERR_TYPE_MISMATCH);
            }
            char *list = strdup(v.data.string);
            PMIX_VALUE_DESTRUCT(&v);
            printf("QRY namespaces %s\n", list);
            for (char *save = NULL, *ns = strtok_r(list, ",", &save); ns; ns = strtok_r(NULL, ",", &save)) {
                if (PMIX_SUCCESS != (rc = ask(PMIX_JOB_SIZE, ns, false, &v))) {
                    fail("PMIX_JOB_SIZE of a listed namespace", rc);
                }
                printf("QRY size %s %lu\n", ns, (unsigned long) number(&v));
                PMIX_VALUE_DESTRUCT(&v);
            }
            free(list);

            if (PMIX_SUCCESS != (rc = ask(PMIX_JOB_SIZE, me.nspace, true, &v))) {
                fail("PMIX_JOB_SIZE of its own job, refreshed", rc);
            }
            printf("QRY ownsize %lu\n", (unsigned long) number(&v));
            PMIX_VALUE_DESTRUCT(&v);

            rc = ask(PMIX_JOB_SIZE, "no-such-namespace", false, &v);
            if (PMIX_SUCCESS == rc) {
                fail("PMIX_JOB_SIZE of a namespace no job has was answered", PMIX_ERROR);
            }
            printf("QRY bogus %s\n", PMIx_Error_string(rc));

            rc = ask(PMIX_TIME_REMAINING, NULL, false, &v);
            if (PMIX_SUCCESS == rc) {
                fail("PMIX_TIME_REMAINING was answered", PMIX_ERROR);
            }
            printf("QRY unsupported %s\n", PMIx_Error_string(rc));
            fflush(stdout);
        }
    }
    rc = PMIx_Finalize(NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fail("finalize", rc);
    }
    return 0;
}
