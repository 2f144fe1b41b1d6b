#!/usr/bin/env bash
# Sets up what the test suite needs on a fresh Debian machine (run as root or with sudo):
# etcd (the real server for the etcd rendezvous tests), openssl (their TLS certificates),
# iproute2 (network-namespace hosts), iptables (a lossy link inside one), gcc (a shim that
# skews a host's wall clock), fuse3 (a log filesystem that can stop answering, for
# the chaos tests), strace (a system call made to fail, for the checkpoint tests),
# openssh-server (a real sshd per host for the --hosts/--hostfile tests), chromium (a real
# headless browser opens the timeline page and screenshots it),
# slurmctld, slurmd, slurm-client and munge (a real Slurm cluster for the scheduler tests),
# python3-venv where the system Python lacks venv;
# then a virtualenv in .venv without system site packages (a machine's own packages must
# not hide a missing dependency, and Debian's system Python refuses pip install), holding
# torch 2.13.0 CPU (pinned first, so pip never picks a multi-GB CUDA build) and the project
# with its test extras. Activate it afterwards: . .venv/bin/activate
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
apt_install() {
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v openssl >/dev/null || need+=(openssl)
command -v ip >/dev/null || need+=(iproute2)
command -v iptables >/dev/null || need+=(iptables)
command -v cc >/dev/null || need+=(gcc)
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v strace >/dev/null || need+=(strace)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v chromium >/dev/null || need+=(chromium)
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v srun >/dev/null ||
    need+=(slurmctld slurmd slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
if ((${#need[@]})); then
    apt_install "${need[@]}"
fi
if ! python3 -m venv --clear .venv; then  # Debian ships ensurepip separately
    apt_install python3-venv
    python3 -m venv --clear .venv
fi
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]'
