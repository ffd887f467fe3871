"""What a consumer process records, and how it is exported.

A consumer runs in the user's own process, which is not a Temporal worker. It records
through the same interface as the worker (temporalio's ``MetricMeter``), so the names,
units and exporter are the worker's:

* a process that runs nothing else: ``serve_metrics(port)`` starts temporalio's own
  Prometheus exporter on ``http://host:port/metrics`` (no Temporal server is involved: a
  ``Runtime`` is only the SDK's native core, which also carries the exporter) and returns
  its meter;
* a process that already has a Temporal ``Runtime`` (a Temporal worker or client that
  consumes too): pass ``runtime.metric_meter``, and one endpoint serves both;
* nothing given: nothing is recorded (``MetricMeter.noop``).

Names (prefixed ``durable_sse_consumer_``, labels ``group`` and ``stream``):
``lag_seconds`` (gauge: now minus the receive time of the oldest event not consumed, 0
when caught up), ``lag_events`` (gauge: events not consumed, sampled), ``handler_latency
_seconds`` (histogram: from an event's ``received_at`` to the handler receiving it, the
oldest event of each batch), ``events`` and ``batches`` (counters), ``redeliveries``
(counter: batches delivered again), ``dead_letters`` (counter), ``parked`` (gauge: 1
while the group is parked on the stream).
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from durable_sse.consume.model import Batch, Event

PREFIX = "durable_sse_consumer_"

_RUNTIMES: list[Runtime] = []
"""Runtimes started here live as long as the process (their exporter with them)."""


def serve_metrics(port: int, host: str = "0.0.0.0") -> MetricMeter:
    """Serve Prometheus metrics on ``http://host:port/metrics``; the meter to record to."""
    runtime = Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=f"{host}:{port}", durations_as_seconds=True)
        )
    )
    _RUNTIMES.append(runtime)
    return runtime.metric_meter


class ConsumerMetrics:
    """One group's instruments in this process."""

    def __init__(self, meter: MetricMeter | None, group: str) -> None:
        self.enabled = meter is not None
        meter = (meter or MetricMeter.noop).with_additional_attributes({"group": group})
        self.lag_seconds = meter.create_gauge_float(
            PREFIX + "lag_seconds",
            "Now minus receive time of the oldest event not consumed (0: caught up)",
            "s",
        )
        self.lag_events = meter.create_gauge(
            PREFIX + "lag_events", "Events stored and not consumed yet (sampled)"
        )
        self.handler_latency = meter.create_histogram_float(
            PREFIX + "handler_latency_seconds",
            "From an event's receive time to the handler (oldest event of each batch)",
            "s",
        )
        self.events = meter.create_counter(PREFIX + "events", "Events handed to the handler")
        self.batches = meter.create_counter(PREFIX + "batches", "Batches consumed")
        self.redeliveries = meter.create_counter(
            PREFIX + "redeliveries", "Batches delivered again (a failure, a crash, a lost lease)"
        )
        self.dead_letters = meter.create_counter(
            PREFIX + "dead_letters", "Poison items moved to sse_dead_letters"
        )
        self.parked = meter.create_gauge(
            PREFIX + "parked", "1 while the group is parked on the stream (a poison item)"
        )

    def record_handler_latency(self, batch: Batch) -> None:
        """From the receive time of the batch's oldest event to now (the handler gets it)."""
        for item in batch.items:
            if isinstance(item, Event):
                latency = (datetime.now(UTC) - item.received_at).total_seconds()
                self.handler_latency.record(max(latency, 0.0), {"stream": batch.stream})
                return

    def record_consumed(self, batch: Batch) -> None:
        """A batch is consumed: count it and its events, and the lag its newest event left."""
        events = sum(1 for item in batch.items if isinstance(item, Event))
        attributes = {"stream": batch.stream}
        self.batches.add(1, attributes)
        self.events.add(events, attributes)
        newest = next((item for item in reversed(batch.items) if isinstance(item, Event)), None)
        if newest is not None:
            lag = (datetime.now(UTC) - newest.received_at).total_seconds()
            self.lag_seconds.set(max(lag, 0.0), attributes)
