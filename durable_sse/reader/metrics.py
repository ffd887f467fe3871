"""What one connection records, through Temporal's metric meter.

Labels are the stream name and small enums (the drop signal's kind); never URLs or event
ids, whose cardinality is unbounded. The names are listed in :mod:`durable_sse.ops.metrics`.
"""

from __future__ import annotations

from temporalio.common import MetricMeter

PREFIX = "durable_sse_"
"""Every metric of ours starts with it."""


class ReaderMetrics:
    """What one connection records; built per activity execution with its stream label."""

    def __init__(self, meter: MetricMeter, stream: str) -> None:
        meter = meter.with_additional_attributes({"stream": stream})
        self._meter = meter
        self.events_persisted = meter.create_counter(
            PREFIX + "events_persisted", "Events newly stored in the event log"
        )
        self.duplicates = meter.create_counter(
            PREFIX + "duplicates", "Events re-delivered and already stored"
        )
        self.dropped_by_horizon = meter.create_counter(
            PREFIX + "dropped_by_horizon",
            "Events not stored: their id sorts at or before the retention horizon",
        )
        self.events_recovered = meter.create_counter(
            PREFIX + "events_recovered", "Events a replay stored that were missing"
        )
        self.ids_out_of_order = meter.create_counter(
            PREFIX + "ids_out_of_order",
            "Ids not newer than the one before them under the stream's id_order",
        )
        self.ids_reused = meter.create_counter(
            PREFIX + "ids_reused",
            "Events whose id was stored already with other data (kept, not duplicates)",
        )
        self.reconnects_without_cursor = meter.create_counter(
            PREFIX + "reconnects_without_cursor",
            "Reconnects with no id to resume from: what the server sent meanwhile is lost",
        )
        self.batch_persist = meter.create_histogram_float(
            PREFIX + "batch_persist_seconds", "Time to commit one batch", "s"
        )
        self.cursor_lag = meter.create_gauge_float(
            PREFIX + "cursor_lag_seconds",
            "Now minus receive time of the newest persisted event",
            "s",
        )

    def auth_failure(self, status_code: int) -> None:
        """A server refused the stream's credentials (401, or 403 ``invalid_token``)."""
        self._meter.create_counter(
            PREFIX + "auth_failures", "Refusals of a stream's credentials (401, 403)"
        ).add(1, {"status": str(status_code)})

    def drop_signal(self, kind: str) -> None:
        self._meter.create_counter(PREFIX + "drop_signals", "Drop signals seen").add(
            1, {"kind": kind}
        )


class CredentialMetrics:
    """What the worker's credentials record (:mod:`durable_sse.reader.credentials`): one
    count per changed file read and per token request, labelled with the variable's
    name (declared by the worker: few, and never a value), its form and the result."""

    def __init__(self, meter: MetricMeter) -> None:
        self._refreshes = meter.create_counter(
            PREFIX + "credential_refreshes",
            "Secret files read again after a change, and OAuth2 token requests",
        )

    def refreshed(self, variable: str, form: str, ok: bool) -> None:
        self._refreshes.add(
            1, {"credential": variable, "form": form, "result": "ok" if ok else "failed"}
        )
