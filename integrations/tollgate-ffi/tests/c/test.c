/* The C ABI from C: every function and every error path, run under valgrind by the test
 * suite (scripts/test.sh). Exits 0 when every check passes; prints the first failure. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate.h"

static int checks = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        checks++;                                                                    \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, \
                    __LINE__, #cond, tollgate_last_error());                         \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* A call that must fail with `status`, leaving a message that mentions `needle`. */
#define FAILS(call, status, needle)                                 \
    do {                                                            \
        CHECK((call) == (status));                                  \
        CHECK(strstr(tollgate_last_error(), (needle)) != NULL);     \
    } while (0)

#define OK(call) CHECK((call) == TOLLGATE_OK)

static const uint64_t SECOND = 1000000000ull;

/* The layouts the library asserts on its side. */
_Static_assert(sizeof(tollgate_decision) == 40, "tollgate_decision is 40 bytes");
_Static_assert(sizeof(tollgate_params) == 40, "tollgate_params is 40 bytes");

/* The meters' flow table: a burst in DPDK's shape, blind and aware, its errors. */
static void meters(void) {
    tollgate_flow_meters *t = NULL;
    FAILS(tollgate_flow_meters_parse(NULL, 64, &t), TOLLGATE_ERROR_NULL, "meter");
    FAILS(tollgate_flow_meters_parse("srtcm cir=1Mbit/s cbs=1KiB", 64, &t), TOLLGATE_ERROR_INVALID, "ebs=");
    FAILS(tollgate_flow_meters_parse("trtcm cir=1furlong/s cbs=1 pir=1B/s pbs=1", 64, &t), TOLLGATE_ERROR_INVALID,
          "1furlong/s");
    FAILS(tollgate_flow_meters_parse("srtcm cir=\xff", 64, &t), TOLLGATE_ERROR_UTF8, "meter");
    FAILS(tollgate_flow_meters_parse("srtcm cir=1000B/s cbs=1000 ebs=1000", 0, &t), TOLLGATE_ERROR_INVALID,
          "capacity");
    FAILS(tollgate_flow_meters_parse("srtcm cir=1000B/s cbs=1000 ebs=1000", 64, NULL), TOLLGATE_ERROR_NULL, "out");
    CHECK(t == NULL);
    /* RFC 2697: CIR 1,000 B/s, CBS 1,000, EBS 1,000. */
    OK(tollgate_flow_meters_parse("srtcm cir=1000B/s cbs=1000 ebs=1000", 64, &t));
    uint64_t keys[6] = {1, 1, 1, 2, 1, 2};
    uint32_t lens[6] = {600, 600, 600, 1000, 1, 1001};
    uint8_t colors[6];
    OK(tollgate_flow_meters_color_burst(t, 0, keys, lens, NULL, colors, 6));
    CHECK(colors[0] == TOLLGATE_GREEN && colors[1] == TOLLGATE_YELLOW && colors[2] == TOLLGATE_RED);
    CHECK(colors[3] == TOLLGATE_GREEN && colors[4] == TOLLGATE_GREEN && colors[5] == TOLLGATE_RED);
    /* A second later flow 1's C is full again; colour-aware, a yellow packet stays yellow. */
    uint8_t in[2] = {TOLLGATE_YELLOW, TOLLGATE_GREEN};
    OK(tollgate_flow_meters_color_burst(t, SECOND, keys, lens, in, colors, 2));
    CHECK(colors[0] == TOLLGATE_YELLOW && colors[1] == TOLLGATE_GREEN);
    /* Coloured in place: the input colours' array is the output. */
    uint8_t inplace[2] = {TOLLGATE_YELLOW, TOLLGATE_RED};
    uint32_t small[2] = {100, 100};
    OK(tollgate_flow_meters_color_burst(t, 2 * SECOND, keys, small, inplace, inplace, 2));
    CHECK(inplace[0] == TOLLGATE_YELLOW && inplace[1] == TOLLGATE_RED);
    uint8_t bad[2] = {TOLLGATE_GREEN, 3};
    FAILS(tollgate_flow_meters_color_burst(t, SECOND, keys, lens, bad, colors, 2), TOLLGATE_ERROR_INVALID,
          "colors_in[1] is 3");
    FAILS(tollgate_flow_meters_color_burst(t, SECOND, NULL, lens, NULL, colors, 2), TOLLGATE_ERROR_NULL, "keys");
    FAILS(tollgate_flow_meters_color_burst(t, SECOND, keys, lens, NULL, NULL, 2), TOLLGATE_ERROR_NULL, "colors_out");
    FAILS(tollgate_flow_meters_color_burst(NULL, SECOND, keys, lens, NULL, colors, 2), TOLLGATE_ERROR_NULL, "table");
    OK(tollgate_flow_meters_color_burst(t, SECOND, NULL, NULL, NULL, NULL, 0));
    OK(tollgate_flow_meters_color_burst(t, TOLLGATE_NOW, keys, lens, NULL, colors, 6));
    uint64_t now = 0, flows = 0, full = 7;
    OK(tollgate_flow_meters_now(t, &now));
    OK(tollgate_flow_meters_stats(t, &flows, &full));
    CHECK(flows == 2 && full == 0);
    OK(tollgate_flow_meters_stats(t, NULL, NULL));
    OK(tollgate_flow_meters_free(t));
    FAILS(tollgate_flow_meters_free(t), TOLLGATE_ERROR_HANDLE, "not a live handle");
}

static void statuses(void) {
    CHECK(strcmp(tollgate_last_error(), "") == 0);
    CHECK(strcmp(tollgate_status_name(TOLLGATE_OK), "TOLLGATE_OK") == 0);
    CHECK(strcmp(tollgate_status_name(TOLLGATE_ERROR_NULL), "TOLLGATE_ERROR_NULL") == 0);
    CHECK(strcmp(tollgate_status_name(TOLLGATE_ERROR_INVALID), "TOLLGATE_ERROR_INVALID") == 0);
    CHECK(strcmp(tollgate_status_name(TOLLGATE_ERROR_UTF8), "TOLLGATE_ERROR_UTF8") == 0);
    CHECK(strcmp(tollgate_status_name(TOLLGATE_ERROR_HANDLE), "TOLLGATE_ERROR_HANDLE") == 0);
    CHECK(strcmp(tollgate_status_name(TOLLGATE_ERROR_PANIC), "TOLLGATE_ERROR_PANIC") == 0);
    CHECK(strcmp(tollgate_status_name(42), "TOLLGATE_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(tollgate_status_name(-1), "TOLLGATE_UNKNOWN_STATUS") == 0);
}

/* Every algorithm from plain numbers and from its string; bad numbers and strings. */
static void constructors(void) {
    tollgate_limiter *l = NULL;
    tollgate_params bucket = {TOLLGATE_TOKEN_BUCKET, 10, SECOND, 20, 0};
    tollgate_params nginx = {TOLLGATE_NGINX, 10, SECOND, 5, TOLLGATE_NODELAY};
    tollgate_params nginx_min = {TOLLGATE_NGINX, 60, 60 * SECOND, 5, 2};
    tollgate_params fixed = {TOLLGATE_FIXED_WINDOW, 100, 60 * SECOND, 0, 0};
    tollgate_params sliding = {TOLLGATE_SLIDING_WINDOW, 100, 60 * SECOND, 0, 0};
    tollgate_params log = {TOLLGATE_SLIDING_LOG, 100, 60 * SECOND, 0, 0};
    tollgate_params all[] = {bucket, nginx, nginx_min, fixed, sliding, log};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        OK(tollgate_limiter_new(&all[i], &l));
        CHECK(l != NULL);
        OK(tollgate_limiter_free(l));
    }
    const char *strings[][2] = {{"token_bucket", "10/s burst=20"}, {"nginx", "10r/s burst=20 nodelay"},
                                {"fixed_window", "100/min"}, {"sliding_window", "100/min"},
                                {"sliding_log", "5/s"}};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        OK(tollgate_limiter_parse(strings[i][0], strings[i][1], &l));
        OK(tollgate_limiter_free(l));
    }

    /* Null pointers. */
    FAILS(tollgate_limiter_new(NULL, &l), TOLLGATE_ERROR_NULL, "params");
    FAILS(tollgate_limiter_new(&bucket, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_limiter_parse(NULL, "5/s", &l), TOLLGATE_ERROR_NULL, "algorithm");
    FAILS(tollgate_limiter_parse("token_bucket", NULL, &l), TOLLGATE_ERROR_NULL, "config");
    FAILS(tollgate_limiter_parse("token_bucket", "5/s", NULL), TOLLGATE_ERROR_NULL, "out");
    /* Zero, overflowing and unused parameters. */
    tollgate_params zero_rate = {TOLLGATE_TOKEN_BUCKET, 0, SECOND, 20, 0};
    CHECK(tollgate_limiter_new(&zero_rate, &l) == TOLLGATE_ERROR_INVALID);
    CHECK(strlen(tollgate_last_error()) > 0);
    tollgate_params zero_period = {TOLLGATE_FIXED_WINDOW, 10, 0, 0, 0};
    CHECK(tollgate_limiter_new(&zero_period, &l) == TOLLGATE_ERROR_INVALID);
    tollgate_params huge = {TOLLGATE_TOKEN_BUCKET, UINT64_MAX, 1, UINT64_MAX, 0};
    CHECK(tollgate_limiter_new(&huge, &l) == TOLLGATE_ERROR_INVALID);
    tollgate_params zero_burst = {TOLLGATE_TOKEN_BUCKET, 10, SECOND, 0, 0};
    CHECK(tollgate_limiter_new(&zero_burst, &l) == TOLLGATE_ERROR_INVALID);
    tollgate_params nginx_hour = {TOLLGATE_NGINX, 10, 3600 * SECOND, 5, 0};
    FAILS(tollgate_limiter_new(&nginx_hour, &l), TOLLGATE_ERROR_INVALID, "per second or per minute");
    tollgate_params window_burst = {TOLLGATE_SLIDING_LOG, 10, SECOND, 5, 0};
    FAILS(tollgate_limiter_new(&window_burst, &l), TOLLGATE_ERROR_INVALID, "burst is 5");
    tollgate_params bucket_delay = {TOLLGATE_TOKEN_BUCKET, 10, SECOND, 5, 3};
    FAILS(tollgate_limiter_new(&bucket_delay, &l), TOLLGATE_ERROR_INVALID, "delay is 3");
    tollgate_params fixed_burst = {TOLLGATE_FIXED_WINDOW, 10, SECOND, 1, 0};
    FAILS(tollgate_limiter_new(&fixed_burst, &l), TOLLGATE_ERROR_INVALID, "burst is 1");
    tollgate_params sliding_delay = {TOLLGATE_SLIDING_WINDOW, 10, SECOND, 0, 2};
    FAILS(tollgate_limiter_new(&sliding_delay, &l), TOLLGATE_ERROR_INVALID, "delay is 2");
    tollgate_params unknown = {99, 10, SECOND, 5, 0};
    FAILS(tollgate_limiter_new(&unknown, &l), TOLLGATE_ERROR_INVALID, "algorithm is 99");
    /* Strings that are not configurations, or not UTF-8. */
    FAILS(tollgate_limiter_parse("leaky", "5/s", &l), TOLLGATE_ERROR_INVALID, "unknown algorithm");
    FAILS(tollgate_limiter_parse("token_bucket", "five per second", &l), TOLLGATE_ERROR_INVALID,
          "five per second");
    FAILS(tollgate_limiter_parse("token_bucket", "5/s \xff", &l), TOLLGATE_ERROR_UTF8, "config is not UTF-8");
    FAILS(tollgate_limiter_parse("\xfe", "5/s", &l), TOLLGATE_ERROR_UTF8, "algorithm is not UTF-8");
}

static void direct(void) {
    tollgate_limiter *l = NULL;
    tollgate_decision d;
    OK(tollgate_limiter_parse("token_bucket", "5/s", &l));
    for (int i = 0; i < 5; i++) {
        OK(tollgate_limiter_check_n_at(l, 1, 0, &d));
        CHECK(d.allowed == 1 && d.outcome == TOLLGATE_ALLOWED && d.remaining == (uint64_t)(4 - i));
    }
    OK(tollgate_limiter_check_n_at(l, 1, 0, &d));
    CHECK(d.allowed == 0 && d.outcome == TOLLGATE_DENIED);
    CHECK(d.retry_after_ns == SECOND / 5); /* one token, 200 ms */
    CHECK(d.reset_ns == SECOND);
    /* The caller's time counts from the handle's creation: a second later, 5 tokens again. */
    OK(tollgate_limiter_check_n_at(l, 5, SECOND, &d));
    CHECK(d.allowed && d.remaining == 0);
    OK(tollgate_limiter_check_n_at(l, 1, SECOND + SECOND / 5, &d));
    CHECK(d.allowed);
    OK(tollgate_limiter_check_n_at(l, 6, 2 * SECOND, &d));
    CHECK(d.outcome == TOLLGATE_INSUFFICIENT && d.retry_after_ns == UINT64_MAX);
    OK(tollgate_limiter_peek_n(l, 1, &d));
    OK(tollgate_limiter_check(l, &d));
    OK(tollgate_limiter_check_n(l, 2, &d));
    uint64_t costs[3] = {1, 2, 9};
    tollgate_decision out[3];
    OK(tollgate_limiter_check_batch(l, costs, 3, out));
    CHECK(out[2].outcome == TOLLGATE_INSUFFICIENT);
    OK(tollgate_limiter_check_batch(l, NULL, 3, out));
    OK(tollgate_limiter_check_batch(l, NULL, 0, NULL));
    FAILS(tollgate_limiter_check_batch(l, costs, 3, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_limiter_check_batch(NULL, costs, 3, out), TOLLGATE_ERROR_NULL, "limiter");
    FAILS(tollgate_limiter_check(NULL, &d), TOLLGATE_ERROR_NULL, "limiter");
    FAILS(tollgate_limiter_check(l, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_limiter_check_n(NULL, 1, &d), TOLLGATE_ERROR_NULL, "limiter");
    FAILS(tollgate_limiter_check_n_at(l, 1, 0, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_limiter_check_n_at(NULL, 1, 0, &d), TOLLGATE_ERROR_NULL, "limiter");
    FAILS(tollgate_limiter_check_n(l, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    /* A misaligned array is an error, not undefined behaviour. */
    uint64_t words[4] = {1, 1, 1, 1};
    FAILS(tollgate_limiter_check_batch(l, (const uint64_t *)((const char *)words + 1), 2, out),
          TOLLGATE_ERROR_INVALID, "not aligned");
    FAILS(tollgate_limiter_peek_n(NULL, 1, &d), TOLLGATE_ERROR_NULL, "limiter");
    FAILS(tollgate_limiter_peek_n(l, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    /* Freed through another type's function: refused, and the handle stays live. */
    FAILS(tollgate_keyed_free((tollgate_keyed *)(void *)l), TOLLGATE_ERROR_HANDLE, "another type");
    FAILS(tollgate_keyed_bytes_free((tollgate_keyed_bytes *)(void *)l), TOLLGATE_ERROR_HANDLE, "another type");
    OK(tollgate_limiter_check(l, &d));
    OK(tollgate_limiter_free(l));
    FAILS(tollgate_limiter_free(l), TOLLGATE_ERROR_HANDLE, "not a live handle");
    int on_stack;
    FAILS(tollgate_limiter_free((tollgate_limiter *)(void *)&on_stack), TOLLGATE_ERROR_HANDLE, "not made by tollgate");
    FAILS(tollgate_limiter_free(NULL), TOLLGATE_ERROR_NULL, "limiter");

    /* nginx with a delay: past it, requests wait instead of being refused. */
    tollgate_params p = {TOLLGATE_NGINX, 10, SECOND, 5, 1};
    OK(tollgate_limiter_new(&p, &l));
    int delayed = 0;
    for (int i = 0; i < 6; i++) {
        OK(tollgate_limiter_check_n_at(l, 1, 0, &d));
        if (d.outcome == TOLLGATE_DELAYED) {
            CHECK(d.allowed == 0 && d.delay_ns > 0);
            delayed++;
        }
    }
    CHECK(delayed == 4);
    OK(tollgate_limiter_check_n_at(l, 1, 0, &d));
    CHECK(d.outcome == TOLLGATE_DENIED);
    OK(tollgate_limiter_free(l));
}

static void keyed(void) {
    tollgate_keyed *t = NULL;
    tollgate_decision d;
    tollgate_params p = {TOLLGATE_TOKEN_BUCKET, 2, SECOND, 2, 0};
    OK(tollgate_keyed_new(&p, 1024, &t));
    OK(tollgate_keyed_check_n_at(t, 7, 1, 0, &d));
    OK(tollgate_keyed_check_n_at(t, 7, 1, 0, &d));
    CHECK(d.allowed && d.remaining == 0);
    OK(tollgate_keyed_check_n_at(t, 7, 1, 0, &d));
    CHECK(d.outcome == TOLLGATE_DENIED && d.retry_after_ns == SECOND / 2);
    OK(tollgate_keyed_check_n_at(t, 8, 1, 0, &d));
    CHECK(d.allowed); /* another key, its own limit */
    OK(tollgate_keyed_check_n_at(t, 7, 1, SECOND / 2, &d));
    CHECK(d.allowed && d.remaining == 0); /* a token back after 500 ms of the table's time */
    OK(tollgate_keyed_check(t, 9, &d));
    OK(tollgate_keyed_check_n(t, 9, 1, &d));
    tollgate_decision peeked;
    OK(tollgate_keyed_peek_n(t, 10, 1, &peeked));
    OK(tollgate_keyed_peek_n(t, 10, 1, &d));
    CHECK(d.allowed && d.remaining == peeked.remaining); /* a peek takes nothing */
    uint64_t len = 0;
    OK(tollgate_keyed_len(t, &len));
    CHECK(len == 3);
    uint64_t keys[40], costs[40];
    tollgate_decision out[40];
    for (int i = 0; i < 40; i++) {
        keys[i] = 1000 + i % 20;
        costs[i] = 1 + i % 2;
    }
    OK(tollgate_keyed_check_batch(t, keys, NULL, 40, out));
    for (int i = 0; i < 40; i++) CHECK(out[i].allowed == 1); /* two of each of 20 keys */
    OK(tollgate_keyed_check_batch(t, keys, costs, 40, out));
    for (int i = 0; i < 40; i++) CHECK(out[i].allowed == 0);
    OK(tollgate_keyed_check_batch(t, NULL, NULL, 0, NULL));
    FAILS(tollgate_keyed_check_batch(t, NULL, NULL, 3, out), TOLLGATE_ERROR_NULL, "keys");
    FAILS(tollgate_keyed_check_batch(NULL, keys, NULL, 3, out), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_check(NULL, 1, &d), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_check(t, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_check_n(NULL, 1, 1, &d), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_check_n_at(t, 1, 1, 0, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_peek_n(NULL, 1, 1, &d), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_check_batch(t, keys, NULL, 3, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_check_n(t, 1, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_check_n_at(NULL, 1, 1, 0, &d), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_peek_n(t, 1, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_len(t, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_len(NULL, &len), TOLLGATE_ERROR_NULL, "table");
    OK(tollgate_keyed_free(t));
    FAILS(tollgate_keyed_free(t), TOLLGATE_ERROR_HANDLE, "not a live handle");
    FAILS(tollgate_keyed_free(NULL), TOLLGATE_ERROR_NULL, "table");

    /* A full table refuses new keys; bad capacities and configurations are errors. */
    OK(tollgate_keyed_parse("fixed_window", "1/min", 64, &t));
    int full = 0;
    for (uint64_t k = 0; k < 10000; k++) {
        OK(tollgate_keyed_check_n_at(t, k, 1, 0, &d));
        full += d.outcome == TOLLGATE_TABLE_FULL;
    }
    CHECK(full > 0);
    OK(tollgate_keyed_free(t));
    FAILS(tollgate_keyed_new(&p, 0, &t), TOLLGATE_ERROR_INVALID, "capacity");
    CHECK(tollgate_keyed_new(&p, SIZE_MAX, &t) == TOLLGATE_ERROR_INVALID);
    FAILS(tollgate_keyed_new(NULL, 64, &t), TOLLGATE_ERROR_NULL, "params");
    FAILS(tollgate_keyed_new(&p, 64, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_parse("sliding_log", "0/s", 64, &t), TOLLGATE_ERROR_INVALID, "0/s");
    FAILS(tollgate_keyed_parse("sliding_log", "\xff", 64, &t), TOLLGATE_ERROR_UTF8, "not UTF-8");
    FAILS(tollgate_keyed_parse("\xff", "5/s", 64, &t), TOLLGATE_ERROR_UTF8, "algorithm is not UTF-8");
    FAILS(tollgate_keyed_parse(NULL, "5/s", 64, &t), TOLLGATE_ERROR_NULL, "algorithm");
    FAILS(tollgate_keyed_parse("sliding_log", NULL, 64, &t), TOLLGATE_ERROR_NULL, "config");
    FAILS(tollgate_keyed_parse("sliding_log", "5/s", 64, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_parse("leaky", "5/s", 64, &t), TOLLGATE_ERROR_INVALID, "unknown algorithm");
    FAILS(tollgate_keyed_parse("sliding_log", "5/s", 0, &t), TOLLGATE_ERROR_INVALID, "capacity");
    tollgate_params bad = {TOLLGATE_TOKEN_BUCKET, 0, SECOND, 2, 0};
    CHECK(tollgate_keyed_new(&bad, 64, &t) == TOLLGATE_ERROR_INVALID);
}

static void keyed_bytes(void) {
    tollgate_keyed_bytes *t = NULL;
    tollgate_decision d;
    tollgate_params p = {TOLLGATE_SLIDING_LOG, 2, SECOND, 0, 0};
    OK(tollgate_keyed_bytes_new(&p, 1024, &t));
    const char *alice = "alice", *bob = "bob\0with a NUL";
    OK(tollgate_keyed_bytes_check_n_at(t, (const uint8_t *)alice, 5, 1, 0, &d));
    OK(tollgate_keyed_bytes_check_n_at(t, (const uint8_t *)alice, 5, 1, 0, &d));
    CHECK(d.allowed);
    OK(tollgate_keyed_bytes_check_n_at(t, (const uint8_t *)alice, 5, 1, 0, &d));
    CHECK(!d.allowed && d.outcome == TOLLGATE_DENIED);
    OK(tollgate_keyed_bytes_check_n_at(t, (const uint8_t *)bob, 15, 2, 0, &d));
    CHECK(d.allowed);
    OK(tollgate_keyed_bytes_check_n_at(t, (const uint8_t *)bob, 3, 1, 0, &d));
    CHECK(d.allowed); /* "bob" is not "bob\0with a NUL" */
    OK(tollgate_keyed_bytes_check_n(t, NULL, 0, 1, &d)); /* the empty key */
    CHECK(d.allowed);
    OK(tollgate_keyed_bytes_peek_n(t, (const uint8_t *)"carol", 5, 1, &d));
    CHECK(d.allowed);
    OK(tollgate_keyed_bytes_check_n_at(t, (const uint8_t *)alice, 5, 1, SECOND, &d));
    CHECK(d.allowed); /* a second of the table's time later, the window has moved on */
    const uint8_t *keys[3] = {(const uint8_t *)"x", (const uint8_t *)"y", (const uint8_t *)"x"};
    size_t lens[3] = {1, 1, 1};
    uint64_t costs[3] = {2, 1, 1};
    tollgate_decision out[3];
    OK(tollgate_keyed_bytes_check_batch(t, keys, lens, costs, 3, out));
    CHECK(out[0].allowed && out[1].allowed && !out[2].allowed);
    OK(tollgate_keyed_bytes_check_batch(t, keys, lens, NULL, 3, out));
    OK(tollgate_keyed_bytes_check_batch(t, NULL, NULL, NULL, 0, NULL));
    const uint8_t *null_key[1] = {NULL};
    size_t one[1] = {4};
    FAILS(tollgate_keyed_bytes_check_batch(t, null_key, one, NULL, 1, out), TOLLGATE_ERROR_NULL, "keys[0]");
    /* An error in any key takes nothing from the keys before it. */
    const uint8_t *fresh_then_null[2] = {(const uint8_t *)"zed", NULL};
    size_t fresh_lens[2] = {3, 1};
    FAILS(tollgate_keyed_bytes_check_batch(t, fresh_then_null, fresh_lens, NULL, 2, out), TOLLGATE_ERROR_NULL,
          "keys[1]");
    OK(tollgate_keyed_bytes_peek_n(t, (const uint8_t *)"zed", 3, 0, &d));
    CHECK(d.remaining == 2);
    FAILS(tollgate_keyed_bytes_check_batch(t, NULL, lens, NULL, 3, out), TOLLGATE_ERROR_NULL, "keys");
    FAILS(tollgate_keyed_bytes_check_batch(t, keys, lens, NULL, 3, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_bytes_check_batch(t, keys, NULL, NULL, 3, out), TOLLGATE_ERROR_NULL, "lens");
    FAILS(tollgate_keyed_bytes_check_batch(NULL, keys, lens, NULL, 3, out), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_bytes_check_n(t, NULL, 3, 1, &d), TOLLGATE_ERROR_NULL, "key");
    FAILS(tollgate_keyed_bytes_check_n(NULL, NULL, 0, 1, &d), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_bytes_check_n(t, NULL, 0, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_bytes_check_n_at(t, NULL, 1, 1, 0, &d), TOLLGATE_ERROR_NULL, "key");
    FAILS(tollgate_keyed_bytes_check_n_at(NULL, NULL, 0, 1, 0, &d), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_bytes_check_n_at(t, NULL, 0, 1, 0, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_bytes_peek_n(t, NULL, 2, 1, &d), TOLLGATE_ERROR_NULL, "key");
    FAILS(tollgate_keyed_bytes_peek_n(t, NULL, 0, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_bytes_peek_n(NULL, NULL, 0, 1, &d), TOLLGATE_ERROR_NULL, "table");
    OK(tollgate_keyed_bytes_free(t));
    FAILS(tollgate_keyed_bytes_free(t), TOLLGATE_ERROR_HANDLE, "not a live handle");
    FAILS(tollgate_keyed_bytes_free(NULL), TOLLGATE_ERROR_NULL, "table");

    OK(tollgate_keyed_bytes_parse("nginx", "10r/s burst=3 nodelay", 64, &t));
    OK(tollgate_keyed_bytes_free(t));
    FAILS(tollgate_keyed_bytes_parse(NULL, "5/s", 64, &t), TOLLGATE_ERROR_NULL, "algorithm");
    FAILS(tollgate_keyed_bytes_new(NULL, 64, &t), TOLLGATE_ERROR_NULL, "params");
    FAILS(tollgate_keyed_bytes_new(&p, 0, &t), TOLLGATE_ERROR_INVALID, "capacity");
    FAILS(tollgate_keyed_bytes_new(&p, 64, NULL), TOLLGATE_ERROR_NULL, "out");
    tollgate_params bad = {TOLLGATE_SLIDING_LOG, 0, SECOND, 0, 0};
    CHECK(tollgate_keyed_bytes_new(&bad, 64, &t) == TOLLGATE_ERROR_INVALID);
    FAILS(tollgate_keyed_bytes_parse("nginx", NULL, 64, &t), TOLLGATE_ERROR_NULL, "config");
    FAILS(tollgate_keyed_bytes_parse("nginx", "10r/s", 64, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_bytes_parse("nginx", "ten", 64, &t), TOLLGATE_ERROR_INVALID, "ten");
    FAILS(tollgate_keyed_bytes_parse("nginx", "\xc3", 64, &t), TOLLGATE_ERROR_UTF8, "not UTF-8");
    FAILS(tollgate_keyed_bytes_parse("nginx", "10r/s", 0, &t), TOLLGATE_ERROR_INVALID, "capacity");
}

/* The hot path (_try: the outcome returned, the one wait written) and the handles' clocks
 * (_now: the _at functions' time base). */
static void hot_path_and_clocks(void) {
    const uint64_t HOUR = 3600 * SECOND;
    tollgate_limiter *l = NULL;
    tollgate_decision d;
    uint64_t wait = 42, now = 0, later = 0;
    OK(tollgate_limiter_parse("token_bucket", "1/h", &l));
    CHECK(tollgate_limiter_try_n(l, 1, &wait) == TOLLGATE_ALLOWED && wait == 0);
    CHECK(tollgate_limiter_try_n(l, 1, &wait) == TOLLGATE_DENIED);
    CHECK(wait > HOUR - 60 * SECOND && wait <= HOUR); /* the retry-after, as check gives it */
    CHECK(tollgate_limiter_try_n(l, 1, NULL) == TOLLGATE_DENIED); /* the wait is optional */
    CHECK(tollgate_limiter_try_n(l, 2, &wait) == TOLLGATE_INSUFFICIENT && wait == UINT64_MAX);
    /* Errors are minus a status, and take nothing. */
    CHECK(tollgate_limiter_try_n(NULL, 1, &wait) == -TOLLGATE_ERROR_NULL);
    CHECK(strstr(tollgate_last_error(), "limiter") != NULL);
    uint64_t words[2] = {0, 0};
    tollgate_limiter *fresh = NULL;
    OK(tollgate_limiter_parse("token_bucket", "1/h", &fresh));
    CHECK(tollgate_limiter_try_n(fresh, 1, (uint64_t *)(void *)((char *)words + 1)) == -TOLLGATE_ERROR_INVALID);
    CHECK(strstr(tollgate_last_error(), "wait_ns") != NULL && strstr(tollgate_last_error(), "aligned") != NULL);
    FAILS(tollgate_limiter_check_n(fresh, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_limiter_check_n_at(fresh, 1, 0, NULL), TOLLGATE_ERROR_NULL, "out");
    CHECK(tollgate_limiter_try(fresh, (uint64_t *)(void *)((char *)words + 1)) == -TOLLGATE_ERROR_INVALID);
    CHECK(tollgate_limiter_try(NULL, &wait) == -TOLLGATE_ERROR_NULL);
    CHECK(tollgate_limiter_try(fresh, &wait) == TOLLGATE_ALLOWED && wait == 0); /* its token was still there */
    CHECK(tollgate_limiter_try(fresh, &wait) == TOLLGATE_DENIED && wait > HOUR - 60 * SECOND && wait <= HOUR);
    CHECK(tollgate_limiter_try(fresh, NULL) == TOLLGATE_DENIED);
    OK(tollgate_limiter_free(fresh));
    /* The clock: nanoseconds since creation, never backwards, the same time base as _at. */
    OK(tollgate_limiter_now(l, &now));
    OK(tollgate_limiter_now(l, &later));
    CHECK(later >= now);
    OK(tollgate_limiter_check_n_at(l, 1, later, &d));
    CHECK(d.outcome == TOLLGATE_DENIED && d.retry_after_ns <= HOUR && d.retry_after_ns > HOUR - 60 * SECOND);
    FAILS(tollgate_limiter_now(NULL, &now), TOLLGATE_ERROR_NULL, "limiter");
    FAILS(tollgate_limiter_now(l, NULL), TOLLGATE_ERROR_NULL, "out");
    OK(tollgate_limiter_free(l));
    /* nginx with a delay: the wait of a delayed request is its delay (a rate slow enough that
     * the three calls land in one slot, even under valgrind on a busy machine). */
    OK(tollgate_limiter_parse("nginx", "1r/m burst=5 delay=1", &l));
    int delayed = 0;
    for (int i = 0; i < 3; i++) {
        int o = tollgate_limiter_try_n(l, 1, &wait);
        CHECK(o == TOLLGATE_ALLOWED || o == TOLLGATE_DELAYED);
        if (o == TOLLGATE_DELAYED) {
            CHECK(wait > 0 && wait <= 5 * 60 * SECOND); /* within the burst of 5 at 1 per minute */
            delayed++;
        } else {
            CHECK(wait == 0);
        }
    }
    CHECK(delayed >= 1);
    OK(tollgate_limiter_free(l));

    tollgate_keyed *t = NULL;
    OK(tollgate_keyed_parse("token_bucket", "1/h", 64, &t));
    CHECK(tollgate_keyed_try_n(t, 5, 1, &wait) == TOLLGATE_ALLOWED && wait == 0);
    CHECK(tollgate_keyed_try_n(t, 5, 1, &wait) == TOLLGATE_DENIED && wait > HOUR - 60 * SECOND && wait <= HOUR);
    CHECK(tollgate_keyed_try_n(t, 6, 1, NULL) == TOLLGATE_ALLOWED); /* another key */
    CHECK(tollgate_keyed_try_n(NULL, 5, 1, &wait) == -TOLLGATE_ERROR_NULL);
    CHECK(tollgate_keyed_try_n(t, 7, 1, (uint64_t *)(void *)((char *)words + 1)) == -TOLLGATE_ERROR_INVALID);
    FAILS(tollgate_keyed_check_n(t, 7, 1, NULL), TOLLGATE_ERROR_NULL, "out");
    FAILS(tollgate_keyed_check_n_at(t, 7, 1, 0, NULL), TOLLGATE_ERROR_NULL, "out");
    CHECK(tollgate_keyed_try(t, 7, (uint64_t *)(void *)((char *)words + 1)) == -TOLLGATE_ERROR_INVALID);
    CHECK(tollgate_keyed_try(NULL, 7, &wait) == -TOLLGATE_ERROR_NULL);
    CHECK(tollgate_keyed_try(t, 7, &wait) == TOLLGATE_ALLOWED && wait == 0); /* key 7 was not charged */
    CHECK(tollgate_keyed_try(t, 7, &wait) == TOLLGATE_DENIED && wait > HOUR - 60 * SECOND && wait <= HOUR);
    CHECK(tollgate_keyed_try(t, 8, NULL) == TOLLGATE_ALLOWED);
    OK(tollgate_keyed_now(t, &now));
    OK(tollgate_keyed_check_n_at(t, 5, 1, now, &d));
    CHECK(d.outcome == TOLLGATE_DENIED);
    FAILS(tollgate_keyed_now(NULL, &now), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_now(t, NULL), TOLLGATE_ERROR_NULL, "out");
    OK(tollgate_keyed_free(t));

    tollgate_keyed_bytes *b = NULL;
    OK(tollgate_keyed_bytes_parse("token_bucket", "2/h", 64, &b));
    OK(tollgate_keyed_bytes_check(b, (const uint8_t *)"dave", 4, &d));
    CHECK(d.allowed && d.remaining == 1);
    CHECK(tollgate_keyed_bytes_try_n(b, (const uint8_t *)"dave", 4, 1, &wait) == TOLLGATE_ALLOWED && wait == 0);
    CHECK(tollgate_keyed_bytes_try_n(b, (const uint8_t *)"dave", 4, 1, &wait) == TOLLGATE_DENIED && wait > 0);
    CHECK(tollgate_keyed_bytes_try_n(b, (const uint8_t *)"dave", 4, 3, &wait) == TOLLGATE_INSUFFICIENT &&
          wait == UINT64_MAX);
    CHECK(tollgate_keyed_bytes_try_n(b, NULL, 0, 1, NULL) == TOLLGATE_ALLOWED); /* the empty key */
    CHECK(tollgate_keyed_bytes_try_n(b, NULL, 3, 1, &wait) == -TOLLGATE_ERROR_NULL);
    CHECK(strstr(tollgate_last_error(), "key") != NULL);
    CHECK(tollgate_keyed_bytes_try_n(NULL, NULL, 0, 1, &wait) == -TOLLGATE_ERROR_NULL);
    CHECK(tollgate_keyed_bytes_try_n(b, (const uint8_t *)"erin", 4, 1, (uint64_t *)(void *)((char *)words + 1)) ==
          -TOLLGATE_ERROR_INVALID);
    CHECK(tollgate_keyed_bytes_try(b, (const uint8_t *)"erin", 4, (uint64_t *)(void *)((char *)words + 1)) ==
          -TOLLGATE_ERROR_INVALID);
    CHECK(tollgate_keyed_bytes_try(NULL, (const uint8_t *)"erin", 4, &wait) == -TOLLGATE_ERROR_NULL);
    CHECK(tollgate_keyed_bytes_try(b, NULL, 4, &wait) == -TOLLGATE_ERROR_NULL);
    OK(tollgate_keyed_bytes_peek_n(b, (const uint8_t *)"erin", 4, 0, &d));
    CHECK(d.remaining == 2); /* "erin" was not charged */
    CHECK(tollgate_keyed_bytes_try(b, (const uint8_t *)"fred", 4, &wait) == TOLLGATE_ALLOWED && wait == 0);
    CHECK(tollgate_keyed_bytes_try(b, (const uint8_t *)"fred", 4, NULL) == TOLLGATE_ALLOWED);
    CHECK(tollgate_keyed_bytes_try(b, (const uint8_t *)"fred", 4, &wait) == TOLLGATE_DENIED && wait > 0);
    FAILS(tollgate_keyed_bytes_check(NULL, NULL, 0, &d), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_bytes_check(b, NULL, 1, &d), TOLLGATE_ERROR_NULL, "key");
    FAILS(tollgate_keyed_bytes_check(b, (const uint8_t *)"erin", 4, NULL), TOLLGATE_ERROR_NULL, "out");
    OK(tollgate_keyed_bytes_peek_n(b, (const uint8_t *)"erin", 4, 0, &d));
    CHECK(d.remaining == 2); /* a bad out-pointer takes nothing either */
    OK(tollgate_keyed_bytes_now(b, &now));
    OK(tollgate_keyed_bytes_check_n_at(b, (const uint8_t *)"dave", 4, 1, now, &d));
    CHECK(d.outcome == TOLLGATE_DENIED);
    FAILS(tollgate_keyed_bytes_now(NULL, &now), TOLLGATE_ERROR_NULL, "table");
    FAILS(tollgate_keyed_bytes_now(b, NULL), TOLLGATE_ERROR_NULL, "out");
    OK(tollgate_keyed_bytes_free(b));
}

/* One handle, four threads, no lock: at a frozen instant exactly the burst is admitted. */
struct shared {
    tollgate_limiter *l;
    tollgate_keyed *t;
    uint64_t admitted;
    pthread_mutex_t lock;
};

static void *hammer(void *arg) {
    struct shared *s = arg;
    uint64_t mine = 0;
    tollgate_decision d;
    for (int i = 0; i < 20000; i++) {
        if (tollgate_limiter_check_n_at(s->l, 1, 0, &d) != TOLLGATE_OK) abort();
        mine += d.allowed;
        if (tollgate_keyed_check_n_at(s->t, (uint64_t)i % 8, 1, 0, &d) != TOLLGATE_OK) abort();
        mine += d.allowed;
    }
    pthread_mutex_lock(&s->lock);
    s->admitted += mine;
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void threads(void) {
    struct shared s = {NULL, NULL, 0, PTHREAD_MUTEX_INITIALIZER};
    OK(tollgate_limiter_parse("token_bucket", "10/s burst=1000", &s.l));
    OK(tollgate_keyed_parse("token_bucket", "10/s burst=100", 64, &s.t));
    pthread_t th[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, hammer, &s) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(th[i], NULL) == 0);
    CHECK(s.admitted == 1000 + 8 * 100);
    OK(tollgate_limiter_free(s.l));
    OK(tollgate_keyed_free(s.t));
}

int main(void) {
    statuses();
    constructors();
    direct();
    keyed();
    keyed_bytes();
    hot_path_and_clocks();
    threads();
    meters();
    printf("C ABI: %d checks passed\n", checks);
    return 0;
}
