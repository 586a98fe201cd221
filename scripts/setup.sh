#!/usr/bin/env bash
# Installs what spill needs to build and test on Debian 12 / Ubuntu 24.04 (run as root or with sudo).
# Everything comes from the distribution's packages; nothing is downloaded at build time.
# ccache speeds up rebuilds; clang and its runtime (libFuzzer, sanitizers) build the fuzz targets
# (scripts/fuzz.sh) and the sanitizer run of .ci/run.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PACKAGES=(
  build-essential cmake pkg-config ccache
  clang libclang-rt-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libgtest-dev libgmock-dev
  libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  libnuma-dev libhwloc-dev
  python3
)
missing=()
# The HTTP black-box tests run the official openai and Anthropic SDKs under Node.js.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
