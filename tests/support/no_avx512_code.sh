#!/usr/bin/env bash
# Usage: no_avx512_code.sh FILE...  (object files, archives or executables)
# Fails when one of them holds code for an AVX-512 kernel. A build with SPECSAMPLE_AVX512=0
# generates none: every dispatcher tests simd::avx512_kernels first, so the branch folds away. A
# dispatcher that tested the level alone would compile its AVX-512 kernels again, unseen (they
# would never run; the build would only be slower). The CPU-feature queries (has_avx512_bf16,
# has_avx512_vnni and the avx512_feature they share) are plain C++ and stay.
set -euo pipefail
for file in "$@"; do
  symbols=$(nm -C "$file")
  if [ -z "$symbols" ]; then
    echo "no_avx512_code: nm lists no symbol in $file" >&2
    exit 1
  fi
  if found=$(grep -i 'avx512' <<<"$symbols" | grep -v 'has_avx512_bf16\|has_avx512_vnni\|avx512_feature'); then
    echo "no_avx512_code: $file holds AVX-512 code although the build leaves it out (SPECSAMPLE_AVX512=0):" >&2
    echo "$found" >&2
    exit 1
  fi
done
echo "no_avx512_code: no AVX-512 code in $*"
