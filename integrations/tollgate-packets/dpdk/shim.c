/* DPDK's rte_meter behind plain functions: its checks are inline in rte_meter.h. One meter of
 * any of the three kinds, its runtime's clock set to 0 so that a test can feed it times from
 * 0 in TSC cycles, as tollgate's meters take nanoseconds from their origin. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_meter.h>

int tg_dpdk_init(int argc, char **argv) { return rte_eal_init(argc, argv); }

uint64_t tg_dpdk_hz(void) { return rte_get_tsc_hz(); }

enum { TG_SRTCM = 0, TG_TRTCM = 1, TG_RFC4115 = 2 };

struct tg_dpdk_meter {
    int kind;
    union {
        struct rte_meter_srtcm_profile sr;
        struct rte_meter_trtcm_profile tr;
        struct rte_meter_trtcm_rfc4115_profile rfc;
    } p;
    union {
        struct rte_meter_srtcm sr;
        struct rte_meter_trtcm tr;
        struct rte_meter_trtcm_rfc4115 rfc;
    } m;
};

/* A meter (rates in bytes/s, sizes in bytes: srTCM cir, cbs, ebs; trTCM cir, cbs, pir, pbs;
 * RFC 4115 cir, cbs, eir, ebs), both buckets full, its clock at 0; NULL where DPDK refuses
 * the profile (*err: its error). */
struct tg_dpdk_meter *tg_dpdk_meter_new(int kind, uint64_t cir, uint64_t cbs, uint64_t r2, uint64_t s2, int *err) {
    struct tg_dpdk_meter *t = calloc(1, sizeof(*t));
    if (t == NULL) { *err = -12; return NULL; }
    t->kind = kind;
    int rc;
    switch (kind) {
    case TG_SRTCM: {
        struct rte_meter_srtcm_params params = { .cir = cir, .cbs = cbs, .ebs = s2 };
        rc = rte_meter_srtcm_profile_config(&t->p.sr, &params);
        if (rc == 0) rc = rte_meter_srtcm_config(&t->m.sr, &t->p.sr);
        t->m.sr.time = 0;
        break;
    }
    case TG_TRTCM: {
        struct rte_meter_trtcm_params params = { .cir = cir, .pir = r2, .cbs = cbs, .pbs = s2 };
        rc = rte_meter_trtcm_profile_config(&t->p.tr, &params);
        if (rc == 0) rc = rte_meter_trtcm_config(&t->m.tr, &t->p.tr);
        t->m.tr.time_tc = 0;
        t->m.tr.time_tp = 0;
        break;
    }
    case TG_RFC4115: {
        struct rte_meter_trtcm_rfc4115_params params = { .cir = cir, .eir = r2, .cbs = cbs, .ebs = s2 };
        rc = rte_meter_trtcm_rfc4115_profile_config(&t->p.rfc, &params);
        if (rc == 0) rc = rte_meter_trtcm_rfc4115_config(&t->m.rfc, &t->p.rfc);
        t->m.rfc.time_tc = 0;
        t->m.rfc.time_te = 0;
        break;
    }
    default:
        rc = -22;
    }
    if (rc != 0) { free(t); *err = rc; return NULL; }
    *err = 0;
    return t;
}

void tg_dpdk_meter_free(struct tg_dpdk_meter *t) { free(t); }

/* The profile's periods and bytes per period, as DPDK computed them: committed, then second. */
void tg_dpdk_meter_periods(const struct tg_dpdk_meter *t, uint64_t out[4]) {
    switch (t->kind) {
    case TG_SRTCM:
        out[0] = t->p.sr.cir_period; out[1] = t->p.sr.cir_bytes_per_period;
        out[2] = t->p.sr.cir_period; out[3] = t->p.sr.cir_bytes_per_period;
        break;
    case TG_TRTCM:
        out[0] = t->p.tr.cir_period; out[1] = t->p.tr.cir_bytes_per_period;
        out[2] = t->p.tr.pir_period; out[3] = t->p.tr.pir_bytes_per_period;
        break;
    default:
        out[0] = t->p.rfc.cir_period; out[1] = t->p.rfc.cir_bytes_per_period;
        out[2] = t->p.rfc.eir_period; out[3] = t->p.rfc.eir_bytes_per_period;
    }
}

/* The colour (0 green, 1 yellow, 2 red) of a packet of len bytes at time (TSC cycles since
 * the meter's clock's 0): colour-blind when color < 0, else colour-aware. */
int tg_dpdk_meter_check(struct tg_dpdk_meter *t, uint64_t time, uint32_t len, int color) {
    enum rte_color c = (enum rte_color)color;
    switch (t->kind) {
    case TG_SRTCM:
        return color < 0 ? rte_meter_srtcm_color_blind_check(&t->m.sr, &t->p.sr, time, len)
                         : rte_meter_srtcm_color_aware_check(&t->m.sr, &t->p.sr, time, len, c);
    case TG_TRTCM:
        return color < 0 ? rte_meter_trtcm_color_blind_check(&t->m.tr, &t->p.tr, time, len)
                         : rte_meter_trtcm_color_aware_check(&t->m.tr, &t->p.tr, time, len, c);
    default:
        return color < 0 ? rte_meter_trtcm_rfc4115_color_blind_check(&t->m.rfc, &t->p.rfc, time, len)
                         : rte_meter_trtcm_rfc4115_color_aware_check(&t->m.rfc, &t->p.rfc, time, len, c);
    }
}

/* The buckets' levels (committed, second). */
void tg_dpdk_meter_levels(const struct tg_dpdk_meter *t, uint64_t out[2]) {
    switch (t->kind) {
    case TG_SRTCM: out[0] = t->m.sr.tc; out[1] = t->m.sr.te; break;
    case TG_TRTCM: out[0] = t->m.tr.tc; out[1] = t->m.tr.tp; break;
    default: out[0] = t->m.rfc.tc; out[1] = t->m.rfc.te;
    }
}

/* Many flows' trTCM runtimes under one profile, for the benchmark: the meters of DPDK's
 * qos_meter sample behind a table the caller keeps (flow -> index). */
struct tg_dpdk_flows {
    struct rte_meter_trtcm_profile p;
    struct rte_meter_trtcm *m;
    size_t n;
};

struct tg_dpdk_flows *tg_dpdk_flows_new(uint64_t cir, uint64_t cbs, uint64_t pir, uint64_t pbs, size_t n) {
    if (n == 0 || n > (SIZE_MAX - 63) / sizeof(struct rte_meter_trtcm)) return NULL;
    struct tg_dpdk_flows *f = calloc(1, sizeof(*f));
    if (f == NULL) return NULL;
    struct rte_meter_trtcm_params params = { .cir = cir, .pir = pir, .cbs = cbs, .pbs = pbs };
    f->m = aligned_alloc(64, ((n * sizeof(*f->m)) + 63) / 64 * 64);
    if (f->m == NULL || rte_meter_trtcm_profile_config(&f->p, &params) != 0) { free(f->m); free(f); return NULL; }
    for (size_t i = 0; i < n; i++) rte_meter_trtcm_config(&f->m[i], &f->p);
    f->n = n;
    return f;
}

void tg_dpdk_flows_free(struct tg_dpdk_flows *f) { if (f) { free(f->m); free(f); } }

/* Colour-blind trTCM checks for a burst at one TSC reading, as the qos_meter sample does. */
void tg_dpdk_flows_burst(struct tg_dpdk_flows *f, const uint32_t *idx, const uint32_t *lens, uint32_t n,
                         uint64_t time, uint8_t *colors) {
    for (uint32_t i = 0; i < n; i++)
        colors[i] = (uint8_t)rte_meter_trtcm_color_blind_check(&f->m[idx[i]], &f->p, time, lens[i]);
}

uint64_t tg_dpdk_tsc(void) { return rte_rdtsc(); }

/* Colour-blind trTCM checks on runtimes the caller's table holds (struct rte_meter_trtcm is
 * four uint64_t: time_tc, time_tp, tc, tp), for the benchmark's like-with-like table. */
size_t tg_dpdk_trtcm_runtime_size(void) { return sizeof(struct rte_meter_trtcm); }

void tg_dpdk_trtcm_burst(const struct tg_dpdk_flows *f, struct rte_meter_trtcm *const *runtimes,
                         const uint32_t *lens, uint32_t n, uint64_t time, uint8_t *colors) {
    struct rte_meter_trtcm_profile *p = (struct rte_meter_trtcm_profile *)&f->p;
    for (uint32_t i = 0; i < n; i++)
        colors[i] = (uint8_t)rte_meter_trtcm_color_blind_check(runtimes[i], p, time, lens[i]);
}
