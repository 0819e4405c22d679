#!/usr/bin/env bash
# The fault campaign's long runs (issue 13), beyond what the test suite has time for:
#
#   1. the soak: two threads on every algorithm, direct and keyed, for SOAK_MINUTES (default
#      10), every key's admissions checked against its algorithm's bound at the end;
#   2. AddressSanitizer over the unsafe code (huge pages, prefetch, slot memory): the library's
#      unit tests and the stress, huge-page, keyed and conservation tests, and a 1-minute soak;
#   3. the long fuzz: FUZZ_MINUTES (default 30) per target from fuzz/seeds; the inputs that
#      found new coverage are merged into fuzz/seeds/<target> (libFuzzer's -merge=1 keeps only
#      those that add coverage), for you to review and commit.
#
#     bash scripts/soak.sh                              # about 4 hours on 2 cores
#     SOAK_MINUTES=1 FUZZ_MINUTES=1 bash scripts/soak.sh
#     SKIP="asan fuzz" bash scripts/soak.sh             # the soak alone
#
# Each part prints its figures: decisions checked, evictions, fuzz executions.
set -euo pipefail
cd "$(dirname "$0")/.."

SOAK_MINUTES="${SOAK_MINUTES:-10}"
FUZZ_MINUTES="${FUZZ_MINUTES:-30}"
SKIP="${SKIP:-}"
step() { printf '\n==> %s\n' "$*"; }
skipped() { [[ " $SKIP " == *" $1 "* ]]; }

if ! skipped soak; then
    step "soak: ${SOAK_MINUTES} min, 2 threads, every algorithm, direct and keyed"
    SOAK_SECONDS=$((SOAK_MINUTES * 60)) cargo test -q --release --test soak -- --ignored --nocapture 2>&1 |
        grep -E 'keyed|direct|soak:|test result'
fi

if ! skipped asan; then
    step "AddressSanitizer: unit, stress, huge-page, keyed and conservation tests, and a 1-minute soak"
    host="$(rustc -vV | sed -n 's/^host: //p')"
    # The target is named so that build scripts and proc macros are not instrumented; a
    # target directory of its own keeps the instrumented build apart from the normal one.
    export RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address" ASAN_OPTIONS="detect_leaks=1"
    export CARGO_TARGET_DIR=target/asan
    cargo test -q --release --target "$host" -p tollgate --lib \
        --test keyed_stress --test huge_pages --test keyed --test conservation --test faults
    SOAK_SECONDS=60 cargo test -q --release --target "$host" --test soak -- --ignored --nocapture 2>&1 |
        grep -E 'soak:|test result'
    unset RUSTC_BOOTSTRAP RUSTFLAGS ASAN_OPTIONS CARGO_TARGET_DIR
fi

if ! skipped fuzz; then
    step "fuzz: ${FUZZ_MINUTES} min per target from fuzz/seeds, new coverage merged into the seeds"
    if ! command -v cargo-fuzz >/dev/null 2>&1; then
        cargo install cargo-fuzz --locked
    fi
    for target in $(cd fuzz && cargo fuzz list); do
        scratch="$(mktemp -d)"
        before="$(ls "fuzz/seeds/$target" | wc -l)"
        (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none "$target" "$scratch" "seeds/$target" -- \
            -max_total_time=$((FUZZ_MINUTES * 60)) -print_final_stats=1 2>&1 |
            grep -E '^stat::number_of_executed_units|^stat::new_units_added|ERROR|panicked' | sed "s/^/$target: /")
        # Keep what adds coverage over the committed seeds, and nothing else.
        (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none "$target" "seeds/$target" "$scratch" -- \
            -merge=1 >/dev/null 2>&1)
        after="$(ls "fuzz/seeds/$target" | wc -l)"
        echo "$target: $((after - before)) new seeds (fuzz/seeds/$target: $after)"
        rm -rf "$scratch"
    done
fi

echo
echo "soak done"
