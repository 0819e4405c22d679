/* The C ABI's cost per decision, from C: the same loops as examples/abi_bench.rs runs in
 * Rust, so that bench/run.sh can print the two side by side (same machine, same run). */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tollgate.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Decisions per loop: 20 M, or ABI_BENCH_N (a small count for a callgrind run). */
static uint64_t N = 20000000ull;

static void row(const char *name, double seconds, uint64_t sink) {
    printf("%-36s %7.2f ns/decision  (%llu)\n", name, seconds * 1e9 / (double)N, (unsigned long long)sink);
}

int main(void) {
    const char *n = getenv("ABI_BENCH_N");
    if (n && strtoull(n, NULL, 10) > 0) N = strtoull(n, NULL, 10);
    tollgate_limiter *allow = NULL, *deny = NULL;
    tollgate_keyed *keyed = NULL;
    tollgate_decision d;
    if (tollgate_limiter_parse("token_bucket", "1000000000/s burst=1000000000", &allow) ||
        tollgate_limiter_parse("token_bucket", "1/h", &deny) ||
        tollgate_keyed_parse("token_bucket", "1/h", 4096, &keyed)) {
        fprintf(stderr, "%s\n", tollgate_last_error());
        return 1;
    }
    for (int round = 0; round < 3; round++) {
        uint64_t sink = 0;
        double t = now_s();
        for (uint64_t i = 0; i < N; i++) {
            tollgate_limiter_check(allow, &d);
            sink += d.allowed;
        }
        row("direct check, allow", now_s() - t, sink);
        sink = 0;
        t = now_s();
        for (uint64_t i = 0; i < N; i++) {
            tollgate_limiter_check(deny, &d);
            sink += d.allowed;
        }
        row("direct check, deny", now_s() - t, sink);
        sink = 0;
        t = now_s();
        for (uint64_t i = 0; i < N; i++) {
            tollgate_keyed_check_n_at(keyed, i & 1023, 1, 1000, &d);
            sink += d.allowed;
        }
        row("keyed 1K check_n_at, deny", now_s() - t, sink);
        /* The hot path: the outcome returned, the wait written. */
        uint64_t wait;
        sink = 0;
        t = now_s();
        for (uint64_t i = 0; i < N; i++)
            sink += (uint64_t)tollgate_limiter_try(allow, &wait) ^ wait;
        row("direct try, allow", now_s() - t, sink);
        sink = 0;
        t = now_s();
        for (uint64_t i = 0; i < N; i++)
            sink += (uint64_t)tollgate_limiter_try(deny, &wait) ^ wait;
        row("direct try, deny", now_s() - t, sink);
        sink = 0;
        t = now_s();
        for (uint64_t i = 0; i < N; i++)
            sink += (uint64_t)tollgate_keyed_try(keyed, i & 1023, &wait) ^ wait;
        row("keyed 1K try, deny", now_s() - t, sink);
    }
    tollgate_limiter_free(allow);
    tollgate_limiter_free(deny);
    tollgate_keyed_free(keyed);
    return 0;
}
