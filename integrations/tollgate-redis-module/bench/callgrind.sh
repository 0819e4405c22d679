#!/usr/bin/env bash
# Instructions per command inside redis-server, counted by callgrind (stable where wall time on
# a shared machine is not): for each command, a fresh redis-server with tollgate's module runs
# under callgrind, takes N pipelined requests (16 deep, random keys among 1,000) from
# redis-benchmark, and is shut down; the server's whole count (reading, parsing, the command,
# replying) minus an idle server's, over N. The same for SET, the floor, and for SET with an
# expiry (PX), what a write that keeps its key's TTL, as the module's do, costs in Redis. The limits (1 a
# minute, a burst of 101) admit every request and keep every key, as SET's keys are kept:
# each request updates a live key.
#
#     bash integrations/tollgate-redis-module/bench/callgrind.sh          # N=20000
#     N=5000 KEEP=/tmp/cg bash integrations/tollgate-redis-module/bench/callgrind.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
N="${N:-20000}"
for tool in valgrind callgrind_annotate redis-server redis-cli redis-benchmark python3; do
    command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install valgrind redis-server redis-tools python3" >&2; exit 1; }
done
cargo build -q --release -p tollgate-redis-module
module="$PWD/target/release/libtollgate_redis_module.so"
scratch="$(mktemp -d)"
pid=""
# KEEP=dir keeps each run's callgrind output there, for callgrind_annotate.
trap '[[ -n "$pid" ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; [[ -n "${KEEP:-}" ]] && mkdir -p "$KEEP" && cp "$scratch"/*.out "$KEEP"/; rm -rf "$scratch"' EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Total instructions of one server run: `count label n command...`
count() {
    local label="$1" n="$2" port out
    shift 2
    port="$(free_port)"
    out="$scratch/$label.out"
    valgrind --tool=callgrind --callgrind-out-file="$out" \
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$scratch" \
        --loadmodule "$module" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [[ "$(redis-cli -p "$port" PING 2>/dev/null)" == PONG ]] && break
        sleep 0.1
    done
    # The module asks INFO once a second whether anything consumes replication (none here):
    # the count is of the steady state after that.
    sleep 3
    if ((n > 0)); then
        redis-benchmark -h 127.0.0.1 -p "$port" -c 50 -n "$n" -P 16 -r 1000 -q "$@" >/dev/null 2>&1
    fi
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$pid" 2>/dev/null || true
    pid=""
    callgrind_annotate "$out" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}

idle="$(count idle 0)"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); commit $(git rev-parse --short HEAD); $(redis-server --version | grep -o 'v=[0-9.]*'); N=$N, 50 clients, -P 16, 1,000 keys"
echo
echo "| command | instructions per request (whole server) | ×SET |"
echo "|---|---:|---:|"
per() { python3 -c "print(round(($1 - $idle) / $N))"; }
set_ir="$(per "$(count set "$N" SET 'k:__rand_int__' v)")"
echo "| SET | $set_ir | 1.00× |"
for row in "SET PX|SET k:__rand_int__ v PX 3600000" "CL.THROTTLE|CL.THROTTLE k:__rand_int__ 100 1 60" "TG.CHECK|TG.CHECK k:__rand_int__ 1/min__burst=101"; do
    label="${row%%|*}"
    label="${label// /_}"
    read -r -a cmd <<<"${row#*|}"
    cmd=("${cmd[@]//__burst/ burst}")
    ir="$(per "$(count "$label" "$N" "${cmd[@]}")")"
    echo "| ${label//_/ } | $ir | $(python3 -c "print(f'{$ir / $set_ir:.2f}×')") |"
done
