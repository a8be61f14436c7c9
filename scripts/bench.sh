#!/usr/bin/env bash
# The speculative-sampling benchmark (docs/benchmarks.md): builds specsample-bench in Release, runs
# the sweep and draws the plots with gnuplot.
#
#   scripts/bench.sh            every figure of docs/benchmarks.md: the sweep and the strategy
#                               comparison for both bundled drafts, docs/benchmarks/
#                               (shakespeare-draft) and docs/benchmarks/distilled/
#                               (shakespeare-draft-distilled); the sweeps of the best configuration
#                               (the target's matmuls in BF16, the distilled draft's in INT8,
#                               sampling at 1.2 x T), token-wise in docs/benchmarks/best/ and under
#                               block verification in docs/benchmarks/best-block/; then the
#                               leniency study
#   scripts/bench.sh ARGS...    one run of specsample-bench with ARGS (see specsample-bench --help);
#                               results go to docs/benchmarks/ unless ARGS has --out DIR
#   scripts/bench.sh --quick --out /tmp/b   smoke test (< 30 s)
#   scripts/bench.sh --strategies [ARGS...] the strategy comparison (specsample-bench --strategies;
#                               ~3-5 min): strategies.md/.json in docs/benchmarks/ (or --out DIR),
#                               with token-wise at the best K of that directory's sweep.json
#   scripts/bench.sh --strategies --quick --out /tmp/s   its smoke test (< 30 s)
#   scripts/bench.sh --leniency [ARGS...]   the lossy leniency trade-off on a toy Markov pair
#                               (specsample-leniency; seconds): docs/benchmarks/leniency.md
#
# Runs writing into a result directory under docs/benchmarks/ that a page marks (docs/benchmarks/,
# its distilled/, or the other machines' zen4/..., zen3/...) also refresh the generated tables of
# docs/benchmarks.md or docs/benchmarks-machines.md (between their <!-- generated:... --> markers).
# Builds in build/bench.
# Plots need gnuplot (Debian: gnuplot-nox); without it the tables and JSON are still written.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SPECSAMPLE_EXTRA_PACKAGES="gnuplot-nox ${SPECSAMPLE_EXTRA_PACKAGES:-}" "$root/scripts/deps.sh"
jobs=${SPECSAMPLE_JOBS:-$(nproc)}

build() {
  local dir="$root/build/bench"
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSPECSAMPLE_BUILD_TESTS=OFF \
    -DSPECSAMPLE_BUILD_EXAMPLES=OFF -DSPECSAMPLE_BUILD_BENCHMARKS=ON >/dev/null
  cmake --build "$dir" -j "$jobs" --target specsample-bench specsample-leniency >/dev/null
  exe="$dir/benchmarks/specsample-bench"
}

# Recorded in the report: the commit, "+dirty" when the code differs from it (changes under docs/,
# where the results themselves go, do not count).
if rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null); then
  git -C "$root" diff --quiet HEAD -- . ':(exclude)docs' 2>/dev/null || rev="$rev+dirty"
  export SPECSAMPLE_BENCH_REVISION=$rev
fi

exe=
build

run() {  # args for specsample-bench (the last --out wins)
  local out="$root/docs/benchmarks" draft="shakespeare-draft" prev= report=sweep.md setup=
  for a in "$@"; do
    [ "$prev" = "--out" ] && out=$a
    [ "$prev" = "--draft" ] && draft=$(basename "$a")
    case "$prev" in  # the plots' title names what differs from the defaults
      --matmul) setup+=", target ${a^^}" ;;
      --draft-matmul) setup+=", draft ${a^^}" ;;
      --draft-temperature-ratio) setup+=", draft at $a × T" ;;
      --verify) setup+=", $a verification" ;;
      --amx) setup+=", AMX tiles $a" ;;
    esac
    [ "$a" = "--strategies" ] && report=strategies.md
    prev=$a
  done
  mkdir -p "$out"
  out=$(cd "$out" && pwd)  # absolute: a relative --out under docs/ is spliced into the page too
  echo "== specsample-bench $* (results in $out) ==" >&2
  local status=0
  local args=("$@")
  case " $* " in *" --out "*) ;; *) args=(--out "$out" "${args[@]}") ;; esac
  # The strategy comparison also runs token-wise at the best K of the sweep in the same directory.
  if [ "$report" = strategies.md ] && [ -f "$out/sweep.json" ]; then
    case " $* " in *" --best-k-from "*) ;; *) args+=(--best-k-from "$out/sweep.json") ;; esac
  fi
  "$exe" "${args[@]}" || status=$?
  if [ "$report" = sweep.md ] && [ "$status" -le 1 ] && [ -f "$out/speedup.dat" ]; then
    if command -v gnuplot >/dev/null; then
      gnuplot -e "dir='$out'; label='$draft → shakespeare-target${setup:+ (${setup#, })}'" "$root/benchmarks/plot.gp"
      echo "specsample: wrote $out/speedup.png and $out/acceptance.png" >&2
    else
      echo "specsample: gnuplot not found (apt-get install gnuplot-nox): no plots" >&2
    fi
  fi
  splice "$out" "$report"
  return "$status"
}

# specsample-leniency ARGS: its markdown table to docs/benchmarks/leniency.md (spliced into the page).
run_leniency() {
  local out="$root/docs/benchmarks" status=0
  mkdir -p "$out"
  echo "== specsample-leniency $* (results in $out/leniency.md) ==" >&2
  "$(dirname "$exe")/specsample-leniency" "$@" >"$out/leniency.md.tmp" || status=$?
  [ "$status" -eq 0 ] && mv "$out/leniency.md.tmp" "$out/leniency.md" && splice "$out" leniency.md
  rm -f "$out/leniency.md.tmp"
  return "$status"
}

# Copies $out/$report (sweep.md, strategies.md, leniency.md) into the page of docs/benchmarks*.md
# (benchmarks.md, or benchmarks-machines.md for the other machines' runs) that has the markers
#   <!-- generated:begin benchmarks/.../sweep.md --> ... <!-- generated:end benchmarks/.../sweep.md -->
# (only for result directories under docs/ that a page has markers for).
splice() {
  local out=$1 report=${2:-sweep.md} doc
  local rel="${out#"$root/docs/"}/$report"
  [ -f "$out/$report" ] || return 0
  for doc in "$root"/docs/benchmarks*.md; do
    grep -qxF "<!-- generated:begin $rel -->" "$doc" || continue
    awk -v f="$out/$report" -v b="<!-- generated:begin $rel -->" -v e="<!-- generated:end $rel -->" '
      $0 == b { print; while ((getline line < f) > 0) print line; skip = 1; next }
      $0 == e { skip = 0 }
      !skip { print }' "$doc" >"$doc.tmp"
    mv "$doc.tmp" "$doc"
    echo "specsample: updated the $rel section of docs/${doc##*/}" >&2
  done
}

start=$(date +%s)
if [ $# -eq 0 ]; then
  distilled=(--draft "$root/models/shakespeare-draft-distilled" --out "$root/docs/benchmarks/distilled")
  best=(--draft "$root/models/shakespeare-draft-distilled" --matmul bf16 --draft-matmul int8 --draft-temperature-ratio 1.2)
  run
  run "${distilled[@]}"
  run "${best[@]}" --out "$root/docs/benchmarks/best"
  run "${best[@]}" --verify block --out "$root/docs/benchmarks/best-block"
  run --strategies
  run --strategies "${distilled[@]}"
  run_leniency
elif [ "$1" = --leniency ]; then
  shift
  run_leniency "$@"
else
  run "$@"
fi
echo "specsample: bench.sh took $(( $(date +%s) - start )) s" >&2
