"""The rendezvous timeouts, parsed from ``--rdzv-conf key=value`` pairs.

Every key is used, known to torchrun, or rejected: an unknown key is a ``UsageError`` that
names it, says the nearest known key and lists the keys the chosen backend knows, on one node
as on many. torchrun's spellings are accepted. ``timeout`` is ``join_timeout`` for static and
etcd (torchrun's static and etcd handlers read it so); torchrun's c10d and etcd-v2 handlers
never read it, so there it is accepted and not used, as is etcd's ``etcd_prefix`` (each said
in one line at start: ``unused_keys``).

=========================  =========  =============================================================
key (aliases)              default    meaning
=========================  =========  =============================================================
``join_timeout``           600        seconds ``next_round`` may wait for a round to form before
(``timeout``: static, etcd)           it raises ``RendezvousError`` (also: a waiting node's limit)
``last_call_timeout``      3          with MIN <= nodes < MAX present, seconds to wait for more
                                      before the round starts (torchrun waits a fixed 30)
``close_timeout``          30         seconds a node waits for the round's membership and master
                                      port to be published once the round has closed
``heartbeat_interval``     1          seconds between heartbeats (and a quarter of it between
(``keep_alive_interval``)             checks for peer events)
``heartbeat_timeout``      10         a node silent this long is lost (peers see ``NODE_LOST``;
                                      on etcd the node's lease decides instead: ``lease_ttl``);
                                      also how long an unreachable store is tolerated; c10d and
                                      static need >= 2 + 2 x heartbeat_interval to fence in time
                                      (``fencing``: the backend's check refuses less)
``keep_alive_max_attempt`` --         torchrun's way to say heartbeat_timeout: this many
                                      heartbeat intervals
``read_timeout``           60         seconds one store operation may take (c10d, static)
``exit_barrier_timeout``   300        after success, seconds ``shutdown`` waits for the other
                                      nodes to finish, so the store host outlives its clients
=========================  =========  =============================================================

Backend-specific keys (``is_host`` and ``store_type`` for c10d, etcd's TLS options) are
validated by the backend; see ``registry``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from phalanx.errors import UsageError
from phalanx.parsing import did_you_mean


@dataclass(frozen=True)
class RendezvousSettings:
    """Timeouts of the multi-node rendezvous, in seconds (see the module table)."""

    join_timeout: float = 600.0
    last_call_timeout: float = 3.0
    close_timeout: float = 30.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    read_timeout: float = 60.0
    exit_barrier_timeout: float = 300.0

    @property
    def event_interval(self) -> float:
        """How often the background thread looks for peer events."""
        return self.heartbeat_interval / 4


# --rdzv-conf key -> RendezvousSettings field
_SECONDS_KEYS = {
    "join_timeout": "join_timeout",
    "last_call_timeout": "last_call_timeout",
    "close_timeout": "close_timeout",
    "heartbeat_interval": "heartbeat_interval",
    "keep_alive_interval": "heartbeat_interval",
    "heartbeat_timeout": "heartbeat_timeout",
    "read_timeout": "read_timeout",
    "exit_barrier_timeout": "exit_barrier_timeout",
}
_ATTEMPTS_KEY = "keep_alive_max_attempt"
# torchrun's static and etcd handlers wait ``timeout`` seconds for the others; its c10d and
# etcd-v2 handlers never read the key (``unused_keys``).
_TIMEOUT_IS_JOIN = frozenset({"static", "etcd"})
# Keys torchrun's backends read that phalanx has no use for: key -> the backends.
_UNUSED = {"timeout": frozenset({"c10d", "etcd-v2"}), "etcd_prefix": frozenset({"etcd", "etcd-v2"})}
SETTINGS_KEYS = frozenset({*_SECONDS_KEYS, _ATTEMPTS_KEY, *_UNUSED})


def _field(key: str, backend: str) -> str | None:
    if key == "timeout" and backend in _TIMEOUT_IS_JOIN:
        return "join_timeout"
    return _SECONDS_KEYS.get(key)


def known_keys(backend: str, backend_keys: Collection[str]) -> frozenset[str]:
    """Every --rdzv-conf key ``backend`` accepts (``backend_keys``: its own)."""
    usable = {key for key, backends in _UNUSED.items() if backend in backends}
    return frozenset({*_SECONDS_KEYS, _ATTEMPTS_KEY, *usable, *backend_keys}) | (
        {"timeout"} if backend in _TIMEOUT_IS_JOIN else set()
    )


def unknown_key(key: str, backend: str, known: Collection[str]) -> str:
    """The problem with an unknown key: the key, never its value (it may be a misspelt
    secret's), the nearest known one, and all of them."""
    return (
        f"--rdzv-conf {key}: unknown key for {backend}{did_you_mean(key, known)} "
        f"(known: {', '.join(sorted(known))})"
    )


def unused_keys(conf: Mapping[str, str], backend: str) -> list[str]:
    """One line per key given that torchrun's ``backend`` accepts and phalanx does not use."""
    return [
        f"--rdzv-conf {key}: accepted as torchrun does, not used ({backend} never reads it)"
        for key in conf
        if backend in _UNUSED.get(key, ()) and _field(key, backend) is None
    ]


_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


def parse_bool(key: str, text: str, problems: list[str]) -> bool | None:
    """torchrun's boolean spellings; appends a problem and returns None for anything else."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    problems.append(f"--rdzv-conf {key}={text}: expected true or false")
    return None


def positive_seconds(key: str, text: str, problems: list[str]) -> float | None:
    """``text`` as a positive, finite number of seconds, or None with a problem recorded."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        problems.append(f"--rdzv-conf {key}={text}: expected a positive number of seconds")
        return None
    return value


def settings_problems(
    conf: Mapping[str, str], backend: str, backend_keys: Collection[str]
) -> tuple[RendezvousSettings, list[str]]:
    """Parse the rendezvous keys of ``conf``; return the settings and every problem found.

    Keys in ``backend_keys`` are the backend's own and are skipped here. Any other key that
    is not a rendezvous key is reported with the full list of keys ``backend`` knows.
    """
    problems: list[str] = []
    values: dict[str, float] = {}
    spelled: dict[str, str] = {}  # field -> the key that set it
    attempts: int | None = None
    known = known_keys(backend, backend_keys)
    for key, text in conf.items():
        field = _field(key, backend)
        if field is not None:
            if field in spelled:
                problems.append(f"--rdzv-conf sets {field} twice ({spelled[field]} and {key})")
                continue
            spelled[field] = key
            seconds = positive_seconds(key, text, problems)
            if seconds is not None:
                values[field] = seconds
        elif key == _ATTEMPTS_KEY:
            try:
                attempts = int(text)
            except ValueError:
                attempts = 0
            if attempts < 1:
                problems.append(f"--rdzv-conf {key}={text}: expected a positive integer")
                attempts = None
        elif key not in known:
            problems.append(unknown_key(key, backend, known))
    if _ATTEMPTS_KEY in conf and "heartbeat_timeout" in spelled:
        problems.append(
            "--rdzv-conf: give heartbeat_timeout or keep_alive_max_attempt, not both "
            "(heartbeat_timeout = keep_alive_max_attempt x heartbeat_interval)"
        )
    elif attempts is not None:
        interval = values.get("heartbeat_interval", RendezvousSettings.heartbeat_interval)
        values["heartbeat_timeout"] = attempts * interval
    settings = RendezvousSettings(**values)
    if settings.heartbeat_timeout < 2 * settings.heartbeat_interval:
        problems.append(
            f"--rdzv-conf: heartbeat_timeout ({settings.heartbeat_timeout:g} s) must be at "
            f"least twice heartbeat_interval ({settings.heartbeat_interval:g} s), or a slow "
            "heartbeat would count as a lost node"
        )
    return settings, problems


def parse_settings(
    conf: Mapping[str, str], backend: str = "c10d", backend_keys: Collection[str] = ()
) -> RendezvousSettings:
    """Like ``settings_problems`` but raises ``UsageError`` listing every problem."""
    settings, problems = settings_problems(conf, backend, backend_keys)
    if problems:
        raise UsageError(problems)
    return settings
