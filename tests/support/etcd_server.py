"""Real etcd servers for tests: single members and 3-member clusters on free loopback ports.

Each member runs the ``etcd`` on PATH (``support.tools.ETCD``; Debian ``etcd-server``) with a fresh data directory
(on ``/dev/shm`` when possible: fsync on a shared disk is what makes etcd slow), is stopped by
its PID (SIGTERM, wait, SIGKILL, wait) and has its directory removed. Nothing here talks to
anything but 127.0.0.1 -- or, given ``host`` and ``prefix`` (``ip netns exec NAME``), the
address of a test network namespace the member runs in, whose health is then asked from
inside it.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from support.tools import ETCD

START_TIMEOUT = 60.0  # a 3-member cluster electing a leader on a loaded 2-core machine
STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate the certificates with ``openssl`` (EC keys: a fraction of a second)."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(
            ["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60
        )

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=phalanx test CA",
    )
    # etcd 3.4's JSON gateway dials its own gRPC port with the server certificate, so that
    # certificate must be valid for client authentication too.
    for name, usage in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
        (directory / f"{name}.ext").write_text(
            f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"
        )
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        )  # fmt: skip
    return TlsFiles(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )


def free_ports(count: int) -> list[int]:
    """Ports free right now on 127.0.0.1 (all held open together, so they are distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class EtcdMember:
    name: str
    client_url: str
    peer_url: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class EtcdCluster:
    """``size`` etcd members forming one cluster. Use ``start()`` / ``stop()`` (or ``with``)."""

    size: int = 1
    tls: TlsFiles | None = None
    extra_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"  # the address the members listen on
    prefix: tuple[str, ...] = ()  # runs each member (and its health check) elsewhere
    members: list[EtcdMember] = field(default_factory=list)
    root: Path | None = None

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    @property
    def endpoint_arg(self) -> str:
        """The members as ``--rdzv-endpoint`` spells them."""
        return ",".join(self.endpoints)

    def start(self) -> EtcdCluster:
        shm = Path("/dev/shm")
        base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix="phalanx-etcd-", dir=base))
        scheme = "https" if self.tls else "http"
        ports = free_ports(2 * self.size)
        for i in range(self.size):
            self.members.append(
                EtcdMember(
                    name=f"m{i}",
                    client_url=f"{scheme}://{self.host}:{ports[2 * i]}",
                    peer_url=f"http://{self.host}:{ports[2 * i + 1]}",
                    data_dir=self.root / f"m{i}",
                    log_path=self.root / f"m{i}.log",
                )
            )
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        token = uuid.uuid4().hex
        try:
            for member in self.members:
                self._spawn(member, cluster, token)
            deadline = time.monotonic() + START_TIMEOUT
            for member in self.members:
                self._wait_healthy(member, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop_member(self, index: int) -> None:
        """Stop one member by PID: SIGTERM, wait, SIGKILL, wait; prove it is gone."""
        member = self.members[index]
        process, member.process = member.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT)
        try:  # reaped by wait(): the PID must no longer exist
            os.kill(process.pid, 0)
        except ProcessLookupError:
            return
        raise AssertionError(f"etcd member {member.name} (pid {process.pid}) is still alive")

    def restart_member(self, index: int) -> None:
        """Start a member stopped by ``stop_member`` again on its kept data directory, so it
        rejoins the cluster it was in (not waited for: the caller watches what it does)."""
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self._spawn(
            self.members[index], cluster, "restart"
        )  # the token is only read on a new data dir

    def stop(self) -> None:
        """Stop every member and remove the data directories."""
        try:
            for i in range(len(self.members)):
                self.stop_member(i)
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def session(self) -> requests.Session:
        """A ``requests`` session that can talk to the members (TLS files set)."""
        session = requests.Session()
        session.trust_env = False  # loopback only: no proxies, no REQUESTS_CA_BUNDLE override
        if self.tls:
            session.verify = str(self.tls.ca)
            session.cert = (str(self.tls.client_cert), str(self.tls.client_key))
        return session

    def under(self, prefix: str) -> dict[str, bytes]:
        """Every key under ``prefix`` and its value, in key order, read straight from the
        first member (etcd's JSON gateway: a range from the prefix to the next one)."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        return self._range({"key": _b64(prefix), "range_end": _b64(end)})

    def value(self, key: str) -> bytes | None:
        """The value of ``key`` now, read straight from the first member (None: absent)."""
        return self._range({"key": _b64(key)}).get(key)

    def _range(self, body: dict[str, str]) -> dict[str, bytes]:
        with self.session() as session:
            reply = session.post(f"{self.endpoints[0]}/v3/kv/range", json=body, timeout=10)
        reply.raise_for_status()
        kvs = reply.json().get("kvs", [])
        return {
            base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
            for kv in kvs
        }

    def _spawn(self, member: EtcdMember, cluster: str, token: str) -> None:
        if ETCD is None:
            raise FileNotFoundError("etcd is not on PATH (Debian: etcd-server)")
        args = [
            *self.prefix,
            ETCD,
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={member.client_url}",
            f"--advertise-client-urls={member.client_url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={cluster}",
            f"--initial-cluster-token={token}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=warn",
        ]
        if self.tls:
            args += [
                f"--cert-file={self.tls.server_cert}",
                f"--key-file={self.tls.server_key}",
                f"--trusted-ca-file={self.tls.ca}",
                "--client-cert-auth",
            ]
        args += self.extra_args
        with open(member.log_path, "wb") as log:
            member.process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    def _wait_healthy(self, member: EtcdMember, deadline: float) -> None:
        """Poll ``/health`` (true once the cluster has a leader) until ``deadline``."""
        if self.prefix:
            return self._wait_healthy_inside(member, deadline)
        with self.session() as session:
            while True:
                assert member.process is not None
                if member.process.poll() is not None:
                    raise RuntimeError(
                        f"etcd {member.name} exited with {member.process.returncode}:\n"
                        f"{member.log_tail()}"
                    )
                try:
                    reply = session.get(f"{member.client_url}/health", timeout=2)
                    if reply.ok and reply.json().get("health") == "true":
                        return
                except (requests.RequestException, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"etcd {member.name} not healthy after {START_TIMEOUT} s:\n"
                        f"{member.log_tail()}"
                    )
                time.sleep(0.1)

    def _wait_healthy_inside(self, member: EtcdMember, deadline: float) -> None:
        """``_wait_healthy`` for a member behind ``prefix``: one probe process inside."""
        probe = (
            "import json, sys, time, urllib.request\n"
            "deadline = time.monotonic() + float(sys.argv[2])\n"
            "while time.monotonic() < deadline:\n"
            "    try:\n"
            "        with urllib.request.urlopen(sys.argv[1] + '/health', timeout=2) as r:\n"
            "            if json.load(r).get('health') == 'true':\n"
            "                sys.exit(0)\n"
            "    except (OSError, ValueError):\n"
            "        pass\n"
            "    time.sleep(0.1)\n"
            "sys.exit(1)\n"
        )
        left = max(1.0, deadline - time.monotonic())
        argv = [*self.prefix, sys.executable, "-c", probe, member.client_url, str(left)]
        if subprocess.run(argv, timeout=left + 30).returncode != 0:
            raise RuntimeError(
                f"etcd {member.name} not healthy after {START_TIMEOUT} s:\n{member.log_tail()}"
            )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def enable_auth(cluster: EtcdCluster, users: dict[str, tuple[str, str]]) -> None:
    """Turn on etcd auth through the JSON gateway (no ``etcdctl`` needed).

    ``users`` maps a name to ``(password, key prefix it may read and write)``; a ``root``
    user with the ``root`` role is added too, as etcd requires before ``auth/enable``.
    """
    url = f"{cluster.endpoints[0]}/v3/auth"
    calls: list[tuple[str, dict[str, Any]]] = [
        ("user/add", {"name": "root", "password": "root-secret"}),
        ("role/add", {"name": "root"}),
        ("user/grant", {"user": "root", "role": "root"}),
    ]
    for name, (password, prefix) in users.items():
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first key after the prefix
        perm = {"permType": "READWRITE", "key": _b64(prefix), "range_end": _b64(end)}
        calls += [
            ("user/add", {"name": name, "password": password}),
            ("role/add", {"name": f"{name}-role"}),
            ("role/grant", {"name": f"{name}-role", "perm": perm}),
            ("user/grant", {"user": name, "role": f"{name}-role"}),
        ]
    calls.append(("enable", {}))
    with cluster.session() as session:
        for path, body in calls:
            reply = session.post(f"{url}/{path}", json=body, timeout=10)
            reply.raise_for_status()


def authenticate(cluster: EtcdCluster, user: str, password: str) -> str:
    """A fresh auth token for ``user`` (what the store does, done by hand)."""
    with cluster.session() as session:
        reply = session.post(
            f"{cluster.endpoints[0]}/v3/auth/authenticate",
            json={"name": user, "password": password},
            timeout=10,
        )
        reply.raise_for_status()
        return str(reply.json()["token"])


def revoke_all_leases(cluster: EtcdCluster) -> int:
    """Revoke every lease on the cluster, as an operator (or an expiry) would; return how many."""
    base = cluster.endpoints[0]
    with cluster.session() as session:
        leases = session.post(f"{base}/v3/lease/leases", json={}, timeout=10).json()
        ids = [lease["ID"] for lease in leases.get("leases", [])]
        for lease_id in ids:
            session.post(f"{base}/v3/lease/revoke", json={"ID": lease_id}, timeout=10)
    return len(ids)


def leader_index(cluster: EtcdCluster) -> int:
    """Which running member leads the cluster now (its index in ``members``)."""
    with cluster.session() as session:
        for i, member in enumerate(cluster.members):
            if member.process is None:
                continue
            status = session.post(f"{member.client_url}/v3/maintenance/status", json={}, timeout=10)
            status.raise_for_status()
            body = status.json()
            if body.get("leader") == body["header"]["member_id"]:
                return i
    raise AssertionError("no running member says it is the leader")
