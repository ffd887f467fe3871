"""Our own metrics, recorded through Temporal's metric meter (a connection's own are
:class:`durable_sse.reader.metrics.ReaderMetrics`).

One Prometheus endpoint (the Temporal runtime's exporter, ``SSE_METRICS_PORT``) then
serves both the SDK's metrics and these. Labels are the stream name and small enums
(route, drop kind); never URLs or event ids, whose cardinality is unbounded.

Names (all prefixed ``durable_sse_``): ``events_persisted``, ``duplicates``,
``dropped_by_horizon`` (events not stored: their id sorts at or before the retention horizon),
``drop_signals{kind}``, ``reconnects{route}``, ``lagged_replays``, ``events_recovered``,
``events_unrecoverable``, ``gaps_unrecoverable``, ``ids_out_of_order``, ``ids_reused``,
``reconnects_without_cursor`` (reconnects that could not resume: a ``no_resume`` gap each),
``suspicions``, ``suspicions_closed``, ``suspicions_recovered`` (``verify_reconnects``),
``redis_write_failures``, ``batch_persist_seconds`` (histogram), ``cursor_lag_seconds``
(gauge: now - receive time of the newest persisted event), ``retention_deleted_rows``
(rows retention deleted), ``retention_oldest_kept_timestamp_seconds`` (gauge: receive time
of the oldest row still stored, Unix seconds); per worker, ``failovers`` (connections moved
off dead workers), ``failover_detect_seconds`` (histogram: a dead worker's last renewal to
its streams being moved), ``handovers`` (connections handed over to spread the load),
``lease_revocations`` (this worker's own lease found revoked).
"""

from __future__ import annotations

from datetime import datetime

from temporalio.common import MetricMeter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from durable_sse.reader.metrics import PREFIX


def prometheus_runtime(port: int, host: str = "0.0.0.0") -> Runtime:
    """A Temporal runtime that exports every metric on ``http://host:port/metrics``."""
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=f"{host}:{port}", durations_as_seconds=True)
        )
    )


class WorkflowMetrics:
    """What the stream workflow records (replay-safe through ``workflow.metric_meter()``)."""

    def __init__(self, meter: MetricMeter, stream: str) -> None:
        meter = meter.with_additional_attributes({"stream": stream})
        self._reconnects = meter.create_counter(PREFIX + "reconnects", "Connections by route")
        self.lagged_replays = meter.create_counter(
            PREFIX + "lagged_replays", "Replays started to repair a gap"
        )
        self.events_unrecoverable = meter.create_counter(
            PREFIX + "events_unrecoverable", "Events lost for good (outside the replay window)"
        )
        self.gaps_unrecoverable = meter.create_counter(
            PREFIX + "gaps_unrecoverable",
            "Gaps closed with events lost for good (exact count or unknown size)",
        )
        self.suspicions = (
            meter.create_counter(
                PREFIX + "suspicions",
                "Reconnects suspected of silent skips and re-read (verify_reconnects)",
            ),
            meter.create_counter(
                PREFIX + "suspicions_closed", "Suspicions closed (re-read, or out of history)"
            ),
            meter.create_counter(
                PREFIX + "suspicions_recovered",
                "Events re-reading a suspicion stored that were missing",
            ),
        )
        """Opened, closed, recovered (``StreamCounters.suspicions*``)."""

    def reconnect(self, route: str) -> None:
        self._reconnects.add(1, {"route": route})


class RetentionMetrics:
    """What one retention run records (the ``apply_retention`` activity)."""

    def __init__(self, meter: MetricMeter, stream: str) -> None:
        meter = meter.with_additional_attributes({"stream": stream})
        self.deleted_rows = meter.create_counter(
            PREFIX + "retention_deleted_rows", "Rows retention deleted from the event log"
        )
        self.oldest_kept = meter.create_gauge_float(
            PREFIX + "retention_oldest_kept_timestamp_seconds",
            "Receive time of the oldest row still stored (Unix seconds)",
            "s",
        )

    def record(self, deleted: int, oldest_kept_at: datetime | None) -> None:
        self.deleted_rows.add(deleted)  # 0 too: the series exists from the first run
        if oldest_kept_at is not None:
            self.oldest_kept.set(oldest_kept_at.timestamp())


def redis_failures_counter(meter: MetricMeter):  # noqa: ANN201 - SDK counter type
    return meter.create_counter(
        PREFIX + "redis_write_failures", "L2 cursor writes dropped because Redis failed"
    )


class LivenessMetrics:
    """What a worker's liveness lease and watchdog record (:mod:`durable_sse.ops.liveness`):
    connections moved off dead workers, how long a dead worker went unnoticed, connections
    handed over to spread the load, and this worker's own leases revoked."""

    def __init__(self, meter: MetricMeter) -> None:
        self.failovers = meter.create_counter(
            PREFIX + "failovers", "Connections moved off workers taken for dead"
        )
        self.failover_detect_seconds = meter.create_histogram_float(
            PREFIX + "failover_detect_seconds",
            "Seconds from a dead worker's last lease renewal to its streams being moved",
            unit="s",
        )
        self.handovers = meter.create_counter(
            PREFIX + "handovers", "Connections handed over to spread the pool's load"
        )
        self.lease_revocations = meter.create_counter(
            PREFIX + "lease_revocations", "Times this worker found its own lease revoked"
        )
