/* PMIx events as a plain PMIx client (no MPI). Every rank registers its handlers, then the
 * job synchronizes (a fence, or the connect between two jobs), so no event can come before a
 * handler exists. Each handler records what it got and completes the event at once; a rank
 * waits for what it expects by polling what was recorded (the test's guard, never this
 * program, decides that something never came). Modes:
 *
 *   events custom ROUNDS
 *       Per round: a fence, then the last rank notifies a user event (EV_CUSTOM, range
 *       namespace, info "dvm.ev.round" = round); every rank, the notifier included (libpmix
 *       runs its own handlers locally), waits for that round's event and prints
 *       "EVC <round> rank <r> from <source rank>".
 *   events self exit|kill
 *       PMIX_ERR_PROC_ABORTED from a rank of its own job: after a fence the last rank dies
 *       (_exit(7), or SIGKILL); every other rank waits for the event and prints
 *       "EVA rank <r> own source <rank> code <exit code or -1>", then finalizes.
 *   events peer-wait TOKEN
 *   events peer-die TOKEN abort|abort-stay|exit|kill
 *       Two jobs launched separately meet through the data server (each rank publishes its
 *       namespace under "dvm-ev-<TOKEN>-wait" / "-die" from rank 0 and looks the other one up
 *       with PMIX_WAIT) and PMIx_Connect over both. Then the last rank of the peer-die job
 *       dies: PMIx_Abort(3) and _exit(3) ("abort"), PMIx_Abort(3) and stays ("abort-stay": the
 *       host must end it), _exit(5), or SIGKILL. Every rank of peer-wait waits for
 *       PMIX_ERR_PROC_ABORTED from the peer job and prints "EVA rank <r> peer source <rank>
 *       code <c>", then finalizes; the other ranks of peer-die stay until the DVM ends them,
 *       or (when their job survives) finalize once they got the same event as "own".
 *   events group
 *       A group whose member dies: after a fence the last rank exits (_exit(9)) and every other
 *       rank constructs a group of every rank; the construct must fail (the DVM tells the
 *       daemons of the other members): each prints "EVG rank <r> construct <status name>".
 *   events lost
 *       PMIX_ERR_LOST_CONNECTION and PMIX_EVENT_NODE_DOWN (a system event: its registration
 *       reaches the host): after a fence each rank prints "EVREADY rank <r>"; the test kills
 *       a daemon; every rank that survives waits for both events and prints
 *       "EVL rank <r> lost host <host> affected <ranks,...>" and "EVL rank <r> nodedown host <host>".
 *
 * Any failure prints "FAIL ..." and exits 1. */
#include <pmix.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EV_CUSTOM (PMIX_EXTERNAL_ERR_BASE - 100)
#define MAX_SEEN 64

static pmix_proc_t me;
static uint32_t size;

/* What the handlers recorded (written on libpmix's thread, read by polling). */
struct seen {
    pmix_status_t code;
    pmix_proc_t source;
    int round;
    int exit_code;
    char host[128];
    char affected[256];
};
static struct seen seen[MAX_SEEN];
static volatile int nseen;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *what, pmix_status_t rc)
{
    printf("FAIL rank %u: %s: %s\n", me.rank, what, PMIx_Error_string(rc));
    fflush(stdout);
    exit(1);
}

static void handler(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[],
                    size_t ninfo, pmix_info_t *results, size_t nresults,
                    pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void) id;
    (void) results;
    (void) nresults;
    pthread_mutex_lock(&lock);
    if (nseen < MAX_SEEN) {
        struct seen *s = &seen[nseen];
        memset(s, 0, sizeof *s);
        s->code = status;
        s->round = -1;
        s->exit_code = -1;
        if (NULL != source) {
            PMIX_LOAD_PROCID(&s->source, source->nspace, source->rank);
        }
        for (size_t i = 0; i < ninfo; i++) {
            if (0 == strcmp(info[i].key, "dvm.ev.round") && PMIX_UINT32 == info[i].value.type) {
                s->round = (int) info[i].value.data.uint32;
            } else if (PMIX_CHECK_KEY(&info[i], PMIX_EXIT_CODE) && PMIX_INT == info[i].value.type) {
                s->exit_code = info[i].value.data.integer;
            } else if (PMIX_CHECK_KEY(&info[i], PMIX_EXIT_CODE) && PMIX_INT32 == info[i].value.type) {
                s->exit_code = info[i].value.data.int32;
            } else if (PMIX_CHECK_KEY(&info[i], PMIX_HOSTNAME) && PMIX_STRING == info[i].value.type) {
                snprintf(s->host, sizeof s->host, "%s", info[i].value.data.string);
            } else if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROCS)
                       && PMIX_DATA_ARRAY == info[i].value.type
                       && PMIX_PROC == info[i].value.data.darray->type) {
                pmix_proc_t *p = (pmix_proc_t *) info[i].value.data.darray->array;
                size_t n = info[i].value.data.darray->size, used = 0;
                for (size_t k = 0; k < n && used + 12 < sizeof s->affected; k++) {
                    used += snprintf(s->affected + used, sizeof s->affected - used, "%s%u", k ? "," : "",
                                     p[k].rank);
                }
            }
        }
        nseen++;
    }
    pthread_mutex_unlock(&lock);
    if (NULL != cbfunc) {
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
    }
}

static void register_for(pmix_status_t *codes, size_t ncodes)
{
    pmix_status_t rc = PMIx_Register_event_handler(codes, ncodes, NULL, 0, handler, NULL, NULL);
    if (rc < 0) {
        fail("register event handler", rc);
    }
}

/* Index of the first recorded event matching (code, round >= 0 ? round : any) from a source in
 * `nspace` (NULL: any), waiting for it. */
static struct seen wait_for(pmix_status_t code, int round, const char *nspace)
{
    for (;;) {
        pthread_mutex_lock(&lock);
        for (int i = 0; i < nseen; i++) {
            if (seen[i].code == code && (round < 0 || seen[i].round == round)
                && (NULL == nspace || PMIX_CHECK_NSPACE(seen[i].source.nspace, nspace))) {
                struct seen s = seen[i];
                seen[i].code = 0; /* consumed */
                pthread_mutex_unlock(&lock);
                return s;
            }
        }
        pthread_mutex_unlock(&lock);
        usleep(1000);
    }
}

static void fence(void)
{
    pmix_status_t rc = PMIx_Fence(NULL, 0, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fail("fence", rc);
    }
}

static void finalize(void)
{
    fflush(stdout);
    pmix_status_t rc = PMIx_Finalize(NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fail("finalize", rc);
    }
}

static void custom(int rounds)
{
    pmix_status_t code = EV_CUSTOM;
    register_for(&code, 1);
    for (int round = 0; round < rounds; round++) {
        fence();
        if (me.rank == size - 1) {
            pmix_info_t info;
            uint32_t r = (uint32_t) round;
            PMIx_Info_load(&info, "dvm.ev.round", &r, PMIX_UINT32);
            pmix_status_t rc = PMIx_Notify_event(EV_CUSTOM, &me, PMIX_RANGE_NAMESPACE, &info, 1, NULL, NULL);
            PMIX_INFO_DESTRUCT(&info);
            if (PMIX_SUCCESS != rc) {
                fail("notify", rc);
            }
        }
        struct seen s = wait_for(EV_CUSTOM, round, me.nspace);
        printf("EVC %d rank %u from %u\n", round, me.rank, s.source.rank);
        fflush(stdout);
    }
    finalize();
}

static void die(const char *how)
{
    fflush(stdout);
    if (0 == strcmp(how, "kill")) {
        raise(SIGKILL);
    } else if (0 == strcmp(how, "exit")) {
        _exit(5);
    } else if (0 == strcmp(how, "abort") || 0 == strcmp(how, "abort-stay")) {
        pmix_status_t rc = PMIx_Abort(3, "events test: peer-die aborts", NULL, 0);
        if (PMIX_SUCCESS != rc) {
            fail("abort", rc);
        }
        if (0 == strcmp(how, "abort")) {
            _exit(3);
        }
        for (;;) {
            pause();
        }
    }
    fail("unknown way to die", PMIX_ERR_BAD_PARAM);
}

static void self(const char *how)
{
    pmix_status_t code = PMIX_ERR_PROC_ABORTED;
    register_for(&code, 1);
    fence();
    if (me.rank == size - 1) {
        if (0 == strcmp(how, "exit")) {
            _exit(7);
        }
        die(how);
    }
    struct seen s = wait_for(PMIX_ERR_PROC_ABORTED, -1, me.nspace);
    printf("EVA rank %u own source %u code %d\n", me.rank, s.source.rank, s.exit_code);
    finalize();
}

/* Publish this job's namespace under dvm-ev-<token>-<mine> (rank 0) and look up the other's. */
static void rendezvous(const char *token, const char *mine, const char *theirs, char *peer)
{
    char key[PMIX_MAX_KEYLEN + 1];
    pmix_status_t rc;
    if (0 == me.rank) {
        pmix_info_t info;
        snprintf(key, sizeof key, "dvm-ev-%s-%s", token, mine);
        PMIx_Info_load(&info, key, me.nspace, PMIX_STRING);
        if (PMIX_SUCCESS != (rc = PMIx_Publish(&info, 1))) {
            fail("publish", rc);
        }
        PMIX_INFO_DESTRUCT(&info);
    }
    pmix_pdata_t pd;
    PMIX_PDATA_CONSTRUCT(&pd);
    snprintf(key, sizeof key, "dvm-ev-%s-%s", token, theirs);
    pmix_strncpy(pd.key, key, PMIX_MAX_KEYLEN);
    pmix_info_t wait;
    bool yes = true;
    PMIx_Info_load(&wait, PMIX_WAIT, &yes, PMIX_BOOL);
    if (PMIX_SUCCESS != (rc = PMIx_Lookup(&pd, 1, &wait, 1))) {
        fail("lookup", rc);
    }
    if (PMIX_STRING != pd.value.type) {
        fail("looked-up namespace is no string", PMIX_ERR_TYPE_MISMATCH);
    }
    pmix_strncpy(peer, pd.value.data.string, PMIX_MAX_NSLEN);
    PMIX_PDATA_DESTRUCT(&pd);
}

static void peer(const char *token, int dying, const char *how)
{
    char other[PMIX_MAX_NSLEN + 1] = {0};
    pmix_status_t code = PMIX_ERR_PROC_ABORTED;
    register_for(&code, 1);
    rendezvous(token, dying ? "die" : "wait", dying ? "wait" : "die", other);
    pmix_proc_t both[2];
    PMIX_LOAD_PROCID(&both[0], me.nspace, PMIX_RANK_WILDCARD);
    PMIX_LOAD_PROCID(&both[1], other, PMIX_RANK_WILDCARD);
    pmix_status_t rc = PMIx_Connect(both, 2, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fail("connect", rc);
    }
    printf("EVCONNECTED rank %u\n", me.rank);
    fflush(stdout);
    if (dying && me.rank == size - 1) {
        die(how);
    }
    if (dying) {
        /* The rest of the dying job: ended by the DVM, or told if their job survives. */
        struct seen s = wait_for(PMIX_ERR_PROC_ABORTED, -1, me.nspace);
        printf("EVA rank %u own source %u code %d\n", me.rank, s.source.rank, s.exit_code);
    } else {
        struct seen s = wait_for(PMIX_ERR_PROC_ABORTED, -1, other);
        printf("EVA rank %u peer source %u code %d\n", me.rank, s.source.rank, s.exit_code);
    }
    finalize();
}

static void group(void)
{
    fence();
    if (me.rank == size - 1) {
        fflush(stdout);
        _exit(9);
    }
    pmix_proc_t *all = calloc(size, sizeof(pmix_proc_t));
    for (uint32_t r = 0; r < size; r++) {
        PMIX_LOAD_PROCID(&all[r], me.nspace, r);
    }
    pmix_info_t *results = NULL;
    size_t nresults = 0;
    pmix_status_t rc = PMIx_Group_construct("dvm-ev-grp", all, size, NULL, 0, &results, &nresults);
    if (NULL != results) {
        PMIX_INFO_FREE(results, nresults);
    }
    free(all);
    printf("EVG rank %u construct %s\n", me.rank, PMIX_SUCCESS == rc ? "SUCCESS" : PMIx_Error_string(rc));
    finalize();
}

static void lost(void)
{
    pmix_status_t codes[2] = {PMIX_ERR_LOST_CONNECTION, PMIX_EVENT_NODE_DOWN};
    register_for(codes, 2);
    fence();
    printf("EVREADY rank %u\n", me.rank);
    fflush(stdout);
    struct seen l = wait_for(PMIX_ERR_LOST_CONNECTION, -1, NULL);
    printf("EVL rank %u lost host %s affected %s\n", me.rank, l.host, l.affected);
    struct seen d = wait_for(PMIX_EVENT_NODE_DOWN, -1, NULL);
    printf("EVL rank %u nodedown host %s\n", me.rank, d.host);
    finalize();
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: events custom ROUNDS | self HOW | peer-wait TOKEN | peer-die TOKEN HOW | group | lost\n");
        return 2;
    }
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *v = NULL;
    if (PMIX_SUCCESS != (rc = PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &v))) {
        fail("job size", rc);
    }
    size = v->data.uint32;
    PMIX_VALUE_RELEASE(v);
    const char *mode = argv[1];
    if (0 == strcmp(mode, "custom") && argc > 2) {
        custom(atoi(argv[2]));
    } else if (0 == strcmp(mode, "self") && argc > 2) {
        self(argv[2]);
    } else if (0 == strcmp(mode, "peer-wait") && argc > 2) {
        peer(argv[2], 0, NULL);
    } else if (0 == strcmp(mode, "peer-die") && argc > 3) {
        peer(argv[2], 1, argv[3]);
    } else if (0 == strcmp(mode, "group")) {
        group();
    } else if (0 == strcmp(mode, "lost")) {
        lost();
    } else {
        fail("bad arguments", PMIX_ERR_BAD_PARAM);
    }
    return 0;
}
