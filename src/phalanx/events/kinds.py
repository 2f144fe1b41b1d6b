"""The kinds of event in ``events.jsonl`` and the fields each carries.

Every line is one JSON object with the common fields

``v``     schema version (``SCHEMA_VERSION``)
``t``     wall-clock seconds (the agent's ``WallClock``: for people and pictures, never to
          order events across hosts)
``mono``  this host's monotonic clock (durations between events of one node)
``seq``   this node's event number, from 0 (order within a node, even when ``t`` jumps)
``node``  this node's rank in the current round (null before the first round)
``host``  this node's host name
``kind``  one of ``KINDS``

and the fields of its kind below (never one of the common names). Readers ignore fields they do not know; a kind's listed
fields are always present (null where the value is not known).
"""

from __future__ import annotations

SCHEMA_VERSION = 1
COMMON = ("v", "t", "mono", "seq", "node", "host", "kind")

KINDS: dict[str, tuple[str, ...]] = {
    # The agent started (once per agent run).
    "run_start": ("run_id", "pid", "min_nodes", "max_nodes", "nproc_per_node", "max_restarts"),
    # This node began to wait for a round (``attempt``: the attempt the round will run).
    "rdzv_start": ("attempt",),
    # A round formed: its members (host names by node rank) and how long the wait took.
    "rdzv_done": (
        "round", "attempt", "num_nodes", "world_size", "members", "restart_count", "seconds",
    ),
    # The node check before the round (``phalanx.nodecheck``): how long it took, the nodes it
    # named (``node``, ``host``, ``addr``, ``line``: one line with the figure and the median),
    # the round's medians and every node's figures (compute in multiply-adds/s, latency_ms,
    # throughput in MB/s).
    "node_check": ("round", "seconds", "named", "medians", "nodes"),
    # This node measured its compute figure for the node check (once per agent: at its first
    # check, ``round``, or, null, before it joined a running job): multiply-adds/s, the
    # device ("cpu", "cuda"), the problems it found, how long it took.
    "node_probe": ("round", "compute", "device", "problems", "seconds"),
    # The nodes' script arguments differ (they run: ``phalanx.consistency.perargs``): the
    # line said, and every node's ``node``, ``host`` and ``args`` (a list; the hash, a
    # string, where the list was too long to publish). Once while the difference holds.
    "script_args_differ": ("round", "line", "nodes"),
    # This node's workers of one attempt were started (global ranks and pids).
    "workers_started": ("round", "attempt", "ranks", "pids"),
    # A worker's progress counters (``phalanx.worker.progress``), sampled by the agent;
    # ``age``: seconds from the agent's previous reading (the earliest the rank can have
    # moved) to this one (``agent.attempt_events``).
    "progress": ("round", "rank", "step", "beats", "age"),
    # One worker ended: its code (negative: killed by that signal) and whether phalanx
    # stopped it (collateral) or it failed on its own.
    "worker_exit": (
        "round", "attempt", "rank", "local_rank", "pid", "returncode", "signal", "failed",
        "stopped_by_phalanx", "exited_at",
    ),
    # A hang found on this node (``ranks``: the ranks that made no progress for ``bound``
    # seconds). ``action``: "named" (the hang watch named them, with every rank's stack; the
    # job goes on) or "failed" (the round fails: ``--stall-timeout``, or 10x the bound a
    # rank was named at).
    "hang": ("round", "attempt", "ranks", "suspects", "report", "action", "bound"),
    # A rank the hang watch had named moves again after ``seconds`` without progress (it had
    # been named at ``bound``); it is watched again.
    "hang_over": ("round", "attempt", "rank", "seconds", "bound"),
    # The attempt failed, as this node knows it: the root cause when the failure is local
    # (``node`` of the failing rank in ``failed_node``), or the peer event that stopped it
    # (also one that ended the round before its workers started: no ``workers_started``).
    # ``failed_at``: when the failure happened (the worker's exit, the hang's detection);
    # ``detected_at``: when this agent acted on it.
    "failure": (
        "round", "attempt", "rank", "failed_node", "failure_kind", "reason", "exit_code", "local",
        "failed_at", "detected_at",
    ),
    # A node found gone from the round (its heartbeat ran out, its guardian said its agent
    # died, or it lost the rendezvous store and came back as a new member): its node rank in
    # that round, host, address and node id, and the reason as the report gives it. Said once
    # per node by every node that learns of it; that node is the round's root cause ahead of
    # any rank that failed only because a peer went away.
    "node_lost": ("round", "lost_node", "lost_host", "addr", "node_id", "reason"),
    # Every member of round ``round`` was gone (lost: fenced, killed; or left) with nobody left
    # to restart the job, and a node waiting to join opened the next round
    # (``rendezvous.dynamic.abandoned``): ``reason`` as the log says it, and the job's
    # ``restart_count`` with this restart. Said by every node of the new round.
    "round_abandoned": ("round", "reason", "restart_count"),
    # The rendezvous store's host was lost and the store moved to a successor (c10d,
    # ``dynamic.failover``): the round it happened in, the lost host (node rank, "node N
    # (host, addr)"), the successor (node rank, or null for a listed endpoint; its name), the
    # endpoint it serves at, and ``epoch`` (the job's failovers so far). Said on every node
    # that moved.
    "store_moved": (
        "round", "lost_node", "lost_host", "successor_node", "successor", "endpoint", "epoch",
    ),
    # Every worker of the failed attempt on this node has exited (``seconds``: since the
    # failure was detected here; 0 when the round ended before its workers started).
    "stopped": ("round", "attempt", "seconds"),
    # The job spends a restart (``restart`` of ``max_restarts``) and re-forms.
    "restart": ("restart", "max_restarts", "round"),
    # The round re-forms without spending a restart (a node joins: elastic scale-up).
    "reform": ("round", "reason"),
    # A rank whose step rate stayed below ``--straggler-fraction`` of the other ranks' median
    # for ``window`` seconds (``stragglers.watch``): its rate and the median in steps/s, its
    # node and host, and ``action`` (warn, exclude). Every node of the round says it.
    "straggler": (
        "round", "rank", "straggler_node", "straggler_host", "rate", "median", "window", "action",
    ),
    # This node was excluded from the job (``--exclude-after``, ``--node-check exclude``, ``--straggler-action exclude``; ``exclusion``).
    "excluded": ("name", "reason"),
    # This node is out of the job, cut off from a quorum of the last round's members (c10d,
    # 3 members or more: ``rendezvous.dynamic.majority``); the job may go on without it.
    "cut_off": ("round", "reason"),
    # The scheduler said the job will be stopped (a preemption signal).
    "preempt": ("signal", "deadline"),
    # The launcher's console went away (a closed terminal: ``reason`` says why); the job goes
    # on, its output in the log files only (``streams``: stdout, stderr or both).
    "console_lost": ("streams", "reason"),
    # This node's guardian (``supervisor.guardian``) died before its agent: its ``pid``, how
    # it ``ended``, and the pid of the one that replaced it (``replacement``; null: none).
    "guardian_lost": ("pid", "ended", "replacement"),
    # The agent run ended: ``outcome`` is succeeded, failed, interrupted, preempted, not_needed
    # (a spare the job ended without) or cut_off (``cut_off``: out, the job may go on).
    "job_end": ("outcome", "exit_code"),
}
