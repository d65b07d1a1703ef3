#!/usr/bin/env bash
# Installs the build dependencies from the distribution's packages when they are missing (Debian/Ubuntu, as root).
# Machines that already have them (or cannot reach a registry) skip this; CMake then names anything still missing.
set -u
pkgs=(cmake g++ make pkg-config libfmt-dev nlohmann-json3-dev catch2 libcli11-dev
      python3 python3-pytest python3-pip python3-setuptools python3-wheel)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "deps: missing ${missing[*]}; install them with your package manager" >&2
  exit 0
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null ||
  echo "deps: apt-get could not install ${missing[*]}; continuing with what is here" >&2
exit 0
