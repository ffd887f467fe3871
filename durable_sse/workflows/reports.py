"""What ``StreamWorkflow`` logs and exports after a connection: workflow code (its logger
and metric meter replay-safe), apart from the decisions, which are :mod:`workflows.routes`'.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_sse.config.durations import format_duration
    from durable_sse.config.spec import StreamSpec
    from durable_sse.contracts import Outcome, ReadResult, StreamCounters
    from durable_sse.ops.metrics import WorkflowMetrics
    from durable_sse.workflows.routes import Decision

Suspicions = tuple[int, int, int]
"""``(suspicions, closed, recovered)`` of a stream's counters."""


def suspicions(counters: StreamCounters) -> Suspicions:
    return (counters.suspicions, counters.suspicions_closed, counters.suspicions_recovered)


def log_decision(
    spec: StreamSpec,
    decision: Decision,
    result: ReadResult | None,
    refused: str | None,
    *,
    warn_retry_cap: bool,
) -> None:
    """Say what a connection's end decided: a capped ``retry:`` (when ``warn_retry_cap``,
    once per run), a refusal, a 204, the first reconnect that could not resume."""
    if decision.retry_capped_from_ms is not None and warn_retry_cap:
        workflow.logger.warning(
            "the server asks to wait retry: %d ms before reconnecting; the stream "
            "waits max_retry_delay (%s) at most (logged once per run)",
            decision.retry_capped_from_ms,
            format_duration(spec.max_retry_delay),
        )
    if refused is not None:
        workflow.logger.warning("stream refused, parked until resumed: %s", refused)
    elif result is not None and result.outcome == Outcome.NO_CONTENT:
        workflow.logger.info("server answered 204: stopped until resumed")
    if decision.first_without_cursor:
        workflow.logger.warning(
            "stream %s has no ids to resume from: each reconnect loses what the server "
            "sent while no connection was open (recorded as gaps of kind no_resume, of "
            "unknown size; counted in reconnects_without_cursor). Nothing on our side "
            "can resume such a stream: the server must send ids (the SSE id: field). "
            "Warned once per stream.",
            spec.name,
        )
    if decision.replay_finished:
        workflow.logger.info("requested replay finished")


def report_suspicions(name: str, counters: StreamCounters, before: Suspicions) -> None:
    """Export what ``verify_reconnects`` suspected, closed and recovered since ``before``
    (the counters as the connection started)."""
    now = suspicions(counters)
    if now == before:
        return
    metrics = WorkflowMetrics(workflow.metric_meter(), name)
    for counter, new, old in zip(metrics.suspicions, now, before, strict=True):
        if new > old:
            counter.add(new - old)
    if now[2] > before[2]:
        workflow.logger.warning(
            "stream %s: re-reading a reconnect brought back %d events the server had "
            "skipped without a notice that arrived (verify_reconnects)",
            name,
            now[2] - before[2],
        )


def report_unrecoverable(
    name: str, counters: StreamCounters, events: int, gaps: int, *, no_resume: int = 0
) -> None:
    """Export what became unrecoverable and warn; gaps of a reconnect that could not
    resume (``no_resume``, at most that many of ``gaps``) were warned of once per
    stream, so they alone log no warning."""
    if gaps <= 0 and events <= 0:
        return
    metrics = WorkflowMetrics(workflow.metric_meter(), name)
    if events > 0:
        metrics.events_unrecoverable.add(events)
    if gaps > 0:
        metrics.gaps_unrecoverable.add(gaps)
    if events <= 0 and gaps <= no_resume:
        return
    workflow.logger.warning(
        "UNRECOVERABLE GAP on stream %s: %d more events lost for good beyond the "
        "server's history (%d gaps so far, %d events counted, %d of unknown size)",
        name,
        events,
        counters.gaps_unrecoverable,
        counters.events_unrecoverable,
        counters.gaps_unknown_size,
    )
