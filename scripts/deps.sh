#!/usr/bin/env bash
# Installs what building and testing cairn needs on Debian 12 (run as root, or with sudo).
set -euo pipefail
pkgs=(build-essential clang cmake pkg-config libjansson-dev libpcre2-dev python3 python3-jinja2
      libczmq-dev libzmq3-dev libsodium-dev libmicrohttpd-dev libsqlite3-dev libcurl4-openssl-dev libssl-dev libedit-dev
      curl iproute2 chromium)  # chromium: the dashboard's browser tests (tests/e2e/dashboard.test.mjs)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# node and npm run the end-to-end tests (tests/e2e; Debian 12's node 18 is enough). A node
# from elsewhere (e.g. NodeSource, which bundles npm) is kept as it is.
if ! command -v node >/dev/null 2>&1; then
  missing+=(nodejs npm)
elif ! command -v npm >/dev/null 2>&1; then
  missing+=(npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
