#!/usr/bin/env bash
# The module inside redis-server against what a write costs there (SET), against redis-cell's
# CL.THROTTLE (built here from its published crate) and against the classic Lua bucket
# (EVALSHA): redis-benchmark, 50 clients, with and without 16-deep pipelines, on 1 key and on
# 1M keys; then memory per key at about 1M keys (INFO memory). SET with an expiry (PX) is a
# second floor: a write that keeps its key's TTL, as the module's commands do. Two servers, started here on
# free ports of 127.0.0.1: one with tollgate's module, one with redis-cell's (both answer
# CL.THROTTLE); SET and the Lua bucket run on the first.
#
#     bash integrations/tollgate-redis-module/bench/run.sh          # N=1000000 requests per row
#     N=100000 bash integrations/tollgate-redis-module/bench/run.sh # a quick run
set -euo pipefail
cd "$(dirname "$0")/../../.."
N="${N:-1000000}"
for tool in redis-server redis-cli redis-benchmark python3; do
    command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install redis-server redis-tools python3" >&2; exit 1; }
done
cargo build -q --release -p tollgate-redis-module
module="$PWD/target/release/libtollgate_redis_module.so"

scratch="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$scratch"' EXIT

# redis-cell from its published crate: fetched through cargo's own registry, built in place.
cell=""
mkdir -p "$scratch/fetch/src"
cat >"$scratch/fetch/Cargo.toml" <<'EOF'
[package]
name = "fetch-redis-cell"
version = "0.0.0"
edition = "2021"
[dependencies]
redis-cell = "=0.2.2"
EOF
touch "$scratch/fetch/src/lib.rs"
if cargo fetch -q --manifest-path "$scratch/fetch/Cargo.toml" 2>"$scratch/fetch.err"; then
    src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/redis-cell-0.2.2 2>/dev/null | head -1)"
    if [[ -n "$src" ]]; then
        cp -r "$src" "$scratch/redis-cell"
        if (cd "$scratch/redis-cell" && cargo build -q --release 2>"$scratch/cell.err"); then
            cell="$(ls "$scratch"/redis-cell/target/release/libredis_cell.so 2>/dev/null | head -1)"
        fi
    fi
fi
[[ -n "$cell" ]] || echo "redis-cell could not be built here: $(tail -3 "$scratch"/*.err 2>/dev/null | tr '\n' ' ')" >&2

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start() { # port module dir
    redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no --dir "$3" --loadmodule "$2" >/dev/null &
    pids+=($!)
    for _ in $(seq 100); do
        [[ "$(redis-cli -p "$1" PING 2>/dev/null)" == PONG ]] && return 0
        sleep 0.05
    done
    echo "redis-server with $2 did not start" >&2
    exit 1
}
tport="$(free_port)"
mkdir -p "$scratch/t" "$scratch/c"
start "$tport" "$module" "$scratch/t"
cport=""
if [[ -n "$cell" ]]; then
    cport="$(free_port)"
    start "$cport" "$cell" "$scratch/c"
fi
sha="$(redis-cli -p "$tport" SCRIPT LOAD "$(cat tollgate-bench/src/classic_bucket.lua)")"
now="$(date +%s)"

# requests per second of one redis-benchmark row
rps() { redis-benchmark -h 127.0.0.1 -p "$1" -c 50 -n "$N" $2 -r 1000000 -q "${@:3}" 2>/dev/null \
    | tr '\r' '\n' | grep 'requests per second' | tail -1 | sed -E 's/.*: ([0-9.]+) requests per second.*/\1/'; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}×')"; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; commit $(git rev-parse --short HEAD); $(redis-server --version | grep -o 'v=[0-9.]*'); N=$N"
echo
echo "| keys | pipeline | SET | SET PX | tollgate CL.THROTTLE | ×SET | ×SET PX | tollgate TG.CHECK | ×SET | redis-cell CL.THROTTLE | ×its SET | tollgate ÷ redis-cell | Lua bucket (EVALSHA) | ×SET |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
# The limits admit every request, so that each one writes its key, as SET does: on 1 key,
# 1,000,000 a second (a burst of 101); on 1M keys, 1 a minute (a burst of 101), so that each
# key lives on between its visits (a few seconds apart), as a per-client limit keeps its
# clients' state, rather than expiring and being created again each time.
for keys in 1 1M; do
    if [[ "$keys" == 1 ]]; then
        key=one throttle=(100 1000000 1) spec="1000000/s burst=101" lua=(101 1000000)
    else
        key="k:__rand_int__" throttle=(100 1 60) spec="1/min burst=101" lua=(101 0.0166667)
    fi
    for pipeline in 1 16; do
        redis-cli -p "$tport" FLUSHALL >/dev/null
        set="$(rps "$tport" "-P $pipeline" SET "$key" v)"
        redis-cli -p "$tport" FLUSHALL >/dev/null
        setpx="$(rps "$tport" "-P $pipeline" SET "$key" v PX 3600000)"
        redis-cli -p "$tport" FLUSHALL >/dev/null
        t="$(rps "$tport" "-P $pipeline" CL.THROTTLE "$key" "${throttle[@]}")"
        redis-cli -p "$tport" FLUSHALL >/dev/null
        g="$(rps "$tport" "-P $pipeline" TG.CHECK "$key" "$spec")"
        redis-cli -p "$tport" FLUSHALL >/dev/null
        l="$(rps "$tport" "-P $pipeline" EVALSHA "$sha" 1 "$key" "${lua[@]}" "$now" 1)"
        if [[ -n "$cport" ]]; then
            redis-cli -p "$cport" FLUSHALL >/dev/null
            cset="$(rps "$cport" "-P $pipeline" SET "$key" v)"
            redis-cli -p "$cport" FLUSHALL >/dev/null
            c="$(rps "$cport" "-P $pipeline" CL.THROTTLE "$key" "${throttle[@]}")"
            cells="$c | $(ratio "$c" "$cset") | $(ratio "$t" "$c")"
        else
            cells="— | — | —"
        fi
        echo "| $keys | $pipeline | $set | $setpx | $t | $(ratio "$t" "$set") | $(ratio "$t" "$setpx") | $g | $(ratio "$g" "$set") | $cells | $l | $(ratio "$l" "$set") |"
    done
done

# Memory per key: each subject alone on an empty server, 1M random keys touched 3M times
# (about 950,000 distinct), INFO memory's used_memory before and after over DBSIZE. Limits
# that keep every key for the run (1 a minute).
echo
echo "| memory per key (≈1M keys) | keys | bytes/key |"
echo "|---|---:|---:|"
per_key() { # port label command...
    redis-cli -p "$1" FLUSHALL >/dev/null
    local before after n
    before="$(redis-cli -p "$1" INFO memory | tr -d '\r' | sed -n 's/^used_memory://p')"
    redis-benchmark -h 127.0.0.1 -p "$1" -c 50 -n $((3 * N)) -P 16 -r 1000000 -q "${@:3}" >/dev/null 2>&1
    after="$(redis-cli -p "$1" INFO memory | tr -d '\r' | sed -n 's/^used_memory://p')"
    n="$(redis-cli -p "$1" DBSIZE)"
    echo "| $2 | $n | $(python3 -c "print(f'{($after - $before) / max($n, 1):.1f}')") |"
}
per_key "$tport" "SET (3-byte value)" SET "k:__rand_int__" xyz
per_key "$tport" "tollgate CL.THROTTLE" CL.THROTTLE "k:__rand_int__" 10 1 60
per_key "$tport" "tollgate TG.CHECK" TG.CHECK "k:__rand_int__" "1/min burst=11"
[[ -n "$cport" ]] && per_key "$cport" "redis-cell CL.THROTTLE" CL.THROTTLE "k:__rand_int__" 10 1 60
per_key "$tport" "Lua bucket" EVALSHA "$sha" 1 "k:__rand_int__" 11 0.0166667 "$now" 1
