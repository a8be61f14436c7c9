#!/usr/bin/env bash
# Makes sure the Debian packages specsample builds with are installed. As root it installs what is
# missing with apt-get; otherwise it prints the exact apt-get line to run and fails.
set -euo pipefail
packages=(cmake make g++ clang-14 libclang-rt-14-dev pkg-config libeigen3-dev xtensor-dev
          nlohmann-json3-dev libfmt-dev libpcre2-dev catch2 libbenchmark-dev ${SPECSAMPLE_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "specsample: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "specsample: missing Debian packages. Run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
