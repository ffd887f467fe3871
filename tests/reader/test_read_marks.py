"""How far back a drop notice may speak: a replay window *and* ``CONFIRM_IDS`` ids."""

from __future__ import annotations

from durable_sse.reader.read_marks import ReadMark, ReadMarks


def marks_every_second(count: int, *, window: float = 10.0, ids: int = 4) -> ReadMarks:
    """One batch of one id per second: id ``n`` read at second ``n``."""
    marks = ReadMarks(window=window, ids=ids)
    for n in range(1, count + 1):
        marks.add(ReadMark(float(n), n, str(n)))
    return marks


def test_a_young_connection_reaches_back_to_its_start() -> None:
    assert marks_every_second(3).reach(5.0, 3) is None


def test_on_a_busy_stream_the_window_bounds_the_reach() -> None:
    assert marks_every_second(30).reach(30.0, 30) == "20"


def test_on_a_quiet_stream_the_ids_bound_the_reach() -> None:
    """Seed 102888770: ids read long ago, then one more and a late notice. Time alone
    would reach back to the last id before the silence, after the skip."""
    marks = marks_every_second(6)
    marks.add(ReadMark(100.0, 7, "57"))
    assert marks.reach(100.0, 7) == "3"


def test_the_reach_only_moves_forward_and_keeps_one_mark_beyond_it() -> None:
    marks = marks_every_second(50)
    assert marks.reach(50.0, 50) == "40"
    assert marks.reach(60.0, 50) == "46"
    assert len(marks._marks) == 5
