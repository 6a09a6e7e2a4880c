#!/bin/bash
# Installs the Debian packages listed in $1 unless all are installed already:
# a debootstrap base made by the harness has them, a registry image such as
# debian:bookworm does not.
set -euo pipefail

mapfile -t packages < <(grep -v -e '^#' -e '^[[:space:]]*$' "$1")
installed=$(dpkg-query -W -f='${db:Status-Abbrev}\n' "${packages[@]}" 2>/dev/null | grep -c '^ii' || true)
if [[ "$installed" -eq "${#packages[@]}" ]]; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${packages[@]}"
rm -rf /var/lib/apt/lists/*
