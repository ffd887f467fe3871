"""The plain rules of a resting checkpoint schedule (durable_sse.cursor.rest)."""

from __future__ import annotations

from durable_sse.cursor.rest import (
    REST_NOTE,
    WAKE_CHECK_CAP,
    caught_up,
    may_rest,
    paused_by_rest,
    wake_check_after,
    wake_check_due,
)
from durable_sse.ids import IdOrder, sort_key


def key(event_id: str) -> bytes:
    return sort_key(event_id, IdOrder.NUMERIC)


def test_caught_up_means_the_lagging_id_is_the_newest_id() -> None:
    assert caught_up(key("1000"), key("1000"))
    assert not caught_up(key("999"), key("1000"))  # numeric order, not text order
    assert not caught_up(None, key("1"))  # nothing advanced yet
    assert caught_up(None, None)  # no event with an id: nothing can ever move
    assert caught_up(key("5"), None)


def test_only_a_caught_up_stream_with_nothing_to_delete_rests() -> None:
    assert may_rest(caught_up=True, retention_applies=False)
    assert not may_rest(caught_up=False, retention_applies=False)
    assert not may_rest(caught_up=True, retention_applies=True)
    assert not may_rest(caught_up=True, retention_applies=None)  # a worker that did not say


def test_a_connection_checks_on_its_first_move_and_after_a_pause() -> None:
    window = 600.0
    after = wake_check_after(window)
    assert after == WAKE_CHECK_CAP
    assert wake_check_after(2.0) == 0.5  # a quarter of a short window
    due = dict(retry_at=None, replay_window=window)
    assert wake_check_due(last_move=None, now=5.0, **due)
    assert not wake_check_due(last_move=100.0, now=101.0, **due)  # a busy stream: no read
    assert wake_check_due(last_move=100.0, now=100.0 + after, **due)
    # A rest needs the newest key to be a whole window old: the first move after one is
    # always three quarters of a window past the check's threshold.
    assert window - after >= 0.75 * window


def test_a_failed_wake_is_tried_again_after_its_delay() -> None:
    assert not wake_check_due(last_move=None, retry_at=30.0, now=10.0, replay_window=600.0)
    assert wake_check_due(last_move=9.0, retry_at=30.0, now=30.0, replay_window=600.0)


def test_only_a_rest_note_is_ours_to_lift() -> None:
    assert paused_by_rest(True, REST_NOTE)
    assert not paused_by_rest(True, "maintenance")
    assert not paused_by_rest(False, REST_NOTE)
    assert not paused_by_rest(True, None)
