#!/usr/bin/env bash
# Makes sure the Debian packages specsample builds with are installed. As root it installs what is
# missing with apt-get; otherwise it prints the exact apt-get line to run and fails.
# Callers add packages of their own: required ones in SPECSAMPLE_EXTRA_PACKAGES (handled as the
# list below), optional ones in SPECSAMPLE_OPTIONAL_PACKAGES (space-separated). As root the optional
# ones are installed too, a failure to install them being only a warning; otherwise a missing one
# is only a warning, with its apt-get line, and the caller goes on without it.
set -euo pipefail
packages=(cmake make g++ clang-14 libclang-rt-14-dev pkg-config libeigen3-dev xtensor-dev
          nlohmann-json3-dev libfmt-dev libpcre2-dev catch2 libbenchmark-dev ${SPECSAMPLE_EXTRA_PACKAGES:-})
read -ra optional <<<"${SPECSAMPLE_OPTIONAL_PACKAGES:-}"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=() missing_optional=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
for p in "${optional[@]}"; do
  installed "$p" || missing_optional+=("$p")
done
[ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  [ ${#missing[@]} -eq 0 ] || echo "specsample: installing ${missing[*]}" >&2
  [ ${#missing_optional[@]} -eq 0 ] || echo "specsample: installing ${missing_optional[*]} (optional)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq; then updated=1; else updated=; fi
  [ -n "$updated" ] || [ ${#missing[@]} -eq 0 ] || exit 1  # (apt-get said why)
  [ ${#missing[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ ${#missing_optional[@]} -gt 0 ] && { [ -z "$updated" ] ||
     ! apt-get install -y -qq --no-install-recommends "${missing_optional[@]}" >/dev/null; }; then
    echo "specsample: warning: could not install ${missing_optional[*]}; going on without" >&2
  fi
else
  if [ ${#missing_optional[@]} -gt 0 ]; then
    echo "specsample: warning: optional Debian packages missing, going on without them. To install them:" >&2
    echo "  sudo apt-get install -y ${missing_optional[*]}" >&2
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "specsample: missing Debian packages. Run:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
