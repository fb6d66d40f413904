#!/usr/bin/env bash
# Fuzz every target in fuzz/ (cargo-fuzz, libFuzzer) for a bounded time and
# print a table: target, seconds, executions, result, kept input.
#
#   e2e/fuzz.sh [seconds-per-target]      (default 60; also FUZZ_SECONDS)
#   FUZZ_TARGETS="annotations kubelet_query" e2e/fuzz.sh 30
#   FUZZ_NO_BUILD=1 e2e/fuzz.sh          (run the targets as last built)
#
# Needs a nightly toolchain and cargo-fuzz; both are installed when missing
# (rustup, cargo install). The corpus grows in fuzz/corpus/<target>/ (not
# committed) from the committed seeds in fuzz/seeds/<target>/. An input that
# makes a target fail is copied to fuzz/regressions/<target>/, where
# tests/fuzz_regressions.rs replays it as a regular test (`make test`, stable
# toolchain): commit it with the fix. Exit status 1 when any target failed.
set -euo pipefail

secs="${1:-${FUZZ_SECONDS:-60}}"
[[ "$secs" =~ ^[0-9]+$ && "$secs" -gt 0 ]] || { echo "usage: $0 [seconds-per-target]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz: installing the nightly toolchain" >&2
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

if [[ -n "${FUZZ_TARGETS:-}" ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

if [[ -z "${FUZZ_NO_BUILD:-}" ]]; then
  echo "fuzz: building ${#targets[@]} targets (release, ASan, debug assertions)" >&2
  if [[ -n "${FUZZ_TARGETS:-}" ]]; then
    # Only the targets asked for (the dependencies are built once either way).
    for t in "${targets[@]}"; do cargo +nightly fuzz build -O -a "$t" >&2; done
  else
    cargo +nightly fuzz build -O -a >&2
  fi
fi
# Run the binaries just built: `cargo fuzz run` would rebuild whenever the
# sources changed meanwhile (a shared tree), minutes per target.
bindir="$root/fuzz/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}"

logdir="$root/fuzz/artifacts/logs"
mkdir -p "$logdir"
rows=()
failed=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" "regressions/$t"
  # A previous run's artifacts are already kept; start clean.
  find "artifacts/$t" -maxdepth 1 -type f -delete
  log="$logdir/$t.log"
  echo "fuzz: $t for ${secs}s (log $log)" >&2
  start=$(date +%s)
  set +e
  "$bindir/$t" "corpus/$t" "seeds/$t" \
    -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1 || true)
  [[ -n "$execs" ]] || execs=$(grep -Eo '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  kept="-"
  for a in "artifacts/$t"/*; do
    [[ -f "$a" ]] || continue
    name="$(basename "$a")"
    cp -n "$a" "regressions/$t/$name"
    kept="fuzz/regressions/$t/$name"
  done
  if [[ $rc -eq 0 ]]; then
    result=ok
  else
    result="FAILED (exit $rc)"
    failed=1
    grep -E "panicked at|ERROR: libFuzzer|SUMMARY" "$log" | head -5 >&2 || true
  fi
  rows+=("$(printf '%-18s %8s %12s  %-16s %s' "$t" "$took" "${execs:-?}" "$result" "$kept")")
done

printf '\n%-18s %8s %12s  %-16s %s\n' target seconds executions result "kept input"
printf '%s\n' "${rows[@]}"
if [[ $failed -ne 0 ]]; then
  echo
  echo "fuzz: a target failed; its input is kept under fuzz/regressions/ and replays in" \
       "'cargo test --test fuzz_regressions'. Reproduce: cd fuzz && cargo +nightly fuzz run -O -a <target> <input>" >&2
fi
exit "$failed"
