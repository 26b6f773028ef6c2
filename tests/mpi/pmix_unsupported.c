/* A PMIx client that asks its daemon for what the DVM does not serve: allocation status and an
 * unknown key by query, a query mixing a served and an unknown key, a new allocation, a job
 * control directive, process monitoring, a log to a channel nobody provides, credentials and a
 * fabric. Each request prints "NAME=STATUS" (and "NAME_n=N" for result counts); the program
 * ends with "finalize=ok". It exits non-zero only if PMIx_Init or PMIx_Finalize fail: the point
 * is that every request comes back, with a status, and nothing crashes. */
#include <pmix.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

static void show(const char *what, pmix_status_t rc, pmix_info_t *results, size_t n) {
    printf("%s=%s\n", what, PMIx_Error_string(rc));
    printf("%s_n=%zu\n", what, n);
    if (results != NULL) PMIX_INFO_FREE(results, n);
}

static void query(const char *what, const char *k1, const char *k2) {
    pmix_query_t *q;
    pmix_status_t rc;
    pmix_info_t *results = NULL;
    size_t n = 0;
    PMIX_QUERY_CREATE(q, 1);
    PMIX_ARGV_APPEND(rc, q[0].keys, k1);
    if (k2 != NULL) PMIX_ARGV_APPEND(rc, q[0].keys, k2);
    rc = PMIx_Query_info(q, 1, &results, &n);
    show(what, rc, results, n);
    PMIX_QUERY_FREE(q, 1);
}

int main(void) {
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 3;
    }
    printf("rank=%u\n", me.rank);
    query("query_alloc_status", PMIX_QUERY_ALLOC_STATUS, NULL);
    query("query_unknown", "dvm.no.such.key", NULL);
    query("query_partial", PMIX_QUERY_NUM_PSETS, "dvm.no.such.key");

    pmix_info_t *results = NULL;
    size_t n = 0;
    pmix_info_t info;
    uint64_t one = 1;
    PMIX_INFO_LOAD(&info, PMIX_ALLOC_NUM_NODES, &one, PMIX_UINT64);
    rc = PMIx_Allocation_request(PMIX_ALLOC_NEW, &info, 1, &results, &n);
    show("allocation_request", rc, results, n);
    PMIX_INFO_DESTRUCT(&info);

    results = NULL, n = 0;
    bool yes = true;
    PMIX_INFO_LOAD(&info, PMIX_JOB_CTRL_PREEMPTIBLE, &yes, PMIX_BOOL);
    rc = PMIx_Job_control(NULL, 0, &info, 1, &results, &n);
    show("job_control", rc, results, n);
    PMIX_INFO_DESTRUCT(&info);

    results = NULL, n = 0;
    pmix_info_t dir;
    uint32_t secs = 10;
    PMIX_INFO_LOAD(&info, PMIX_MONITOR_HEARTBEAT, NULL, PMIX_POINTER);
    PMIX_INFO_LOAD(&dir, PMIX_MONITOR_HEARTBEAT_TIME, &secs, PMIX_UINT32);
    rc = PMIx_Process_monitor(&info, PMIX_MONITOR_HEARTBEAT_ALERT, &dir, 1, &results, &n);
    show("process_monitor", rc, results, n);
    PMIX_INFO_DESTRUCT(&dir);

    PMIX_INFO_LOAD(&info, "dvm.no.such.channel", "a line for nobody", PMIX_STRING);
    rc = PMIx_Log(&info, 1, NULL, 0);
    show("log_unknown_channel", rc, NULL, 0);
    PMIX_INFO_DESTRUCT(&info);

    pmix_byte_object_t cred;
    PMIX_BYTE_OBJECT_CONSTRUCT(&cred);
    rc = PMIx_Get_credential(NULL, 0, &cred);
    show("get_credential", rc, NULL, 0);
    PMIX_BYTE_OBJECT_DESTRUCT(&cred);

    pmix_fabric_t fabric;
    PMIX_FABRIC_CONSTRUCT(&fabric);
    rc = PMIx_Fabric_register(&fabric, NULL, 0);
    show("fabric_register", rc, NULL, 0);
    if (rc == PMIX_SUCCESS) PMIx_Fabric_deregister(&fabric);

    rc = PMIx_Finalize(NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Finalize: %s\n", PMIx_Error_string(rc));
        return 4;
    }
    printf("finalize=ok\n");
    return 0;
}
