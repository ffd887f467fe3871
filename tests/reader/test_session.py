"""What a retried attempt takes from the one before it: a death is suspected, a hand-over
is not."""

from __future__ import annotations

from dataclasses import asdict

from durable_sse.contracts import ReadInput, ReadProgress
from durable_sse.reader.session import ReadSession, progress_from_details
from tests.reader.intake_helpers import spec


def session(previous: ReadProgress | None, *, retried: bool = True) -> ReadSession:
    return ReadSession(
        ReadInput(spec=spec()),
        previous=previous,
        retried=retried,
        new_gap_id=lambda: "g1",
        now_iso=lambda: "2026-01-01T00:00:00+00:00",
    )


def test_a_retry_replaces_a_death_unless_the_attempt_before_handed_over() -> None:
    assert session(None).replaces_a_death
    assert session(ReadProgress(cursor="40", start_cursor="20")).replaces_a_death
    handed = ReadProgress(cursor="40", start_cursor="40", handed_over=True)
    assert not session(handed).replaces_a_death
    assert not session(None, retried=False).replaces_a_death


def test_a_hand_over_survives_the_heartbeat_details_round_trip() -> None:
    handed = ReadProgress(cursor="40", start_cursor="40", handed_over=True)
    assert progress_from_details(asdict(handed)) == handed
    # details of an older worker, which never sent the field: a death
    older = {"cursor": "40", "start_cursor": "20", "first_id": None, "counts": {}}
    progress = progress_from_details(older)
    assert progress is not None and not progress.handed_over
