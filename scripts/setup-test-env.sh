#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine (run as root or with sudo):
# etcd (the real server for the etcd rendezvous tests), openssl (their TLS certificates),
# iproute2 (network-namespace hosts),
# torch 2.13.0 CPU (pinned first, so pip never picks a multi-GB CUDA build), the project.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v openssl >/dev/null || need+=(openssl)
command -v ip >/dev/null || need+=(iproute2)
if ((${#need[@]})); then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[test]'
