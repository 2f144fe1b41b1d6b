"""A long run under random faults: ``python benchmarks/soak.py --minutes 10 --every 30 --seed N``.

Three phalanx agents in network namespaces (``--nnodes 2:2``, one CPU worker each, so one
agent is a hot spare), the rendezvous on a real 3-member etcd in a fourth namespace; or
``--backend c10d``: four agents at ``--nnodes 3`` (one spare), the store served by node 0's
agent at first, every node's address a candidate (``--rdzv-endpoint a:p,b:p,c:p,d:p``) so the
store fails over when its host is lost, and the store's host (wherever it is now) gets no
fault but its own, "store host lost" (its agent and workers SIGKILLed; the agent is started
again once a successor serves, and joins the job there). The bundled
trainer (``soak_trainer.py``), and one fault every ``--every`` seconds drawn from ``--seed``
(each kind once before any repeats): worker SIGKILL, worker exception, worker hang (found by
the hang watch, on by default), agent SIGKILL, node cut off (link down, then up), node frozen
(SIGSTOP of its agent and workers, then SIGCONT), an etcd member killed and restarted, a full log disk on one
node (a filler file fills its tmpfs, then goes), a link flap (a node's link down 4 s, up 1 s,
three times: it loses the store and comes back as a new member, each time before its heartbeat
runs out), a spare frozen when chosen (the waiting agent SIGSTOPped, a member agent SIGKILLed
so that the spare is chosen, the spare SIGCONTed ``SPARE_HOLD`` later: the restart waits for
it), one node's guardian SIGKILLed (the job must go on untouched: a new guardian, no failure,
no restart). An agent that exits while the job is not done is started again on its node (it
rejoins as a spare). Writes ``report.json`` and
``timeline.html`` to ``--out`` and prints a table; exit 1 when an invariant fails.

The agents run at the soak's own pace (``CONF``, ``ETCD_CONF``, ``C10D_CONF``, ``HANG_WATCH``:
faults every 30 s, found within seconds). ``--default-timeouts`` drops all four: phalanx's
default rendezvous timeouts (heartbeat 1 s, ``heartbeat_timeout`` 10 s, last call 3 s, joins
600 s, exit barrier 300 s; on etcd ``lease_ttl`` 10 s, requests 5 s) and its default hang
watch, as a user who sets nothing gets them. What stays is what the harness needs to work at
all: ``--max-restarts 1000`` (the default, 0, ends the job at its first fault), the shape
(``--nnodes``, one worker per node, the endpoints, ``--rdzv-id``) and
``--preload torch._inductor.config`` (no timeout: the trainer's import, done once in the
template, as in every soak run, so the two compare); and the faults' own shapes (a cut or a
freeze of ``HOLD`` s, the flaps, ``SPARE_HOLD``: still below what counts a spare lost at the
defaults).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from soak_trainer import COLLECTIVE_HOLD, COLLECTIVE_KILL_SIGNAL, HANG_SIGNAL  # noqa: E402

from support.etcd_server import EtcdCluster  # noqa: E402
from support.hosts import NamespaceHosts, Node  # noqa: E402
from support.launch import remove_job_cgroups  # noqa: E402
from support.netns import NetNamespaces  # noqa: E402

KINDS = ("worker_kill", "worker_kill_in_collective", "worker_exception", "worker_hang",
         "agent_kill", "node_cut", "node_freeze", "etcd_member", "log_disk_full", "link_flap",
         "spare_freeze", "guardian_kill", "store_host_lost")  # fmt: skip
CONF = ("heartbeat_interval=0.5,heartbeat_timeout=6,last_call_timeout=1,join_timeout=300,"
        "exit_barrier_timeout=30")  # fmt: skip
# etcd's own keys (a c10d agent refuses them: the c10d variant had never started)
ETCD_CONF = "lease_ttl=4,request_timeout=3"
# c10d: a restart round below --nnodes 3 waits this long for one to join before it fails. When
# the store's host is lost the spare follows the job to the successor's store (``follow``)
# and the round closes as it joins; this is for a loss with no spare waiting (taken by an
# earlier fault), when only the lost host's agent, started again cold, can be the third.
C10D_CONF = "last_call_timeout=20"
HOLD = 10.0  # how long a cut, a freeze, a dead etcd member or a full disk lasts
FLAPS, FLAP_DOWN, FLAP_UP = 3, 4.0, 1.0  # a link flap: down 4 s, up 1 s, three times
# How long a spare stays frozen once chosen: below what counts it lost (c10d: heartbeat_timeout
# 6 s; etcd: lease_ttl 4 s, from its last renewal), so the restart round waits for it.
SPARE_HOLD = {"c10d": 5.0, "etcd": 2.5}
# --hang-watch: the default watch, its floor and factor lowered to the soak's pace (0.05 s
# steps): a hung rank is named after about 1 s and its round fails at 10x that, about 10 s
# (the faults come every 30 s). No --stall-timeout: the hangs are the default watch's.
HANG_WATCH = "floor=1,factor=3"
# What a fault must wait out by its nature at the soak's settings (``lost_split``), seconds:
# a hang fails its round at 10 x the watch's bound (FAIL_FACTOR x floor: 1 s here, 60 s at the
# defaults); a node cut off, frozen or flapping is found by its lease (etcd ``lease_ttl``) or
# its silence (c10d ``heartbeat_timeout``); a frozen spare is waited for while it is held
# (``waits``), and the job stalls while a doomed rank holds back before it kills itself in a
# collective (``COLLECTIVE_HOLD``).
NODE_KINDS = ("node_cut", "node_freeze", "link_flap")
WAITS = {  # (--default-timeouts, backend): seconds by kind
    (False, "etcd"): {"worker_hang": 10.0, **dict.fromkeys(NODE_KINDS, 4.0)},
    (False, "c10d"): {"worker_hang": 10.0, **dict.fromkeys(NODE_KINDS, 6.0)},
    (True, "etcd"): {"worker_hang": 600.0, **dict.fromkeys(NODE_KINDS, 10.0)},
    (True, "c10d"): {"worker_hang": 600.0, **dict.fromkeys(NODE_KINDS, 10.0)},
}


def waits(default_timeouts: bool, backend: str) -> dict[str, float]:
    """What each kind waits out by its nature (``soak_report.lost_split``), seconds by kind:
    ``WAITS``, the frozen spare's hold, and the in-collective kill's hold: the rank, told by
    a signal, finishes its step and holds back ``COLLECTIVE_HOLD`` before it SIGKILLs itself,
    and the others stall in the all-reduce all that time -- the fault's shape, not phalanx's
    reaction, which starts at the SIGKILL."""
    return {**WAITS[default_timeouts, backend], "spare_freeze": SPARE_HOLD[backend],
            "worker_kill_in_collective": COLLECTIVE_HOLD}  # fmt: skip
PORT = 29400  # c10d: the store's port on every candidate
# Per backend: agents, --nnodes (the world: one worker per member), the batch over it. c10d
# runs rounds of 3, the fewest that fail over (a survivor of 2 is no majority).
SHAPE = {"etcd": (3, "2:2", 2), "c10d": (4, "3", 3)}


def pace(backend: str, default_timeouts: bool) -> list[str]:
    """The agents' flags for the soak's own pace (its ``--rdzv-conf`` and ``--hang-watch``);
    none at phalanx's defaults (``--default-timeouts``)."""
    if default_timeouts:
        return []
    conf = f"{ETCD_CONF},{CONF}" if backend == "etcd" else f"{CONF},{C10D_CONF}"
    return ["--rdzv-conf", conf, "--hang-watch", HANG_WATCH]


def schedule(
    seed: int, minutes: float, every: float, kinds: tuple[str, ...]
) -> list[tuple[float, str]]:
    rng, order = random.Random(seed), list[str]()
    while len(order) < minutes * 60 // every:
        batch = list(kinds)
        rng.shuffle(batch)
        order += batch
    return [(every * (i + 1), kind) for i, kind in enumerate(order[: int(minutes * 60 // every)])]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out = args, Path(args.out)
        self.rng = random.Random(args.seed + 1)
        self.agents, self.nnodes, self.world = SHAPE[args.backend]
        self.spaces = NetNamespaces(4)
        self.hosts = NamespaceHosts(self.spaces)
        self.etcd: EtcdCluster | None = None
        self.nodes: list[Node] = []
        self.gens = [0] * self.agents
        self.all_logs: list[Path] = []
        self.pids = self.out / "pids"
        self.marks = self.out / "marks"  # each worker's first step: when the job was back
        self.steps_dir = self.out / "steps"  # each worker's last completed step
        self.job = self.out / "job"
        self.faults: list[dict[str, Any]] = []
        self.keys: list[int] = []
        self.failed = ""

    # -- setup -------------------------------------------------------------------------
    def start(self) -> None:
        for d in (self.pids, self.marks, self.steps_dir, self.job):
            d.mkdir(parents=True)
        cfg = json.loads((HERE.parent / "examples/configs/tiny.json").read_text())
        cfg.update(steps=self.args.steps, checkpoint_every=self.args.checkpoint_every,
                   log_every=self.args.checkpoint_every, keep=2)  # fmt: skip
        if self.world == 3:  # the batch splits evenly over 3 workers
            cfg.update(global_batch_size=24, dataset_size=480)
        (self.out / "config.json").write_text(json.dumps(cfg))
        self.spaces.create()
        for i in range(self.agents):
            disk = self.out / f"disk{i}"
            disk.mkdir()
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)], check=True
            )
        if self.args.backend == "etcd":
            self.etcd = EtcdCluster(size=3, host=self.spaces.addr(3),
                                    prefix=tuple(self.spaces.command(3, [])))  # fmt: skip
            self.etcd.start()
            endpoint = ",".join(u.split("//")[1] for u in self.etcd.endpoints)
        else:  # every node a candidate for the store, node 0's first
            endpoint = ",".join(f"{self.spaces.addr(i)}:{PORT}" for i in range(self.agents))
        self.rdzv = ["--rdzv-backend", self.args.backend, "--rdzv-endpoint", endpoint,
                     "--rdzv-id", "soak", *pace(self.args.backend, self.args.default_timeouts)]  # fmt: skip
        for i in range(self.agents):
            self.nodes.append(self._agent(i))

    def _agent(self, i: int) -> Node:
        self.gens[i] += 1
        name = f"n{i}g{self.gens[i]}"
        # --preload: the trainer's torch.use_deterministic_algorithms imports
        # torch._inductor.config, 1.1 s of every worker start here; the template does it once
        args = [*self.rdzv, "--nnodes", self.nnodes, "--nproc-per-node", "1", "--max-restarts", "1000",
                "--preload", "torch._inductor.config",
                str(HERE / "soak_trainer.py"), "--config",
                str(self.out / "config.json"), "--output_dir", str(self.job)]  # fmt: skip
        node = Node(self.hosts, i, args, self.out / f"disk{i}", name,
                    env={"SOAK_PIDS": str(self.pids), "SOAK_NODE": str(i), "SOAK_MARKS": str(self.marks),
                         "SOAK_STEPS": str(self.steps_dir), "SOAK_STEP_DELAY": str(self.args.step_delay)})  # fmt: skip
        self.all_logs.append(node.logs)
        return node

    # -- who is where --------------------------------------------------------------------
    def workers(self) -> dict[int, int]:
        """node -> pid of its live worker."""
        found = {}
        for f in self.pids.iterdir():
            pid = int(f.read_text() or 0)
            if pid and psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie":
                found[int(f.name.split(".")[0])] = pid
        return found

    def done(self) -> bool:
        return (self.job / "final.pt").exists()

    def keep_agents(self) -> None:
        """An agent that exited before the job was done is started again (it rejoins)."""
        for i, node in enumerate(self.nodes):
            if node.proc.poll() is not None and not self.done() and not self.over():
                self.nodes[i] = self._agent(i)

    def over(self) -> bool:
        """The job ended for good (its run id is closed): no agent can rejoin it. A member
        whose restart round could not form (too few nodes left) ended the job too: the agents
        the harness starts again would meet on a new store and resume from the checkpoint,
        which hid a lost job (seed 4141, a node cut then a link flap)."""
        ended = (b"the job stopped: round", b"waited as a spare (round",
                 b"the restart round could not form")  # fmt: skip
        for i, node in enumerate(self.nodes):
            err = node.err.read_bytes()  # a member's last line, or a spare's (not needed)
            if node.proc.poll() is not None and any(words in err for words in ended):
                self.failed = f"node {i}: " + node.err.read_text().strip().splitlines()[-1]
                return True
        return False

    def sample(self) -> dict[int, dict[str, int]]:
        """Each active agent's figures; ``hosts``: it serves the store (c10d: a successor
        starts to, with a connection and a thread per client: compared apart). Asked of each
        node's own namespace: ``store_host`` names the first that listens, and another may
        too for a moment (a cut-off member's store, one closing), which mislabeled the one
        serving the job's store as a client (its clients' descriptors counted as growth)."""
        got, active = {}, self.workers()
        for i, node in enumerate(self.nodes):
            if i not in active:
                continue  # a spare does less than an active agent: only active ones compare
            try:
                p = psutil.Process(node.proc.pid)
                if p.status() == "zombie":
                    continue
                # the agent is the python under `ip netns exec` (which execs it in place)
                got[i] = {"gen": self.gens[i], "rss": p.memory_info().rss, "threads": p.num_threads(),
                          "fds": p.num_fds(), "hosts": int(self._listens(i))}  # fmt: skip
            except psutil.Error:
                pass
        return got

    def steady_sample(self, within: float = 60.0) -> dict[int, dict[str, int]]:
        """``sample`` once the job trains again after the last fault, as the start sample is
        taken: both ranks past their first step, the same workers for 3 s (a sample taken
        mid-re-form would count the passing threads of a round's start and stop as growth)."""
        end = time.time() + within
        while time.time() < end and not self.done():
            self.keep_agents()  # (a store host lost last: its agent, started again, is awaited)
            before = self.workers()
            time.sleep(3)
            marked = {int(m.name.rsplit(".", 1)[1]) for m in self.marks.iterdir()}
            if (
                len(before) == self.world
                and self.workers() == before
                and set(before.values()) <= marked
            ):
                break
        return self.sample()

    def store_keys(self) -> int | None:
        if self.etcd is None:
            return None
        member = next(m for m in self.etcd.members if m.process is not None)
        body = json.dumps({"key": "AA==", "range_end": "AA==", "count_only": True})
        done = subprocess.run(self.spaces.command(3, ["curl", "-s", "-X", "POST", "-d", body,
                              f"{member.client_url}/v3/kv/range"]), capture_output=True, text=True)  # fmt: skip
        try:
            return int(json.loads(done.stdout).get("count", 0))
        except ValueError:
            return None

    def _etcd_leader(self, otherwise: int) -> int:
        """etcd: the member that leads now, the one whose loss costs most (an election; issue
        41 asks for it); ``otherwise`` when no member says it leads."""
        assert self.etcd is not None
        for i, member in enumerate(self.etcd.members):
            if member.process is None:
                continue
            asked = subprocess.run(self.spaces.command(3, ["curl", "-s", "-m", "5", "-X", "POST",
                                   "-d", "{}", f"{member.client_url}/v3/maintenance/status"]),
                                   capture_output=True, text=True)  # fmt: skip
            try:
                status = json.loads(asked.stdout)
            except ValueError:
                continue
            leader, own = status.get("leader"), status.get("header", {}).get("member_id")
            if leader and leader == own:
                return i
        return otherwise

    def store_host(self) -> int | None:
        """c10d: the node whose namespace serves the store's port (None: none, or etcd)."""
        for i in range(self.agents if self.args.backend == "c10d" else 0):
            if self._listens(i):
                return i
        return None

    def _listens(self, i: int) -> bool:
        """c10d: node ``i``'s namespace serves the store's port."""
        if self.args.backend != "c10d":
            return False
        listed = subprocess.run(self.spaces.command(i, ["ss", "-ltnH", f"sport = :{PORT}"]),
                                capture_output=True, text=True)  # fmt: skip
        return bool(listed.stdout.strip())

    # -- faults --------------------------------------------------------------------------
    def inject(self, kind: str) -> dict[str, Any]:
        workers = self.workers()
        host = self.store_host()
        eligible = sorted(n for n in workers if n != host)
        record: dict[str, Any] = {"kind": kind, "at": time.time()}
        if kind.startswith("worker_") or kind in (
            "agent_kill",
            "node_cut",
            "node_freeze",
            "log_disk_full",
            "link_flap",
            "spare_freeze",
            "guardian_kill",
            "store_host_lost",
        ):
            if not eligible:
                record["skipped"] = "no worker running"
                return record
            n = self.rng.choice(eligible if not kind.startswith("worker_") else sorted(workers))
            if kind == "store_host_lost":
                if host is None or host not in workers:
                    record["skipped"] = "the store's host runs no worker"
                    return record
                n = host
            record["node"] = n
        if kind == "worker_kill":
            os.kill(workers[n], signal.SIGKILL)
        elif kind == "worker_kill_in_collective":
            os.kill(workers[n], COLLECTIVE_KILL_SIGNAL)
        elif kind == "worker_exception":
            os.kill(workers[n], signal.SIGUSR1)
        elif kind == "worker_hang":
            os.kill(workers[n], HANG_SIGNAL)
        elif kind == "agent_kill":
            os.kill(self.nodes[n].proc.pid, signal.SIGKILL)
        elif kind == "node_cut":
            self.spaces.cut(n)
            self._hold()
            self.spaces.heal(n)
        elif kind == "node_freeze":
            tree = self._tree(self.nodes[n].proc.pid)
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGSTOP)
            self._hold()
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)
        elif kind == "etcd_member" and self.etcd is not None:
            k = self._etcd_leader(self.rng.randrange(3))
            record["member"] = k
            self.etcd.stop_member(k)
            self._hold()
            self.etcd.restart_member(k)
        elif kind == "link_flap":
            for _ in range(FLAPS):
                self.spaces.cut(n)
                time.sleep(FLAP_DOWN)  # the fault's shape, not a wait for a condition
                self.spaces.heal(n)
                time.sleep(FLAP_UP)
        elif kind == "spare_freeze":
            self._spare_freeze(n, workers, record)
        elif kind == "log_disk_full":
            filler = self.out / f"disk{n}" / "filler"
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)
            self._hold()
            filler.unlink()
        elif kind == "guardian_kill":
            record.update(self._kill_guardian(self.nodes[n].proc.pid))
        elif kind == "store_host_lost":
            record["successor"] = self._lose_store_host(n)
        record["ended"] = time.time()
        return record

    def _lose_store_host(self, n: int) -> int | None:
        """SIGKILL node ``n``'s agent and every process under it (the store's host lost
        whole), and wait (bounded) until another node serves the store: the node started
        again only then joins the successor's store (started sooner, before any successor
        serves, it would find no newer store and serve the first one again). Returns the
        successor (None: none within ``HOLD`` * 3 s)."""
        for p in reversed(self._tree(self.nodes[n].proc.pid)):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        end = time.time() + 3 * HOLD
        while time.time() < end and not self.done():
            host = self.store_host()
            if host is not None and host != n:
                return host
            time.sleep(0.2)
        return None

    def _spare_freeze(self, n: int, workers: dict[int, int], record: dict[str, Any]) -> None:
        """Freeze the spare (an agent without a worker), kill member ``n``'s agent so that
        the spare is chosen, resume the spare ``SPARE_HOLD`` later."""
        spares = [i for i, node in enumerate(self.nodes)
                  if i not in workers and node.proc.poll() is None]  # fmt: skip
        if not spares:
            record["skipped"] = "no spare waiting"
            return
        record["spare"] = spares[0]
        tree = self._tree(self.nodes[spares[0]].proc.pid)  # its agent and guardian
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGSTOP)
        try:
            os.kill(self.nodes[n].proc.pid, signal.SIGKILL)
            end = time.time() + SPARE_HOLD[self.args.backend]
            while time.time() < end and not self.done():
                time.sleep(0.2)
        finally:
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)

    def _kill_guardian(self, agent: int) -> dict[str, Any]:
        """SIGKILL the agent's guardian; which pid replaced it (None: none within HOLD s)."""

        def guardians() -> list[int]:
            found = []
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(agent).children():
                    with contextlib.suppress(psutil.Error):
                        if child.cmdline()[1:3] == ["-I", "-S"] and child.status() != "zombie":
                            found.append(child.pid)
            return found

        old = guardians()
        for pid in old:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        end = time.time() + HOLD
        while time.time() < end and not self.done():
            new = [pid for pid in guardians() if pid not in old]
            if new:
                return {"guardian": old, "replaced_by": new[0]}
            time.sleep(0.1)
        return {"guardian": old, "replaced_by": None}

    def _hold(self) -> None:
        end = time.time() + HOLD
        while time.time() < end and not self.done():
            time.sleep(0.2)

    @staticmethod
    def _tree(pid: int) -> list[psutil.Process]:
        try:
            p = psutil.Process(pid)
            return [p, *p.children(recursive=True)]
        except psutil.Error:
            return []

    # -- the run -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        plan = schedule(self.args.seed, self.args.minutes, self.args.every, self.kinds())
        print(
            f"soak: seed {self.args.seed}, {len(plan)} faults: {', '.join(k for _, k in plan)}",
            flush=True,
        )
        t0 = time.time()
        self.start()
        while len(self.workers()) < self.world:
            time.sleep(0.2)
            if time.time() - t0 > 180:
                raise RuntimeError("the job did not start")
        first = time.time()
        time.sleep(2)  # the round's first steps: the agents' threads and files all made
        start_sample, self.keys = self.sample(), [self.store_keys() or 0]
        # Every active agent's figures before each fault: an agent killed by the schedule is
        # compared over the part of the run it lived (no agent of the etcd run lives it all)
        history = [(0.0, start_sample)]
        for at, kind in plan:
            while time.time() - first < at and not self.done():
                self.keep_agents()
                time.sleep(0.2)
            if self.done() or self.over():
                break
            history.append((time.time() - first, self.sample()))
            record = self.inject(kind)
            print(f"soak: {record['at'] - first:7.1f} s {kind} {record.get('node', record.get('member', ''))} "
                  f"{record.get('skipped', '')}", flush=True)  # fmt: skip
            self.faults.append(record)
            self.keys.append(self.store_keys() or 0)
        end_sample = self.steady_sample()
        history.append((time.time() - first, end_sample))
        deadline = time.time() + self.args.minutes * 60 * 3 + 120
        while not self.done() and not self.over() and time.time() < deadline:
            self.keep_agents()
            time.sleep(0.2)
        finished = time.time() if self.done() else None
        self.keys.append(self.store_keys() or 0)
        for node in self.nodes:  # the spare leaves once the job is done
            try:
                node.proc.wait(60)
            except subprocess.TimeoutExpired:  # (said: its guardian outlives it a few seconds)
                print(f"soak: {node.err.name}'s agent, pid {node.proc.pid}, still ran 60 s after "
                      f"the job: SIGKILLed ({node.stderr.strip().splitlines()[-1][:200]})",
                      flush=True)  # fmt: skip
                node.kill()
        return {"t0": t0, "first_step": first, "finished": finished, "start_sample": start_sample,
                "end_sample": end_sample, "history": history}  # fmt: skip

    def kinds(self) -> tuple[str, ...]:
        chosen = tuple(self.args.kinds.split(",")) if self.args.kinds else KINDS
        other = "store_host_lost" if self.args.backend == "etcd" else "etcd_member"
        return tuple(k for k in chosen if k != other)

    def leftovers(self) -> dict[str, Any]:
        """What is left in the nodes' namespaces once every process phalanx started had its
        bounded time to end: a dead agent's guardian outlives it by design (its last word to
        the store, at most 6 s; the job cgroup's sweep, at most 5 s), and a template killed
        with its agent takes a moment to exit. Before, this looked at once after an agent's
        SIGKILL and listed those two (seed 7, the spare killed 60 s after the job ended)."""
        procs: dict[str, list[int]] = {}
        deadline = time.monotonic() + 15
        while True:
            for name in self.spaces.names[: self.agents]:
                argv = ["ip", "netns", "pids", name]
                listed = subprocess.run(argv, capture_output=True, text=True)
                procs[name] = [int(p) for p in listed.stdout.split()]
            if not any(procs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for name, pids in procs.items():
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    line = " ".join(psutil.Process(pid).cmdline())[:200]
                    print(f"soak: left in {name}: {pid} {line}", flush=True)
        from phalanx.supervisor.cgroup import hierarchies

        cgroups = [str(root / f"phalanx-{run.name}") for logs in self.all_logs if logs.is_dir()
                   for run in logs.iterdir() for root in hierarchies()
                   if (root / f"phalanx-{run.name}").exists()]  # fmt: skip
        return {"processes": procs, "cgroups": cgroups}

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        for logs in self.all_logs:
            remove_job_cgroups(logs)
        if self.etcd is not None:
            self.etcd.stop()
        for i in range(self.agents):  # the logs leave the tmpfs for the report before it goes
            disk = self.out / f"disk{i}"
            # symlinks kept as such: a killed agent leaves its ranks' progress links dangling
            shutil.copytree(disk, self.out / "logs" / disk.name, ignore=shutil.ignore_patterns("filler"),
                            dirs_exist_ok=True, symlinks=True)  # fmt: skip
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        self.all_logs = [self.out / "logs" / p.relative_to(self.out) for p in self.all_logs]
        self.spaces.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults come (10)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between faults (30)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (printed)")
    parser.add_argument("--backend", choices=("etcd", "c10d"), default="etcd")
    parser.add_argument("--kinds", default="", help="only these fault kinds (comma-separated)")
    parser.add_argument("--step-delay", type=float, default=0.05, help="seconds a step sleeps")
    parser.add_argument("--steps", type=int, default=0, help="default: --minutes at --step-delay")
    parser.add_argument("--checkpoint-every", type=int, default=40, help="steps (40: 2 s)")
    parser.add_argument("--out", default="", help="where report.json and the rest go")
    parser.add_argument("--default-timeouts", action="store_true",
                        help="phalanx's default rendezvous timeouts and hang watch: no "
                        "--rdzv-conf, no --hang-watch (see the module docstring)")  # fmt: skip
    args = parser.parse_args()
    # SIGTERM (a test's timeout) unwinds like ^C, so the namespaces, mounts and etcd go
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10**6)
    if not args.steps:
        args.steps = int(args.minutes * 60 / args.step_delay)
    if not args.out:
        args.out = f"/tmp/phalanx-soak-{os.getpid()}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)
    import soak_report as rep

    soak = Soak(args)
    try:
        clock = soak.run()
        left = soak.leftovers()
    finally:
        soak.stop()
    figures = rep.event_figures(soak.all_logs)
    rep.job_per_fault(soak.faults, rep.read_events(soak.all_logs), rep.read_marks(soak.marks))
    batch = json.loads((out / "config.json").read_text())["global_batch_size"]
    step = rep.step_seconds(soak.all_logs, batch)
    # (world 3, c10d: the same resumes; world 2: the sum of two floats has no order)
    resumes = rep.resumed_from(soak.all_logs) if soak.world > 2 else None
    ref = rep.reference(out, soak.world, resumes)
    same = soak.done() and rep.same_weights(soak.job / "final.pt", ref)
    count, bad = rep.checkpoints_loadable(soak.job / "checkpoints")
    wall = (clock["finished"] or time.time()) - clock["first_step"]
    harness_ettr = min(1.0, args.steps * args.step_delay / wall)
    # the job's own step time (the delay, the step's work and the checkpoints) as training
    job_ettr = None if step is None else min(1.0, args.steps * step / wall)
    main_run = figures["ettr_by_run"]
    ettr = min((r["ettr"] for r in main_run), default=None)
    held = waits(args.default_timeouts, args.backend)
    split = None if step is None else rep.lost_split(soak.faults, held, wall, args.steps * step)
    rerun = rep.rerun_steps(soak.all_logs, soak.steps_dir)
    lives = rep.agent_lives(clock["history"])
    grew = [life for life in lives if rep.grew(life["first"], life["last"])]
    leftovers_found = any(left["processes"].values()) or bool(left["cgroups"])
    # a killed guardian must cost the job nothing: replaced, and no failure in its window
    touched = [f for f in soak.faults if f["kind"] == "guardian_kill" and "skipped" not in f
               and ("seen_as" in f or f.get("replaced_by") is None)]  # fmt: skip
    report = {
        "seed": args.seed, "backend": args.backend, "minutes": args.minutes, "every": args.every,
        "default_timeouts": args.default_timeouts, "steps": args.steps, "job_failed": soak.failed, "faults": soak.faults, "kinds": sorted({f["kind"] for f in soak.faults}),
        "finished": clock["finished"] is not None, "wall_s": wall, "ettr_harness": harness_ettr,
        "ettr_job": job_ettr, "step_s": step, "lost_split": split, "ettr_events": ettr, "by_kind": rep.by_kind(soak.faults), "figures": figures, "bit_identical": same, "rerun": rerun, "checkpoints": count,
        "checkpoints_bad": bad, "leftovers": left, "store_keys": soak.keys,
        "agents_start": clock["start_sample"], "agents_end": clock["end_sample"], "agents_grew": grew,
        "agents_compared": lives, "guardian_kills_touched": touched,
    }  # fmt: skip
    rep.write(out, report)
    # the page of the run that saw most (the longest-lived agent's)
    runs = sorted((Path(r) for r in figures["runs"] if (Path(r) / "events.jsonl").exists()),
                  key=lambda r: (r / "events.jsonl").stat().st_size, reverse=True)  # fmt: skip
    if runs:
        subprocess.run([sys.executable, "-m", "phalanx", "timeline", str(runs[0]), "-o",
                        str(out / "timeline.html")], capture_output=True)  # fmt: skip
    print(rep.table(soak.faults))
    print(
        f"seed {args.seed}: {len(soak.faults)} faults of {len(report['kinds'])} kinds; "
        f"finished {report['finished']} in {wall:.1f} s; ETTR: {job_ettr and round(job_ettr, 3)} "
        f"(steps x the job's own step time {step and round(step, 4)} s / wall), {harness_ettr:.3f} "
        f"(steps x the {args.step_delay} s delay / wall), lowest agent run's events {ettr}"
    )
    if split:
        print(
            f"lost {split['lost']:.1f} s: down {split['down']:.1f} s ({split['waited']:.1f} s of it "
            f"waited out by the faults' nature at these settings, {split['reaction']:.1f} s "
            f"phalanx's reaction) + {split['rest']:.1f} s steps run again since the last "
            f"checkpoint and slower first steps; ETTR with the waits taken out "
            f"{split['ettr_without_waits']:.3f}"
        )
    print(
        f"steps run again: {rerun['total']} over {len(rerun['per_restart'])} restarts ("
        + ", ".join(f"{p['reached']}->{p['resumed']}" for p in rerun["per_restart"])
        + "; the step a worker had reached -> the step the next round resumed from)"
    )
    for kind, cost in report["by_kind"].items():
        print(
            f"  {kind:<17} {cost['count']:>2} faults, down median {cost['median_down']:6.2f} s, "
            f"total {cost['total_down']:7.2f} s"
        )
    print(
        f"final weights bit-identical: {same}; checkpoints {count} loadable, bad {bad}; "
        f"leftovers {leftovers_found}; store keys {soak.keys}; agents grew {grew or 'no'}"
    )
    print("agents compared (node, generation: seconds of the run, start -> end): " + "; ".join(
        f"{a['node']}g{a['gen']}: {a['from_s']:.0f}-{a['to_s']:.0f} s, threads {a['first']['threads']}"
        f"->{a['last']['threads']}, fds {a['first']['fds']}->{a['last']['fds']}, RSS "
        f"{a['first']['rss'] >> 20}->{a['last']['rss'] >> 20} MiB" for a in lives))  # fmt: skip
    if touched:
        print(f"a killed guardian touched the job (a failure, or no new guardian): {touched}")
    if soak.failed:
        print(f"the job ended before its last step: {soak.failed}")
    print(f"report: {out / 'report.json'}")
    ok = same and not bad and not leftovers_found and not grew and report["finished"]
    ok = ok and not touched
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
