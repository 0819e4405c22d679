#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, workspace tests (unit, proptest,
# conformance, conservation, allocation, doc tests, benches in test mode), the loom models, and
# a bounded fuzz run from the committed seed corpus.
#
# On a Debian machine with only Rust, it first installs what the tests need and says so: with
# apt-get, a C and a C++ compiler (the C ABI's test, libFuzzer), pkg-config, valgrind (the C
# test runs under memcheck), redis-server and redis-cli (the Redis and server tests, against a
# real Redis), python3 (the benchmark smoke checks), libclang (bindgen, for the Redis module's
# bindings), libdpdk-dev (DPDK's meters, against tollgate's; its EAL needs root), tcpdump (a
# real capture for the packet pipeline); with rustup,
# rustfmt and clippy; with
# cargo, cargo-fuzz and cargo-deny. Nothing already present is touched.
#
#     bash scripts/test.sh            # everything (about 30 minutes on 2 cores)
#     FUZZ_SECONDS=60 bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-10}"
step() { printf '\n==> %s\n' "$*"; }

step "what the tests need"
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v objdump >/dev/null 2>&1 || missing+=(binutils)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkgconf)
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# The Redis module's bindings are generated from redismodule.h by bindgen, which loads libclang.
ldconfig -p 2>/dev/null | grep -Eq 'libclang(-[0-9]+)?\.so' || missing+=(libclang-dev)
# DPDK's rte_meter, run beside tollgate's meters in the packets crate's differential test.
[[ -f /usr/include/dpdk/rte_meter.h ]] || missing+=(libdpdk-dev)
# A real capture for the packet pipeline's test, taken on the loopback.
command -v tcpdump >/dev/null 2>&1 || missing+=(tcpdump)
if ((${#missing[@]})); then
    echo "installing with apt-get: ${missing[*]}"
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -q
    $sudo apt-get install -y -q "${missing[@]}"
fi
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "installing with rustup: $component"
        rustup component add "$component"
    fi
done
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing with cargo: cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
if ! command -v cargo-deny >/dev/null 2>&1; then
    echo "installing with cargo: cargo-deny (licences and bans)"
    cargo install cargo-deny --locked
fi
echo "present: a C and C++ compiler, pkg-config, valgrind, redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), python3, libclang, DPDK $(pkg-config --modversion libdpdk), tcpdump, rustfmt, clippy, cargo-fuzz, cargo-deny"

step "licences, bans and sources of every dependency (deny.toml; advisories need the network)"
cargo deny --workspace check licenses bans sources

step "every published crate packages (metadata, files, the workspace's own versions)"
cargo package --workspace --exclude tollgate-bench --exclude loom-tests --allow-dirty --no-verify --quiet

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --profile ci -- -D warnings
cargo clippy -p tollgate --all-targets --features serde,tokio,metrics --profile ci -- -D warnings
cargo clippy -p tollgate-tower --all-targets --features axum,metrics --profile ci -- -D warnings
cargo clippy -p tollgate-redis --all-targets --features metrics --profile ci -- -D warnings
cargo clippy -p tollgate-packets --all-targets --features dpdk --profile ci -- -D warnings

step "atomics come only from src/sync.rs"
if grep -rn 'sync::atomic' src --include='*.rs' | grep -v '^src/sync.rs:'; then
    echo "error: import atomics through crate::sync so that loom sees them" >&2
    exit 1
fi

step "workspace tests (ci profile: optimized, with overflow checks and debug assertions)"
cargo test --workspace --all-targets --profile ci
cargo test --workspace --doc --profile ci

step "tollgate's meters against DPDK's rte_meter, in one process (DPDK's EAL: root)"
cargo test -p tollgate-packets --features dpdk --profile ci --test dpdk_meter -- --nocapture

step "the soak, for 5 seconds (scripts/soak.sh runs it for minutes, with ASan and the long fuzz)"
SOAK_SECONDS=5 cargo test --profile ci --test soak -- --ignored

step "the serde feature: configurations deserialize from their strings"
cargo test -p tollgate --features serde --profile ci --test surface

step "the metrics features: limiters' and Redis limiters' counts on the metrics facade"
cargo test -p tollgate --features metrics --profile ci --lib metrics
cargo test -p tollgate --features metrics --profile ci --doc metrics
cargo test -p tollgate-redis --features metrics --profile ci --test faults

step "the tokio feature: async waiting, cancel-safe under select!"
cargo test -p tollgate --features tokio --profile ci --test until_ready

step "the HTTP layer with axum and metrics: its tests and the example, serving real requests on 127.0.0.1"
cargo test -p tollgate-tower --features axum,metrics --profile ci
cargo run -q --profile ci -p tollgate-tower --features axum --example axum -- --addr 127.0.0.1:0 --requests 4

step "the C ABI from a real C program: every function and error path, under valgrind"
scratch="$(mktemp -d)"
PROFILE=ci bash integrations/tollgate-ffi/install.sh "$scratch/prefix" >/dev/null
export PKG_CONFIG_PATH="$scratch/prefix/lib/pkgconfig"
# The shared library names its ABI (SONAME), and the installed links lead to it.
soname="$(objdump -p "$scratch/prefix/lib/libtollgate_ffi.so" | sed -n 's/^ *SONAME *//p')"
[[ "$soname" == libtollgate_ffi.so.0.* && -L "$scratch/prefix/lib/$soname" && -e "$scratch/prefix/lib/$soname" ]] ||
    { echo "error: SONAME '$soname' missing, or not installed as a link" >&2; exit 1; }
# The shared library, found through pkg-config, under valgrind's memcheck, as a C user's CI
# runs it: the default leak kinds (definite and possible) are errors.
cc -std=c11 -Wall -Wextra -Werror -pthread integrations/tollgate-ffi/tests/c/test.c \
    $(pkg-config --cflags --libs tollgate) -o "$scratch/test"
LD_LIBRARY_PATH="$scratch/prefix/lib" valgrind -q --error-exitcode=1 --leak-check=full "$scratch/test"
# The static library.
cc -std=c11 -Wall -Wextra -Werror -pthread integrations/tollgate-ffi/tests/c/test.c \
    $(pkg-config --cflags tollgate) "$scratch/prefix/lib/libtollgate_ffi.a" \
    $(pkg-config --libs-only-l --static tollgate | sed 's/-ltollgate_ffi//') -o "$scratch/test-static"
"$scratch/test-static"
# The meters' poll-loop example, built as its comment says, under valgrind too.
cc -std=c11 -Wall -Wextra -Werror integrations/tollgate-ffi/examples/c/meter_loop.c \
    $(pkg-config --cflags --libs tollgate) -o "$scratch/meter_loop"
LD_LIBRARY_PATH="$scratch/prefix/lib" valgrind -q --error-exitcode=1 --leak-check=full "$scratch/meter_loop"
rm -rf "$scratch"
unset PKG_CONFIG_PATH

step "examples run"
for example in demo keyed several_limits algorithms; do
    cargo run -q --profile ci --example "$example" >/dev/null
done
cargo run -q --profile ci --example loadgen -- --rate 5000 --seconds 0.3 --arrivals poisson

step "benchmark suite: a quick smoke run of every workload and output (speed is not checked)"
scratch="$(mktemp -d)"
cargo run -q --profile ci -p tollgate-bench -- --quick --json --markdown "$scratch/report.md" >"$scratch/report.json"
python3 - "$scratch" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
r = json.loads((d / "report.json").read_text())
workloads = {c["workload"] for c in r["cells"]}
assert len(workloads) == 7, workloads
assert all(c["decisions"] > 0 for c in r["cells"])
assert all(c["call"]["p50"] > 0 and c["call"]["p999"] >= c["call"]["p50"] for c in r["cells"])
assert r["memory"] and r["targets"]
assert len(r["pacing"]) == 5 and all(p["sent"] > 0 for i, p in enumerate(r["pacing"]) if i != 3), r["pacing"]
assert r["redis_skipped"] is None and len(r["redis"]) == 9, (r["redis_skipped"], r["redis"])
assert all(x["decisions"] > 0 for x in r["redis"]), r["redis"]
# Envoy's rate limit service: every subject ran, and on Redis one script call a request.
assert r["envoy_skipped"] is None and r["envoy"], r["envoy_skipped"]
subjects = {x["subject"] for x in r["envoy"]}
assert len(subjects) == 5, subjects
assert all(x["requests"] > 0 and x["per_sec"] > 0 for x in r["envoy"]), r["envoy"]
on_redis = [x for x in r["envoy"] if x["subject"].startswith("tollgate on Redis (one")]
assert on_redis and all(abs(x["redis_sent"] - 1) < 0.1 for x in on_redis), on_redis
assert "<!-- results:end -->" in (d / "report.md").read_text()
scaled = len(r["threads"]) > 1 and workloads & {"1-key", "1K-keys"}
charts = ["decisions.svg", "latency.svg"] + (["scaling.svg"] if scaled else [])
for chart in charts:
    svg = (d / "docs" / "charts" / chart).read_text()
    assert svg.startswith("<svg") and "commit" in svg, chart
print(f"{len(r['cells'])} cells in {len(workloads)} workloads, {len(r['memory'])} memory probes")
PY
cargo run -q --profile ci -p tollgate-bench -- --quick --csv --filter direct/deny --threads 1 --no-memory >"$scratch/report.csv"
python3 - "$scratch/report.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) >= 8 and all(r["workload"] == "direct" and r["load"] == "deny-heavy" for r in rows), rows
print(f"{len(rows)} CSV rows")
PY
rm -rf "$scratch"

step "crate docs: every link resolves"
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p tollgate --features serde,tokio,metrics
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p tollgate-tower --features axum,metrics
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p tollgate-redis --features metrics
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p tollgate-server
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p tollgate-envoy

step "crate builds without default features"
cargo check -p tollgate --no-default-features

step "the library compiles for a 32-bit target"
if rustup target add i686-unknown-linux-gnu >/dev/null 2>&1; then
    cargo check -q -p tollgate --lib --target i686-unknown-linux-gnu
else
    echo "skipped: the i686-unknown-linux-gnu target could not be installed here"
fi

step "loom models"
RUSTFLAGS="--cfg tollgate_loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
    cargo test -p loom-tests --release

step "fuzz: ${FUZZ_SECONDS}s per target from fuzz/seeds"
for target in $(cd fuzz && cargo fuzz list); do
    scratch="$(mktemp -d)"
    # New inputs go to the scratch corpus (the first directory); the seeds stay as committed.
    (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none "$target" "$scratch" "seeds/$target" -- \
        -max_total_time="$FUZZ_SECONDS" -seed=1 -print_final_stats=1 2>&1 | grep -vE '^(#|")')
    rm -rf "$scratch"
done

echo
echo "all checks passed"
