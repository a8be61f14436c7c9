#!/usr/bin/env bash
# The main job: speculative GPT-2 generation on the bundled Tiny Shakespeare pair (the target
# drafted by the distilled draft, K = 3, one kernel thread shared by both models: the setting docs/benchmarks.md
# measures), side by side with plain autoregressive decoding (greedy, so both print the same text).
# Extra arguments go to specsample-generate's compare run (see --help), e.g. scripts/demo.sh
# --temperature 0.8; for --mode speculative or autoregressive call specsample-generate itself (it
# refuses --repeat outside compare, and drafting options where nothing drafts).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
dir="$root/build/demo"
cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSPECSAMPLE_BUILD_TESTS=OFF \
  -DSPECSAMPLE_BUILD_BENCHMARKS=OFF -DSPECSAMPLE_SANITIZE=OFF -DSPECSAMPLE_AVX512=ON \
  -DSPECSAMPLE_SEPARATE_KERNELS=OFF >/dev/null  # (pinned: a hand configure's cache cannot linger)
cmake --build "$dir" -j "${SPECSAMPLE_JOBS:-$(nproc)}" --target specsample-generate >/dev/null
"$dir/examples/specsample-generate" --mode compare --temperature 0 -n 200 --repeat 5 \
  --draft "$root/models/shakespeare-draft-distilled" -k 3 --threads 1 "$@"
