"""A one-node launch's own run id: ``str(uuid.uuid4())``'s form, made without importing
``uuid`` (``tests/cli/test_launch_imports.py`` checks that it is not imported)."""

from __future__ import annotations

import uuid

from phalanx.rendezvous.local import LocalRendezvous, random_run_id


def test_a_run_id_reads_as_a_random_uuid4() -> None:
    ids = {random_run_id() for _ in range(500)}
    assert len(ids) == 500
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_a_local_rendezvous_without_a_run_id_makes_one() -> None:
    handler = LocalRendezvous()
    assert uuid.UUID(handler.run_id).version == 4
