#!/usr/bin/env bash
# The main job: builds the examples and runs the demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
dir="$root/build/demo"
cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSPECSAMPLE_BUILD_TESTS=OFF \
  -DSPECSAMPLE_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$dir" -j "${SPECSAMPLE_JOBS:-$(nproc)}" --target quickstart >/dev/null
"$dir/examples/quickstart" "$@"
