"""What the multi-node tests share: the hosts type, the fast c10d and etcd rendezvous
settings, and the c10d flags of one agent (one worker) of a job on ``hosts``."""

from __future__ import annotations

from support.hosts import Loopback, NamespaceHosts

Hosts = Loopback | NamespaceHosts
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60,exit_barrier_timeout=30"


def c10d_args(
    hosts: Hosts, port: int, nnodes: str, run_id: str = "job", conf: str = FAST
) -> list[str]:
    return [
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{hosts.addr(0)}:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        conf,
    ]


# lease_ttl: a SIGKILLed agent is found lost this long after it died. heartbeat_timeout: how
# long an etcd that does not answer is tolerated (a leader election takes 1-3 s here).
# request_timeout + 2 heartbeat intervals < heartbeat_timeout: a lost etcd is reported with
# the error of the request that failed, which names the endpoints.
ETCD_CONF = (
    "lease_ttl=4,request_timeout=4,heartbeat_interval=0.5,heartbeat_timeout=8,"
    "last_call_timeout=1,join_timeout=60,exit_barrier_timeout=30"
)
