"""The id orders: one definition of "newer" shared by Python, SQL and the Redis script."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sse.ids import (
    MAX_CONTIGUOUS_DIGITS,
    IdOrder,
    compare_ids,
    contiguous_number,
    is_newer,
    is_successor,
    newest,
    sort_key,
)


def sign(value: int) -> int:
    return (value > 0) - (value < 0)


def test_numeric_orders_by_value_across_digit_lengths() -> None:
    ids = ["100000", "1000", "999", "10", "9", "0", "99999"]
    ordered = sorted(ids, key=lambda i: sort_key(i, IdOrder.NUMERIC))
    assert ordered == ["0", "9", "10", "999", "1000", "99999", "100000"]
    assert compare_ids("999", "1000", "numeric") == -1
    assert compare_ids("10000000000000000000001", "9999999999999999999999", "numeric") == 1


def test_numeric_ignores_leading_zeros_and_puts_text_first() -> None:
    assert compare_ids("007", "7", "numeric") == 0
    assert compare_ids("abc", "0", "numeric") == -1
    assert compare_ids("12a", "3", "numeric") == -1  # not all digits: text
    assert compare_ids("b", "a", "numeric") == 1


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("1700000000:9", "1700000000:10"),
        ("171-9", "171-10"),
        ("1699999999-5", "1700000000-0"),
        ("a2", "a10"),
        ("x1", "xa"),  # a digit run sorts before text at the same position
        ("a", "a1"),
        ("v2-9", "v10-1"),
        ("item-09", "item-10"),
    ],
)
def test_natural_order_examples(older: str, newer: str) -> None:
    assert compare_ids(older, newer, "natural") == -1
    assert compare_ids(newer, older, "natural") == 1
    assert sort_key(older, "natural") < sort_key(newer, "natural")


def test_lexicographic_is_utf8_bytes() -> None:
    ulid_a, ulid_b = "01HZ0000000000000000000002", "01HZ0000000000000000000010"
    assert compare_ids(ulid_a, ulid_b, "lexicographic") == -1
    assert compare_ids("999", "1000", "lexicographic") == 1
    assert compare_ids("z", "é", "lexicographic") == -1


def test_is_newer_and_newest() -> None:
    assert is_newer("10", "9", "numeric")
    assert not is_newer("9", "10", "numeric")
    assert not is_newer("9", "9", "numeric")
    assert is_newer("1", None, "numeric") and is_newer("1", "", "numeric")
    assert not is_newer(None, "1", "numeric") and not is_newer("", None, "numeric")
    assert newest(["9", None, "10", "", "2"], "numeric") == "10"
    assert newest(["9", None, "10", "", "2"], "lexicographic") == "9"
    assert newest([None, ""], "natural") is None


def test_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError):
        sort_key("1", "chronological")


# -- reference implementations -------------------------------------------------------


def reference_numeric(a: str, b: str) -> int:
    def key(event_id: str) -> tuple[int, int | bytes]:
        if event_id and event_id.isascii() and event_id.isdigit():
            return (1, int(event_id))
        return (0, event_id.encode("utf-8"))

    key_a, key_b = key(a), key(b)
    return (key_a > key_b) - (key_a < key_b)


def reference_lexicographic(a: str, b: str) -> int:
    key_a, key_b = a.encode("utf-8"), b.encode("utf-8")
    return (key_a > key_b) - (key_a < key_b)


_RUNS = re.compile(r"[0-9]+|[^0-9]+")


def reference_natural(a: str, b: str) -> int:
    """Runs compared one by one: numbers by value, text by bytes, a number before text."""
    runs_a, runs_b = _RUNS.findall(a), _RUNS.findall(b)
    for run_a, run_b in zip(runs_a, runs_b, strict=False):
        digits_a, digits_b = run_a[0] in "0123456789", run_b[0] in "0123456789"
        if digits_a and digits_b:
            result = sign(int(run_a) - int(run_b))
        elif digits_a != digits_b:
            return -1 if digits_a else 1
        else:
            result = reference_lexicographic(run_a, run_b)
        if result:
            return result
    return sign(len(runs_a) - len(runs_b))


REFERENCES = {
    "numeric": reference_numeric,
    "lexicographic": reference_lexicographic,
    "natural": reference_natural,
}

# Ids never hold NUL (the SSE parser ignores such ids) nor lone surrogates.
any_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    max_size=24,
)
id_like = st.text(alphabet="0123456789-:._abzAZé", max_size=24)
ids = st.one_of(any_text, id_like, st.integers(min_value=0, max_value=10**30).map(str))


@pytest.mark.parametrize("order", sorted(REFERENCES))
@settings(max_examples=400)
@given(a=ids, b=ids)
def test_compare_ids_agrees_with_the_reference(order: str, a: str, b: str) -> None:
    assert compare_ids(a, b, order) == REFERENCES[order](a, b)


# -- contiguous_number: ids of a contiguous_ids stream (issue #13, case 3) ---------------


@pytest.mark.parametrize(
    ("event_id", "number"),
    [
        ("0", 0),
        ("7", 7),
        ("007", 7),
        ("18446744073709551616", 2**64),
        ("9" * MAX_CONTIGUOUS_DIGITS, 10**MAX_CONTIGUOUS_DIGITS - 1),
        ("", None),
        ("²", None),  # isdigit() is true, int() raises
        ("1²", None),
        ("١٢", None),  # Arabic-Indic digits: int() would accept them
        ("１２", None),  # fullwidth
        ("+1", None),
        ("-1", None),
        (" 1", None),
        ("1 ", None),
        ("1_000", None),  # int() accepts underscores
        ("1e3", None),
        ("9" * (MAX_CONTIGUOUS_DIGITS + 1), None),
        ("1" * 4301, None),  # int() refuses over 4,300 digits
        ("1" * 1_000_000, None),
    ],
)
def test_contiguous_number(event_id: str, number: int | None) -> None:
    assert contiguous_number(event_id) == number


@given(st.text(max_size=60))
def test_contiguous_number_never_raises(event_id: str) -> None:
    number = contiguous_number(event_id)
    if number is not None:
        assert re.fullmatch(r"[0-9]{1,40}", event_id)
        assert number == int(event_id)


def test_only_the_next_number_is_a_successor() -> None:
    """No id sorts between n and n + 1 in the numeric order: the successor alone shows a
    history reaching the cursor without a witness."""
    assert is_successor("8", "7") and is_successor("100", "099")
    assert not is_successor("9", "7") and not is_successor("7", "7")
    assert not is_successor("6", "7")
    assert not is_successor("8", "7a") and not is_successor("+8", "7")
    assert not is_successor("²", "1")
