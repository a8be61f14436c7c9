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
#                               results go to docs/benchmarks/ unless ARGS has --out DIR (or
#                               --out=DIR: the script reads --name=value as --name value, as the
#                               program does)
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
# Only the reports of a run fit to publish are plotted and spliced: the program's exit status must
# be 0. specsample-bench exits with 1 when its exactness guard failed (at temperature 0 a
# speculative output differed from the autoregressive one: the reports are written, but they record
# a bug, not a result) and with 2 on a usage error or any other error (the report is missing or
# partial); a missed speed target is a verdict in the report, not a status. specsample-leniency
# exits with 0, or with 2 on an error. The files a failed run wrote stay in its --out directory,
# beside the page they no longer match (`git status` shows them; `git checkout docs/benchmarks`
# restores the published ones). --help (or -h) as the first argument only prints the help;
# --draft-temperatures writes draft-temperatures.md, which no page has markers for (nor is a
# sweep's plot drawn again).
# Builds in build/bench.
# Plots need gnuplot (Debian: gnuplot-nox), an optional package: as root the script installs it,
# otherwise it warns and goes on without it; the tables and JSON are still written.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
optional=
command -v gnuplot >/dev/null || optional=gnuplot-nox  # (any gnuplot on PATH will do)
SPECSAMPLE_OPTIONAL_PACKAGES="$optional ${SPECSAMPLE_OPTIONAL_PACKAGES:-}" "$root/scripts/deps.sh"
jobs=${SPECSAMPLE_JOBS:-$(nproc)}

build() {  # (every option that changes the programs given, so a hand configure's cache cannot linger)
  local dir="$root/build/bench"
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSPECSAMPLE_BUILD_TESTS=OFF \
    -DSPECSAMPLE_BUILD_EXAMPLES=OFF -DSPECSAMPLE_BUILD_BENCHMARKS=ON -DSPECSAMPLE_SANITIZE=OFF \
    -DSPECSAMPLE_AVX512=ON -DSPECSAMPLE_SEPARATE_KERNELS=OFF >/dev/null
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

# The arguments "$@" as the array norm, each --name=value (a long option with a value attached, as
# specsample::io::split_argument reads it: split at the first '=') as the two words --name value,
# so that the scans below see one form. The programs themselves get the arguments as given: a value
# that begins with -- must stay attached for them (--out=--x).
normalise() {
  norm=()
  local a
  for a in "$@"; do
    if [[ $a == --*=* && $a != --=* ]]; then  # (--=x is no long option with a value)
      norm+=("${a%%=*}" "${a#*=}")
    else
      norm+=("$a")
    fi
  done
}

run() {  # args for specsample-bench (the last --out wins)
  local out="$root/docs/benchmarks" draft="shakespeare-draft" prev= report=sweep.md setup='' a
  local given_out='' given_best_k=''
  local norm
  case "${1:-}" in -h|--help) "$exe" "$@"; return ;; esac  # the help alone: no report, no plot
  normalise "$@"
  for a in "${norm[@]}"; do
    case "$prev" in
      --out) out=$a given_out=1 ;;
      --draft) draft=$(basename -- "$a") ;;
      # the plots' title names what differs from the defaults
      --matmul) setup+=", target ${a^^}" ;;
      --draft-matmul) setup+=", draft ${a^^}" ;;
      --draft-temperature-ratio) setup+=", draft at $a × T" ;;
      --verify) setup+=", $a verification" ;;
      --amx) setup+=", AMX tiles $a" ;;
    esac
    case "$a" in
      --strategies) report=strategies.md ;;
      --draft-temperatures) report='draft-temperatures.md' ;;  # no page has markers for it
      --best-k-from) given_best_k=1 ;;
    esac
    prev=$a
  done
  if [ -z "$out" ]; then "$exe" "$@"; return; fi  # (an empty --out: the program's own message)
  mkdir -p -- "$out"
  out=$(cd -- "$out" && pwd)  # absolute: a relative --out under docs/ is spliced into the page too
  echo "== specsample-bench $* (results in $out) ==" >&2
  local status=0
  local args=("$@")
  [ -n "$given_out" ] || args=(--out "$out" "${args[@]}")
  # The strategy comparison also runs token-wise at the best K of the sweep in the same directory.
  if [ "$report" = strategies.md ] && [ -z "$given_best_k" ] && [ -f "$out/sweep.json" ]; then
    args+=(--best-k-from "$out/sweep.json")
  fi
  "$exe" "${args[@]}" || status=$?
  # Plotted and published only from a run that passed (status 0; the comment at the top).
  [ "$status" -eq 0 ] || return "$status"
  if [ "$report" = sweep.md ] && [ -f "$out/speedup.dat" ]; then
    if command -v gnuplot >/dev/null; then
      gnuplot -e "dir='$out'; label='$draft → shakespeare-target${setup:+ (${setup#, })}'" "$root/benchmarks/plot.gp"
      echo "specsample: wrote $out/speedup.png and $out/acceptance.png" >&2
    else
      echo "specsample: gnuplot not found (apt-get install gnuplot-nox): no plots" >&2
    fi
  fi
  splice "$out" "$report"
}

# specsample-leniency ARGS: its markdown table to docs/benchmarks/leniency.md (spliced into the page),
# when it exits with 0 (2: an error); with --help or -h only its help, on stdout.
run_leniency() {
  local out="$root/docs/benchmarks" status=0
  case "${1:-}" in -h|--help) "$(dirname "$exe")/specsample-leniency" "$@"; return ;; esac
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
