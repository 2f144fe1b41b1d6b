"""The etcd backend's options: ``--rdzv-endpoint`` and the ``--rdzv-conf`` keys, validated.

Keys (torchrun's spellings of its etcd backends are accepted as aliases):

============================  =================================================================
``protocol``                  ``http`` or ``https`` for endpoints written without a scheme
                              (default: ``https`` when a TLS file is given, else ``http``)
``cacert`` (``ca_cert``)      CA bundle that signed the etcd server certificates
``cert`` (``ssl_cert``)       client certificate, with ``key``, for ``--client-cert-auth``
``key`` (``ssl_cert_key``)    the client certificate's private key
``user``, ``password``        etcd user (auth enabled); the token is renewed when it expires
``request_timeout``           seconds one store operation may take over all endpoints (5)
``lease_ttl``                 seconds an ephemeral key outlives a silent owner (10)
============================  =================================================================
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from phalanx.errors import UsageError
from phalanx.rendezvous.settings import SETTINGS_KEYS, positive_seconds

DEFAULT_PORT = 2379

_SPELLINGS = {
    "protocol": "protocol",
    "cacert": "cacert",
    "ca_cert": "cacert",
    "cert": "cert",
    "ssl_cert": "cert",
    "key": "key",
    "ssl_cert_key": "key",
    "user": "user",
    "password": "password",
    "request_timeout": "request_timeout",
    "lease_ttl": "lease_ttl",
}


@dataclass(frozen=True)
class EtcdOptions:
    """How to reach etcd: TLS files, credentials, timeouts."""

    protocol: str | None = None  # scheme for endpoints written without one; None: by TLS files
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = None
    # One operation, all endpoints and retries included. Below heartbeat_timeout (10), so a
    # lost etcd is reported with its endpoints and why each failed, not only as silence.
    request_timeout: float = 5.0
    lease_ttl: float = 10.0  # seconds an ephemeral key outlives its silent owner

    @property
    def scheme(self) -> str:
        if self.protocol is not None:
            return self.protocol
        return "https" if self.cacert or self.cert else "http"


def etcd_options_from_conf(
    conf: dict[str, str], *, rendezvous_keys: Collection[str] = SETTINGS_KEYS
) -> EtcdOptions:
    """Validate the etcd keys of ``--rdzv-conf``; report every problem at once as ``UsageError``.

    Keys in ``rendezvous_keys`` (by default the rendezvous timeouts of ``settings``) are the
    rendezvous's to check and are skipped; any other unknown key is an error listing the
    known ones.
    """
    problems: list[str] = []
    given: dict[str, tuple[str, str]] = {}  # field -> (spelling, value)
    for name, value in conf.items():
        field = _SPELLINGS.get(name)
        if field is None:
            if name not in rendezvous_keys:
                known = ", ".join(sorted(_SPELLINGS))
                problems.append(
                    f"--rdzv-conf {name}={value}: unknown key for etcd (known: {known})"
                )
        elif field in given:
            problems.append(f"--rdzv-conf sets {field} twice ({given[field][0]} and {name})")
        else:
            given[field] = (name, value)
    text = {field: value for field, (_, value) in given.items()}

    protocol = text.get("protocol")
    if protocol is not None and protocol not in ("http", "https"):
        problems.append(f"--rdzv-conf protocol={protocol}: expected http or https")
    for field in ("cacert", "cert", "key"):
        path = text.get(field)
        if path is not None and not os.path.isfile(path):
            problems.append(f"--rdzv-conf {given[field][0]}={path}: no such file")
    if ("cert" in text) != ("key" in text):
        problems.append("--rdzv-conf: cert and key go together (a client certificate and its key)")
    if "password" in text and "user" not in text:
        problems.append("--rdzv-conf: password given without user")
    numbers = {
        f: seconds
        for f in ("request_timeout", "lease_ttl")
        if f in text and (seconds := positive_seconds(f, text[f], problems)) is not None
    }
    if problems:
        raise UsageError(problems)
    return EtcdOptions(
        protocol=protocol,
        cacert=text.get("cacert"),
        cert=text.get("cert"),
        key=text.get("key"),
        user=text.get("user"),
        password=text.get("password"),
        **numbers,
    )


def parse_endpoints(text: str, *, scheme: str = "http") -> list[str]:
    """``host[:port][,host[:port]...]`` (``http(s)://`` allowed, IPv6 in brackets) -> base URLs."""
    problems: list[str] = []
    urls: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        url = item if "://" in item else f"{scheme}://{item}"
        try:
            parts = urlsplit(url)
            port = parts.port or DEFAULT_PORT
        except ValueError:
            parts, port = None, 0
        if (
            not item
            or parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.username
        ):
            problems.append(
                f"--rdzv-endpoint {text!r}: {item!r} is not host[:port] or http(s)://host[:port]"
            )
            continue
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        urls.append(f"{parts.scheme}://{host}:{port}")
    if problems:
        raise UsageError(problems)
    return urls


def run_prefix(run_id: str) -> str:
    """The key prefix of one run. The run id is quoted, so no run's keys nest inside another's."""
    if not run_id:
        raise UsageError("--rdzv-id is empty: the etcd backend needs a run id")
    return f"/phalanx/runs/{quote(run_id, safe='')}/"
