#!/usr/bin/env bash
# The C ABI's cost per decision next to the Rust call's, in one run on this machine: the same
# loops through the shared library from C (bench/abi.c, cc -O2) and through the Rust API
# (examples/abi_bench.rs), taking turns. Prints both and the ratio of their best rounds, each
# C call against the Rust call that hands the caller the same answer.
#
#     bash integrations/tollgate-ffi/bench/run.sh          # ROUNDS=3 turns of 3 rounds each
#     CALLGRIND=1 bash integrations/tollgate-ffi/bench/run.sh   # and instructions per call
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
bash integrations/tollgate-ffi/install.sh "$scratch/prefix" >/dev/null
cc -O2 -std=c11 -I"$scratch/prefix/include" "$here/abi.c" -L"$scratch/prefix/lib" -ltollgate_ffi -o "$scratch/abi"
cargo build -q --release -p tollgate-ffi --example abi_bench
target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
# C and Rust take turns (ROUNDS times, three rounds each), so that a noisy neighbour hits both.
for round in $(seq "${ROUNDS:-3}"); do
    echo "-- round $round: C, through the ABI (shared library)"
    LD_LIBRARY_PATH="$scratch/prefix/lib" "$scratch/abi" | tee -a "$scratch/c.txt"
    echo "-- round $round: Rust"
    "$target/release/examples/abi_bench" | tee -a "$scratch/rust.txt"
done
python3 - "$scratch/c.txt" "$scratch/rust.txt" <<'PY'
import re, sys
def best(path):
    b = {}
    for line in open(path):
        m = re.match(r"(.*?)\s+([0-9.]+) ns/decision", line)
        name, ns = m.group(1), float(m.group(2))
        b[name] = min(ns, b.get(name, ns))
    return b
c, r = best(sys.argv[1]), best(sys.argv[2])
# Each C call against the Rust call that gives the caller the same answer: every field of the
# decision struct for the check functions, the outcome and the one wait for the _try functions.
pairs = [
    ("direct check, allow", "direct check, allow, fields"),
    ("direct check, deny", "direct check, deny, fields"),
    ("keyed 1K check_n_at, deny", "keyed 1K check_n_at, deny, fields"),
    ("direct try, allow", "direct try, allow"),
    ("direct try, deny", "direct try, deny"),
    ("keyed 1K try, deny", "keyed 1K try, deny"),
]
print("-- best rounds: the C call / the Rust call giving the same answer (and / Rust reading only whether it was allowed)")
for cn, rn in pairs:
    plain = rn.replace(", fields", "").replace("try", "check")
    line = f"{cn:<28} {c[cn]:7.2f} / {r[rn]:7.2f} ns = {c[cn] / r[rn]:.2f}x"
    if plain in r:
        line += f"   (/ {r[plain]:7.2f} ns = {c[cn] / r[plain]:.2f}x)"
    print(line)
PY
if [[ "${CALLGRIND:-0}" == 1 ]]; then
    # Instructions per call under callgrind (stable where wall time is not): each function
    # counted alone (--toggle-collect), over 3 rounds of N = 100,000 calls per loop.
    count() { ABI_BENCH_N=100000 valgrind --tool=callgrind --toggle-collect="$2" --callgrind-out-file=/dev/null "${@:3}" 2>&1 \
        | sed -n 's/.*Collected : //p' | python3 -c "import sys; print(f'{int(sys.stdin.read()) / ($1 * 300000):7.1f}')"; }
    echo "-- instructions per call (callgrind): C through the ABI / Rust giving the same answer / Rust, allowed only"
    lib="$scratch/prefix/lib"
    rust="$target/release/examples/abi_bench"
    printf '%-28s %s / %s / %s\n' "direct check (every field)" "$(LD_LIBRARY_PATH=$lib count 2 tollgate_limiter_check "$scratch/abi")" \
        "$(count 2 'abi_bench::every_field' "$rust")" "$(count 2 'abi_bench::allowed' "$rust")"
    printf '%-28s %s / %s / %s\n' "keyed check_n_at (every field)" "$(LD_LIBRARY_PATH=$lib count 1 tollgate_keyed_check_n_at "$scratch/abi")" \
        "$(count 1 'abi_bench::keyed_every_field' "$rust")" "$(count 1 'abi_bench::keyed_allowed' "$rust")"
    printf '%-28s %s / %s / %s\n' "direct try" "$(LD_LIBRARY_PATH=$lib count 2 tollgate_limiter_try "$scratch/abi")" \
        "$(count 2 'abi_bench::with_wait' "$rust")" "$(count 2 'abi_bench::allowed' "$rust")"
    printf '%-28s %s / %s / %s\n' "keyed try" "$(LD_LIBRARY_PATH=$lib count 1 tollgate_keyed_try "$scratch/abi")" \
        "$(count 1 'abi_bench::keyed_with_wait' "$rust")" "$(count 1 'abi_bench::keyed_allowed_now' "$rust")"
fi
