"""The etcd backend's options: ``--rdzv-endpoint`` and the ``--rdzv-conf`` keys, validated.

Keys (torchrun's spellings of its etcd backends are accepted as aliases):

============================  =================================================================
``protocol``                  ``http`` or ``https`` for endpoints written without a scheme
                              (default: ``https`` when a TLS file is given, else ``http``)
``cacert`` (``ca_cert``)      CA bundle that signed the etcd server certificates
``cert`` (``ssl_cert``)       client certificate, with ``key``, for ``--client-cert-auth``
``key`` (``ssl_cert_key``)    the client certificate's private key
``user``                      etcd user (auth enabled); the token is renewed when it expires
``password_file``             file holding the user's password (one trailing newline dropped)
``password``                  the password itself: shown by ``ps`` and kept in shell history,
                              so a warning says so; prefer ``password_file`` or the
                              environment variable ``PHALANX_ETCD_PASSWORD``
``request_timeout``           seconds one store operation may take over all endpoints (5)
``lease_ttl``                 seconds an ephemeral key outlives a silent owner (10; at least 3,
                              so that a node cut off from etcd can fence in time: ``fencing``)
============================  =================================================================

The password is never echoed: an error names the key (a misspelt key's value is not shown),
the options' ``repr`` leaves it out, and the workers never get it (``phalanx.rendezvous.credentials``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from dataclasses import field as option_field  # `field` names a key's field below
from urllib.parse import quote, urlsplit

from phalanx.errors import UsageError
from phalanx.rendezvous.credentials import ETCD_PASSWORD_ENV
from phalanx.rendezvous.settings import (
    SETTINGS_KEYS,
    known_keys,
    positive_seconds,
    unknown_key,
)

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
    "password_file": "password_file",
    "request_timeout": "request_timeout",
    "lease_ttl": "lease_ttl",
}

CONF_KEYS = frozenset(_SPELLINGS)


@dataclass(frozen=True)
class EtcdOptions:
    """How to reach etcd: TLS files, credentials, timeouts."""

    protocol: str | None = None  # scheme for endpoints written without one; None: by TLS files
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = option_field(default=None, repr=False)  # never printed
    # Where the password came from, for messages: a --rdzv-conf key or the variable's name.
    password_source: str | None = option_field(default=None, compare=False)
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
    conf: dict[str, str],
    *,
    rendezvous_keys: Collection[str] = SETTINGS_KEYS,
    environ: Mapping[str, str] | None = None,
) -> EtcdOptions:
    """Validate the etcd keys of ``--rdzv-conf``; report every problem at once as ``UsageError``.

    Keys in ``rendezvous_keys`` (by default the rendezvous timeouts of ``settings``) are the
    rendezvous's to check and are skipped; any other unknown key is an error listing the
    known ones. The password comes from ``password``, ``password_file`` or, failing both,
    ``PHALANX_ETCD_PASSWORD`` in ``environ`` (default ``os.environ``).
    """
    problems: list[str] = []
    given = _given(conf, rendezvous_keys, problems)
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
    password, source = _password(text, os.environ if environ is None else environ, problems)
    if password is not None and "user" not in text:
        problems.append(f"--rdzv-conf: a password is given ({source}) without user")
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
        password=password,
        password_source=source,
        **numbers,
    )


def _given(
    conf: dict[str, str], rendezvous_keys: Collection[str], problems: list[str]
) -> dict[str, tuple[str, str]]:
    """The etcd keys of ``conf`` by field: (the spelling given, its value); an unknown key
    or a field given twice is added to ``problems``."""
    given: dict[str, tuple[str, str]] = {}
    for name, value in conf.items():
        field = _SPELLINGS.get(name)
        if field is None:
            if name not in rendezvous_keys:
                # Not its value: a misspelt "pasword=..." must not print the password.
                problems.append(unknown_key(name, "etcd", known_keys("etcd", CONF_KEYS)))
        elif field in given:
            problems.append(f"--rdzv-conf sets {field} twice ({given[field][0]} and {name})")
        else:
            given[field] = (name, value)
    return given


def _password(
    text: dict[str, str], environ: Mapping[str, str], problems: list[str]
) -> tuple[str | None, str | None]:
    """(password, where it came from); every message names the key, never the value."""
    if "password" in text and "password_file" in text:
        problems.append("--rdzv-conf: give password or password_file, not both")
        return None, None
    if "password" in text:
        return text["password"], "--rdzv-conf password"
    path = text.get("password_file")
    if path is None:
        value = environ.get(ETCD_PASSWORD_ENV)
        return (value, ETCD_PASSWORD_ENV) if value else (None, None)
    where = f"--rdzv-conf password_file={path}"
    try:
        with open(path, encoding="utf-8") as handle:
            secret = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        problems.append(f"{where}: cannot read it ({why or exc.__class__.__name__})")
        return None, None
    secret = secret.removesuffix("\n").removesuffix("\r")  # as `echo pw > file` writes it
    if not secret:
        problems.append(f"{where}: the file is empty")
        return None, None
    return secret, "--rdzv-conf password_file"


def credential_warnings(options: EtcdOptions, endpoints: list[str]) -> list[str]:
    """What the agent says once at start about how the password is given and sent."""
    if options.password is None:
        return []
    notes = []
    if options.password_source == "--rdzv-conf password":
        notes.append(
            "the etcd password is given as --rdzv-conf password=..., which ps and shell "
            f"history show; use password_file=PATH or {ETCD_PASSWORD_ENV} instead"
        )
    plain = [url for url in endpoints if url.startswith("http://")]
    if plain:
        notes.append(
            f"the etcd password travels over plain http to {', '.join(plain)}, readable by "
            "anyone on the path; use https (--rdzv-conf cacert=...)"
        )
    return notes


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
