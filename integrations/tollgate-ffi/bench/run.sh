#!/usr/bin/env bash
# The C ABI's cost per decision next to the Rust call's, in one run on this machine: the same
# three loops through the shared library from C (bench/abi.c, cc -O2) and through the Rust API
# (examples/abi_bench.rs), each three times. Prints both and the ratio of their best rounds.
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
echo "-- C, through the ABI (shared library)"
LD_LIBRARY_PATH="$scratch/prefix/lib" "$scratch/abi" | tee "$scratch/c.txt"
echo "-- Rust"
"$target/release/examples/abi_bench" | tee "$scratch/rust.txt"
python3 - "$scratch/c.txt" "$scratch/rust.txt" <<'PY'
import sys, collections
def best(path):
    b = collections.OrderedDict()
    for line in open(path):
        name, ns = line[:28].strip(), float(line[28:].split()[0])
        b[name] = min(ns, b.get(name, ns))
    return b
c, r = best(sys.argv[1]), best(sys.argv[2])
print("-- best of 3: C ABI / Rust (the Rust call reading only whether it was allowed; and reading every field, as the ABI does)")
for name in c:
    line = f"{name:<28} {c[name]:7.2f} / {r[name]:7.2f} ns = {c[name] / r[name]:.2f}x"
    if name + ", fields" in r:
        f = r[name + ", fields"]
        line += f";  / {f:7.2f} ns = {c[name] / f:.2f}x"
    print(line)
PY
