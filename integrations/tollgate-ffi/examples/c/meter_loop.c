/* A packet pipeline's poll loop metering per flow with tollgate, as a DPDK or VPP application
 * would: one flow table per core (flows pinned to cores by RSS), one call per burst of 32
 * packets with one clock reading, and a table from colour to action (pass, re-mark, drop).
 *
 * The packets here are synthetic (a real loop gets them from rte_eth_rx_burst, its flow keys
 * from the 5-tuple's hash, its lengths from the IP header): 1 Gbit/s over 64 flows, half of it
 * one flow's (500 Mbit/s, far above its 20 Mbit/s peak), the rest 8 Mbit/s a flow (within
 * its 10 Mbit/s committed rate). A real loop passes TOLLGATE_NOW, one clock reading for the
 * burst; these packets carry their own arrival times, as a capture's do. Build and run:
 *
 *     cc -std=c11 -O2 meter_loop.c $(pkg-config --cflags --libs tollgate) -o meter_loop
 *     ./meter_loop
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate.h"

#define BURST 32
#define FLOWS 64

enum action { PASS, REMARK, DROP };

/* What each colour does: green passes, yellow is re-marked to a lower class, red is dropped. */
static const enum action ACTIONS[3] = {
    [TOLLGATE_GREEN] = PASS,
    [TOLLGATE_YELLOW] = REMARK,
    [TOLLGATE_RED] = DROP,
};

static int fail(const char *what, tollgate_status s) {
    fprintf(stderr, "%s: %s: %s\n", what, tollgate_status_name(s), tollgate_last_error());
    return 1;
}

int main(void) {
    tollgate_flow_meters *flows = NULL;
    /* RFC 2698: 10 Mbit/s committed, 20 Mbit/s peak, 16 KiB and 32 KiB buckets per flow. */
    tollgate_status s = tollgate_flow_meters_parse("trtcm cir=10Mbit/s cbs=16KiB pir=20Mbit/s pbs=32KiB", 1 << 16, &flows);
    if (s != TOLLGATE_OK) return fail("tollgate_flow_meters_parse", s);

    uint64_t keys[BURST];
    uint32_t lens[BURST];
    uint8_t colors[BURST];
    uint64_t counts[3] = {0, 0, 0}, heavy[3] = {0, 0, 0};
    uint64_t x = 88172645463325252ull;
    uint64_t now_ns = 0; /* the burst's arrival, in ns since the table's creation */
    for (int burst = 0; burst < 20000; burst++) {
        uint64_t bits = 0;
        for (int i = 0; i < BURST; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            /* Half the packets are flow 0's, the rest spread over the other flows. */
            keys[i] = (x & 1) ? 0 : 1 + (x >> 1) % (FLOWS - 1);
            lens[i] = 64 + (uint32_t)((x >> 8) % 1437);
            bits += 8 * (uint64_t)lens[i];
        }
        /* Colour-blind (no input colours). A live loop passes TOLLGATE_NOW here. */
        s = tollgate_flow_meters_color_burst(flows, now_ns, keys, lens, NULL, colors, BURST);
        now_ns += bits; /* at 1 Gbit/s, one bit a nanosecond */
        if (s != TOLLGATE_OK) return fail("tollgate_flow_meters_color_burst", s);
        for (int i = 0; i < BURST; i++) {
            switch (ACTIONS[colors[i]]) {
            case PASS: break;                  /* transmit as is */
            case REMARK: break;                /* set a lower DSCP, then transmit */
            case DROP: break;                  /* free the mbuf */
            }
            counts[colors[i]]++;
            if (keys[i] == 0) heavy[colors[i]]++;
        }
    }
    uint64_t held = 0, full = 0;
    s = tollgate_flow_meters_stats(flows, &held, &full);
    if (s != TOLLGATE_OK) return fail("tollgate_flow_meters_stats", s);
    printf("%" PRIu64 " green, %" PRIu64 " yellow, %" PRIu64 " red (the heavy flow: %" PRIu64 " / %" PRIu64
           " / %" PRIu64 "); %" PRIu64 " flows, %" PRIu64 " packets of flows without room\n",
           counts[0], counts[1], counts[2], heavy[0], heavy[1], heavy[2], held, full);
    s = tollgate_flow_meters_free(flows);
    if (s != TOLLGATE_OK) return fail("tollgate_flow_meters_free", s);
    return 0;
}
