/* scaletest: prices a DVM's PMIx data movement from inside a job, one process per rank.
 *
 * Per iteration every rank puts --nkeys keys of --size pseudo-random bytes (key names carry
 * the iteration, so every iteration moves fresh data and never re-fences old keys), commits,
 * then times
 *   collect_us  a PMIx_Fence with PMIX_COLLECT_DATA=true (with --neighbors: without it, so
 *               the gets below go through direct modex),
 *   barrier_us  a bare PMIx_Fence (no data),
 *   get_us      PMIx_Get of every peer's keys (--neighbors: only rank-1 and rank+1),
 * and verifies every byte it got against the value the owner must have put (the bytes are a
 * function of seed, owner rank, iteration and key index, so no copy is needed to check them).
 * Verification is outside the timed region.
 *
 * At the end every rank publishes its timings under one more key and one collecting fence
 * brings them to rank 0, which prints one CSV row per iteration with the maximum over ranks.
 * Iteration 1 is a row like the others; whoever summarizes must report it apart from the
 * steady state (it includes first-contact costs). Build:
 *   gcc -O2 -o scaletest scaletest.c $(pkg-config --cflags --libs pmix)
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pmix.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pmix_proc_t me;

#define DIE(...)                                              \
    do {                                                      \
        fprintf(stderr, "scaletest rank %u: ", me.rank);      \
        fprintf(stderr, __VA_ARGS__);                         \
        fprintf(stderr, "\n");                                \
        exit(1);                                              \
    } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* splitmix64: a tiny, well-mixed generator; its output does not compress. */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill(unsigned char *buf, size_t n, uint64_t seed, uint32_t rank, int iter, int key) {
    uint64_t s = seed ^ ((uint64_t)rank << 40) ^ ((uint64_t)iter << 20) ^ (uint64_t)key;
    mix(&s);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mix(&s);
        size_t m = n - i < 8 ? n - i : 8;
        memcpy(buf + i, &v, m);
    }
}

static void key_name(char *out, int iter, int k) { snprintf(out, PMIX_MAX_KEYLEN, "st.%d.%d", iter, k); }

static uint32_t job_u32(const char *key) {
    pmix_proc_t wild;
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(&wild, key, NULL, 0, &v);
    if (rc != PMIX_SUCCESS) DIE("PMIx_Get(%s) failed: %s", key, PMIx_Error_string(rc));
    uint32_t out = v->type == PMIX_UINT32 ? v->data.uint32 : 0;
    PMIX_VALUE_RELEASE(v);
    return out;
}

static void fence(bool collect) {
    pmix_info_t info;
    bool flag = true;
    PMIX_INFO_CONSTRUCT(&info);
    if (collect) PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &flag, PMIX_BOOL);
    pmix_status_t rc = PMIx_Fence(NULL, 0, collect ? &info : NULL, collect ? 1 : 0);
    if (rc != PMIX_SUCCESS) DIE("PMIx_Fence(collect=%d) failed: %s", collect, PMIx_Error_string(rc));
    PMIX_INFO_DESTRUCT(&info);
}

static void put_bytes(const char *key, const void *bytes, size_t n) {
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = (char *)bytes;
    v.data.bo.size = n;
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v); /* copies the value */
    if (rc != PMIX_SUCCESS) DIE("PMIx_Put(%s) failed: %s", key, PMIx_Error_string(rc));
}

static pmix_value_t *get_from(uint32_t rank, const char *key) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, me.nspace, rank);
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(&p, key, NULL, 0, &v);
    if (rc != PMIX_SUCCESS) DIE("PMIx_Get(rank %u, %s) failed: %s", rank, key, PMIx_Error_string(rc));
    if (v->type != PMIX_BYTE_OBJECT) DIE("PMIx_Get(rank %u, %s): type %d, want a byte object", rank, key, v->type);
    return v;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: scaletest [--size BYTES] [--nkeys K] [--iters N] [--neighbors] [--seed S]\n"
            "                 [--warmup W] [--radix R] [--movement M] [--header]\n"
            "  --warmup W: W untimed fence rounds with no data before iteration 1.\n"
            "  libpmix re-sends every key a rank committed at each collecting fence: iteration k\n"
            "  carries k x nkeys x size per rank. For fences of a fixed size use --iters 1 and\n"
            "  several jobs.\n"
            "  --radix and --movement only label the CSV rows (the DVM's settings).\n");
}

int main(int argc, char **argv) {
    size_t size = 64;
    int nkeys = 1, iters = 5, neighbors = 0, header = 0, warmup = 0;
    uint64_t seed = 0x5ca1e7e57ull;
    const char *radix = "?", *movement = "tree";
    static struct option opts[] = {{"size", required_argument, 0, 's'},    {"nkeys", required_argument, 0, 'k'},
                                   {"iters", required_argument, 0, 'i'},   {"neighbors", no_argument, 0, 'n'},
                                   {"seed", required_argument, 0, 'S'},    {"radix", required_argument, 0, 'r'},
                                   {"movement", required_argument, 0, 'm'}, {"header", no_argument, 0, 'H'},
                                   {"warmup", required_argument, 0, 'w'},  {"help", no_argument, 0, 'h'},
                                   {0, 0, 0, 0}};
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        errno = 0;
        switch (c) {
        case 's': size = strtoull(optarg, &end, 10); if (*end || errno || size == 0) { fprintf(stderr, "scaletest: --size %s is not a positive byte count\n", optarg); return 1; } break;
        case 'k': nkeys = (int)strtol(optarg, &end, 10); if (*end || nkeys < 1) { fprintf(stderr, "scaletest: --nkeys %s is not a positive count\n", optarg); return 1; } break;
        case 'i': iters = (int)strtol(optarg, &end, 10); if (*end || iters < 1) { fprintf(stderr, "scaletest: --iters %s is not a positive count\n", optarg); return 1; } break;
        case 'n': neighbors = 1; break;
        case 'w': warmup = (int)strtol(optarg, &end, 10); if (*end || warmup < 0) { fprintf(stderr, "scaletest: --warmup %s is not a count\n", optarg); return 1; } break;
        case 'S': seed = strtoull(optarg, &end, 0); if (*end) { fprintf(stderr, "scaletest: --seed %s is not a number\n", optarg); return 1; } break;
        case 'r': radix = optarg; break;
        case 'm': movement = optarg; break;
        case 'H': header = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 1;
        }
    }
    if (optind != argc) { fprintf(stderr, "scaletest: unexpected argument '%s'\n", argv[optind]); return 1; }

    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "scaletest: PMIx_Init failed: %s (run it under prun)\n", PMIx_Error_string(rc));
        return 1;
    }
    uint32_t n = job_u32(PMIX_JOB_SIZE), ppn = job_u32(PMIX_LOCAL_SIZE), nodes = job_u32(PMIX_NUM_NODES);
    if (n == 0) DIE("the job size is unknown");

    unsigned char *mine = malloc(size), *want = malloc(size);
    double *t = calloc((size_t)iters * 3, sizeof(double));
    uint32_t *peers = malloc(sizeof(uint32_t) * n);
    pmix_value_t **got = malloc(sizeof(pmix_value_t *) * n * (size_t)nkeys);
    if (!mine || !want || !t || !peers || !got) DIE("out of memory for --size %zu x --nkeys %d", size, nkeys);

    uint32_t npeers = 0;
    if (neighbors) {
        if (n > 1) peers[npeers++] = (me.rank + 1) % n;
        if (n > 2) peers[npeers++] = (me.rank + n - 1) % n;
    } else {
        for (uint32_t r = 0; r < n; r++) if (r != me.rank) peers[npeers++] = r;
    }

    char key[PMIX_MAX_KEYLEN + 1];
    fence(false); /* every rank is up before the first timed fence */
    /* Warm-up rounds put nothing, so they warm the fence path without adding data that later
     * collecting fences would carry again (libpmix re-sends every committed key). */
    for (int w = 0; w < warmup; w++) {
        fence(!neighbors);
        fence(false);
    }
    for (int it = 1; it <= iters; it++) {
        for (int k = 0; k < nkeys; k++) {
            fill(mine, size, seed, me.rank, it, k);
            key_name(key, it, k);
            put_bytes(key, mine, size);
        }
        rc = PMIx_Commit();
        if (rc != PMIX_SUCCESS) DIE("PMIx_Commit failed: %s", PMIx_Error_string(rc));

        double t0 = now_us();
        fence(!neighbors);
        double t1 = now_us();
        fence(false);
        double t2 = now_us();
        double tget = 0;
        size_t ngot = 0;
        for (uint32_t p = 0; p < npeers; p++) {
            for (int k = 0; k < nkeys; k++) {
                key_name(key, it, k);
                double g0 = now_us();
                got[ngot++] = get_from(peers[p], key);
                tget += now_us() - g0;
            }
        }
        ngot = 0;
        for (uint32_t p = 0; p < npeers; p++) {
            for (int k = 0; k < nkeys; k++) {
                pmix_value_t *v = got[ngot++];
                fill(want, size, seed, peers[p], it, k);
                if (v->data.bo.size != size) DIE("rank %u key st.%d.%d has %zu bytes, want %zu", peers[p], it, k, v->data.bo.size, size);
                if (memcmp(v->data.bo.bytes, want, size) != 0) {
                    size_t at = 0;
                    while (((unsigned char *)v->data.bo.bytes)[at] == want[at]) at++;
                    DIE("rank %u key st.%d.%d differs from what it put at byte %zu", peers[p], it, k, at);
                }
                PMIX_VALUE_RELEASE(v);
            }
        }
        t[(it - 1) * 3 + 0] = t1 - t0;
        t[(it - 1) * 3 + 1] = t2 - t1;
        t[(it - 1) * 3 + 2] = tget;
    }

    /* Bring every rank's timings to rank 0 (outside the measurement). */
    put_bytes("st.times", t, sizeof(double) * (size_t)iters * 3);
    if ((rc = PMIx_Commit()) != PMIX_SUCCESS) DIE("PMIx_Commit failed: %s", PMIx_Error_string(rc));
    fence(true);
    if (me.rank == 0) {
        double *mx = calloc((size_t)iters * 3, sizeof(double));
        memcpy(mx, t, sizeof(double) * (size_t)iters * 3);
        for (uint32_t r = 1; r < n; r++) {
            pmix_value_t *v = get_from(r, "st.times");
            if (v->data.bo.size != sizeof(double) * (size_t)iters * 3) DIE("rank %u published %zu bytes of timings", r, v->data.bo.size);
            const double *tr = (const double *)v->data.bo.bytes;
            for (int i = 0; i < iters * 3; i++) if (tr[i] > mx[i]) mx[i] = tr[i];
            PMIX_VALUE_RELEASE(v);
        }
        if (header) printf("nodes,ppn,ranks,radix,movement,mode,size,nkeys,iteration,collect_us,barrier_us,get_us\n");
        for (int it = 1; it <= iters; it++) {
            printf("%u,%u,%u,%s,%s,%s,%zu,%d,%d,%.0f,%.0f,%.0f\n", nodes, ppn, n, radix, movement,
                   neighbors ? "neighbors" : "all", size, nkeys, it, mx[(it - 1) * 3], mx[(it - 1) * 3 + 1],
                   mx[(it - 1) * 3 + 2]);
        }
        fflush(stdout);
        free(mx);
    }
    fence(false); /* rank 0 has read everything before anyone finalizes */
    rc = PMIx_Finalize(NULL, 0);
    if (rc != PMIX_SUCCESS) DIE("PMIx_Finalize failed: %s", PMIx_Error_string(rc));
    free(mine); free(want); free(t); free(peers); free(got);
    return 0;
}
