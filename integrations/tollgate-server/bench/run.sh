#!/usr/bin/env bash
# CL.THROTTLE on tollgate-server against the classic Lua token bucket on a redis-server, both
# started here on free ports of 127.0.0.1, both driven by redis-benchmark with 50 clients, with
# and without 16-deep pipelines, on 1 key and on 1M keys; then each server's memory.
#
#     bash integrations/tollgate-server/bench/run.sh          # N=1000000 requests per row
#     N=100000 bash integrations/tollgate-server/bench/run.sh # a quick run
set -euo pipefail
cd "$(dirname "$0")/../../.."
N="${N:-1000000}"
for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install redis-server redis-tools" >&2; exit 1; }
done
cargo build -q --release -p tollgate-server

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
scratch="$(mktemp -d)"
tport="$(free_port)"
rport="$(free_port)"
./target/release/tollgate-server --port "$tport" --capacity 1048576 >"$scratch/server.out" &
tpid=$!
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$scratch" >/dev/null &
rpid=$!
trap 'kill $tpid $rpid 2>/dev/null; wait 2>/dev/null; rm -rf "$scratch"' EXIT
for port in "$tport" "$rport"; do
    for _ in $(seq 100); do
        [[ "$(redis-cli -p "$port" PING 2>/dev/null)" == PONG ]] && break
        sleep 0.05
    done
done
sha="$(redis-cli -p "$rport" SCRIPT LOAD "$(cat tollgate-bench/src/classic_bucket.lua)")"
now="$(date +%s)"

# requests per second of one redis-benchmark row
rps() { redis-benchmark -h 127.0.0.1 -p "$1" -c 50 -n "$N" $2 -r 1000000 -q "${@:3}" 2>/dev/null \
    | tr '\r' '\n' | grep 'requests per second' | tail -1 | sed -E 's/.*: ([0-9.]+) requests per second.*/\1/'; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; commit $(git rev-parse --short HEAD); N=$N"
echo
echo "| keys | pipeline | tollgate-server CL.THROTTLE (req/s) | redis-server + classic Lua (req/s) | ratio |"
echo "|---|---:|---:|---:|---:|"
# The floor: PING, no decision at all, on each server (what redis-benchmark and the sockets
# allow on this machine).
for pipeline in 1 16; do
    t="$(rps "$tport" "-P $pipeline" PING)"
    l="$(rps "$rport" "-P $pipeline" PING)"
    ratio="$(python3 -c "print(f'{$t / $l:.2f}×')")"
    echo "| PING (floor) | $pipeline | $t | $l | $ratio |"
done
for keys in 1 1M; do
    if [[ "$keys" == 1 ]]; then key=one; else key="k:__rand_int__"; fi
    for pipeline in 1 16; do
        t="$(rps "$tport" "-P $pipeline" CL.THROTTLE "$key" 100 1000000 1)"
        l="$(rps "$rport" "-P $pipeline" EVALSHA "$sha" 1 "$key" 101 1000000 "$now" 1)"
        ratio="$(python3 -c "print(f'{$t / $l:.2f}×')")"
        echo "| $keys | $pipeline | $t | $l | $ratio |"
    done
done
echo
tkeys="$(redis-cli -p "$tport" INFO | tr -d '\r' | sed -n 's/^keys://p')"
tcap="$(redis-cli -p "$tport" INFO | tr -d '\r' | sed -n 's/^keys_capacity://p')"
trss="$(ps -o rss= -p "$tpid" | tr -d ' ')"
rkeys="$(redis-cli -p "$rport" DBSIZE)"
rmem="$(redis-cli -p "$rport" INFO memory | tr -d '\r' | sed -n 's/^used_memory_rss://p')"
echo "tollgate-server: $tkeys keys (capacity $tcap), RSS $((trss / 1024)) MiB"
echo "redis-server + classic Lua: $rkeys keys, RSS $((rmem / 1048576)) MiB"
