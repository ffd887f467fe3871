"""The durable-sse worker: the composition root.

Builds every client once (Temporal, the event log, Redis, HTTP) and the declared secrets
(``SSE_SECRETS``), waits for its dependencies with a bounded retry and a message naming
what it waits for, runs both workflows and all activities on one task queue, and shuts
down gracefully on SIGINT/SIGTERM: running connections are cancelled, flush their batch,
and return.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.runtime import Runtime
from temporalio.worker import (
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerDeploymentConfig,
)

from durable_sse.activities.attributes import SearchAttributeActivities
from durable_sse.activities.checkpoint import CheckpointActivities
from durable_sse.activities.nudge import NudgeActivities
from durable_sse.activities.read import ReadActivities
from durable_sse.activities.retention import RetentionActivities
from durable_sse.activities.schedule import ScheduleActivities
from durable_sse.config.deployment import DeploymentVersion
from durable_sse.config.secrets import DeclaredSecrets
from durable_sse.config.settings import Settings
from durable_sse.consume.retention import retention_holds
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.errors import ConfigError, StoreError
from durable_sse.ops import temporal_client
from durable_sse.ops.codec import data_converter_from_env
from durable_sse.ops.failover import Failover
from durable_sse.ops.liveness import WorkerLiveness
from durable_sse.ops.logs import configure_logging
from durable_sse.ops.metrics import (
    LivenessMetrics,
    prometheus_runtime,
    redis_failures_counter,
)
from durable_sse.ops.nudge import Nudges, nudge_channel
from durable_sse.ops.upgrade import UpgradeWaker
from durable_sse.reader.credentials import Credentials
from durable_sse.reader.heartbeat_policy import MAX_CONNECTIONS_PER_WORKER
from durable_sse.reader.metrics import CredentialMetrics
from durable_sse.reader.reports import PROGRESS_INTERVAL
from durable_sse.reader.successors import OVERLAP_LIMIT, Successors
from durable_sse.sse.transport import ShardedTransport
from durable_sse.stores import Stores
from durable_sse.workflows.checkpoint import CheckpointAdvanceWorkflow
from durable_sse.workflows.stream import StreamWorkflow

log = logging.getLogger(__name__)

HEARTBEAT_THROTTLE = timedelta(milliseconds=500)
"""Cancellation reaches an activity only on a heartbeat: keep signals prompt (~1 s), also
the heartbeat a nudge asks for (durable_sse/ops/nudge.py)."""
DEPENDENCY_WAIT = 60.0
GC_YOUNG_THRESHOLD = 50_000
"""Allocations between two young collections (Python's default: 700); see
:func:`tune_collector`."""
HANDOVER_GRACE = 1.5
"""Seconds the workflow worker keeps running at shutdown after the connections ended, so
that the results of those that could not move as retries (see :class:`WorkerRole`) are
routed from its cache."""
SHUTDOWN_GRACE = OVERLAP_LIMIT + 2.0
"""Seconds the activity worker lets its connections run at shutdown: each ends by itself
once its retry started elsewhere, or after :data:`OVERLAP_LIMIT` (plus its flush)."""
STORE_SLOTS = 100
"""Activity slots beyond the connections: checkpoint, gap and schedule activities."""
WORKFLOW_TASK_POLLS = 10
"""Workflow task polls open at once (the SDK's default is 5)."""
NONSTICKY_POLL_RATIO = 0.5
"""Of those, the share on the task queue itself rather than this worker's sticky queue (the
SDK's default, 0.2, leaves one). A run's first task, and the task of any run not in a
cache, comes from the task queue: with one poll open, 1,000 streams started together
waited 16 s (p50) for their first task, 8-10 s with five."""
ACTIVITY_TASK_POLLS = 10
"""Activity task polls open at once (the SDK's default is 5): a start burst schedules a
connection and two short activities per stream."""


class WorkerRole(Enum):
    """What one SDK worker of the process runs. The process runs two: one for the
    workflows, one for the activities. Connections then start through Temporal's matching
    on whichever worker polls, not eagerly where the workflow task ran, so they spread over
    the pool; and at SIGTERM the connections end first (each moves on as a retry from its
    last cursor; one that cannot returns its result) while this process's workflow cache
    still routes whatever results come, so no survivor replays a history for them. Tests
    that run a worker inside pytest use one that runs both."""

    ALL = "all"
    WORKFLOWS = "workflows"
    ACTIVITIES = "activities"

    @property
    def runs_workflows(self) -> bool:
        return self is not WorkerRole.ACTIVITIES

    @property
    def runs_activities(self) -> bool:
        return self is not WorkerRole.WORKFLOWS


WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()
"""Production workers run workflow code outside the SDK's sandbox. The sandbox imported
a run's workflow module afresh for every run it started (10-15 ms of CPU per run for
ours); with this package passed through it no longer did, and no longer checked our
code for restricted calls (``datetime.now()``, ``random``) either, yet it still cost
each activation its own import hooks and a call into the sandbox per payload: a fifth
of a worker's CPU per stream started, 43-45 ms against 33-36 ms without it
(``bench/run --only many --streams 1000``). The checks run wherever that code is
tested: the time-skipping tests and the replay of stored histories use the default
sandbox, with nothing passed through. The workflow modules hold no state but
constants."""


@dataclass
class WorkerResources:
    """Clients the activities share, built once per worker process."""

    stores: Stores
    http: httpx.AsyncClient
    nudges: Nudges

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerResources:
        return cls(
            stores=Stores.open(
                settings.database_url,
                # Retention keeps what consumer groups that hold it have not consumed.
                consumer_holds=retention_holds,
                l2=RedisCursors(
                    settings.redis_url,
                    ttl_days=settings.redis_cursor_ttl_days,
                    timeout=settings.redis_timeout,
                ),
            ),
            http=httpx.AsyncClient(
                follow_redirects=False, transport=ShardedTransport(), trust_env=False
            ),
            nudges=Nudges(
                settings.redis_url,
                channel=nudge_channel(
                    settings.temporal_namespace, settings.task_queue, settings.redis_url
                ),
                timeout=settings.redis_timeout,
            ),
        )

    async def close(self) -> None:
        await self.nudges.close()
        await self.http.aclose()
        await self.stores.close()


def build_worker(
    client: Client,
    resources: WorkerResources,
    *,
    task_queue: str,
    allowed_hosts: tuple[str, ...] | None = None,
    secrets: DeclaredSecrets | None = None,
    credentials: Credentials | None = None,
    progress_interval: float = PROGRESS_INTERVAL,
    retention: float | None = None,
    liveness: WorkerLiveness | None = None,
    balance: bool = False,
    deployment: DeploymentVersion | None = None,
    role: WorkerRole = WorkerRole.ALL,
    **options: Any,
) -> Worker:
    """The worker; without ``secrets`` no stream may name any secret; without
    ``credentials`` every secret's value is its environment variable's.

    ``progress_interval``: seconds between a connection's progress reports (tests shorten
    it). ``retention``: ``DURABLE_SSE_RETENTION``, for streams without their own.
    ``liveness``: the worker's lease (connections run and commit under it; None: none).
    ``balance``: with ``liveness``, hand connections over when this worker holds more than
    its share of the pool's (False: connections stay where they start).
    ``role``: what this SDK worker runs (:class:`WorkerRole`)."""
    options.setdefault("max_heartbeat_throttle_interval", HEARTBEAT_THROTTLE)
    options.setdefault("default_heartbeat_throttle_interval", HEARTBEAT_THROTTLE)
    successors = None
    if liveness is not None and role is WorkerRole.ACTIVITIES:
        # At shutdown connections hand over and read on until their retries start
        # (reader.successors); the SDK cancels what is left after the grace.
        successors = Successors(resources.stores.readers, peers=liveness.has_peers)
        options.setdefault("graceful_shutdown_timeout", timedelta(seconds=SHUTDOWN_GRACE))
    options.setdefault("graceful_shutdown_timeout", timedelta(seconds=0))
    # A worker takes no more connections than it can heartbeat in time (see
    # MAX_CONNECTIONS_PER_WORKER), plus room for the short store activities.
    options.setdefault("max_concurrent_activities", MAX_CONNECTIONS_PER_WORKER + STORE_SLOTS)
    # One cached run per stream plus its checkpoint runs: at the SDK's default (1,000) a
    # worker with a thousand streams would evict and replay histories on every activation.
    options.setdefault("max_cached_workflows", 5000)
    options.setdefault("workflow_runner", WORKFLOW_RUNNER)
    if deployment is not None:
        # Polls as this Worker Deployment Version, the workflows Pinned to it.
        options.setdefault("deployment_config", deployment_config(deployment))
    workflows = [StreamWorkflow, CheckpointAdvanceWorkflow] if role.runs_workflows else []
    if role.runs_workflows:
        options.setdefault(
            "workflow_task_poller_behavior", PollerBehaviorSimpleMaximum(WORKFLOW_TASK_POLLS)
        )
        options.setdefault("nonsticky_to_sticky_poll_ratio", NONSTICKY_POLL_RATIO)
    if not role.runs_activities:
        return Worker(client, task_queue=task_queue, workflows=workflows, **options)
    options.setdefault(
        "activity_task_poller_behavior", PollerBehaviorSimpleMaximum(ACTIVITY_TASK_POLLS)
    )
    schedules = ScheduleActivities(client, task_queue, resources.stores)
    reader = ReadActivities(
        http=resources.http,
        stores=resources.stores,
        secrets=secrets,
        credentials=credentials,
        allowed_hosts=allowed_hosts,
        progress_interval=progress_interval,
        nudges=resources.nudges,
        retention=retention,
        wake_checkpoint=schedules.wake,
        worker_lease=(lambda: liveness.worker_id) if liveness is not None else None,
        successors=successors,
    )
    if liveness is not None:
        liveness.on_revoked = reader.pool.lease_revoked
        if balance:
            liveness.shed = reader.pool.hand_over
    activities = [
        *reader.activities(),
        *NudgeActivities(resources.nudges).activities(),
        *CheckpointActivities(resources.stores, worker_retention=retention).activities(),
        *RetentionActivities(resources.stores, worker_retention=retention).activities(),
        *schedules.activities(),
        *SearchAttributeActivities(client).activities(),
    ]
    return Worker(
        client, task_queue=task_queue, workflows=workflows, activities=activities, **options
    )


def deployment_config(deployment: DeploymentVersion) -> WorkerDeploymentConfig:
    """Worker Versioning: poll as ``deployment``, every workflow Pinned to it (each run
    stays on the version it started on and moves at a continue-as-new; docs/deploys.md).
    Set here, not on ``@workflow.defn``: an unversioned worker refuses to
    complete a task of a workflow that declares a behaviour (the task times out)."""
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment.deployment_name, deployment.build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


async def wait_for(
    what: str,
    attempt: Callable[[], Awaitable[Any]],
    *,
    timeout: float,
    fatal: Callable[[Exception], bool] | None = None,
) -> Any:
    """Retry ``attempt`` until it succeeds or ``timeout`` passes, then fail naming ``what``
    in one line; an error ``fatal`` says waiting cannot fix fails at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.2
    while True:
        try:
            return await attempt()
        except Exception as error:  # noqa: BLE001 - reported below
            if fatal is not None and fatal(error):
                raise SystemExit(f"durable-sse worker: {error}") from None
            if loop.time() + delay > deadline:
                raise SystemExit(
                    f"durable-sse worker: gave up waiting for {what} after {timeout:g} s: {error}"
                ) from None
            log.info("waiting for %s: %s", what, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def connect_client(
    settings: Settings, *, runtime: Runtime | None = None, timeout: float = DEPENDENCY_WAIT
) -> Client:
    """The Temporal client, waited for; a namespace that does not exist ends the wait at
    once (waiting cannot create it)."""
    # Built once, outside the retry: a bad payload key is a configuration error, not
    # something to wait out.
    data_converter = data_converter_from_env()
    target = settings.temporal
    return await wait_for(
        target.describe(),
        lambda: temporal_client.connect(target, data_converter=data_converter, runtime=runtime),
        timeout=timeout,
        fatal=lambda error: isinstance(error, temporal_client.NamespaceNotFoundError),
    )


def build_credentials(settings: Settings, runtime: Runtime | None = None) -> Credentials:
    """The declared secrets' files and token endpoints, once per worker; every file is read
    now, so a missing, unreadable or empty one refuses the start (ConfigError)."""
    metrics = CredentialMetrics(runtime.metric_meter) if runtime is not None else None
    credentials = Credentials(
        {source.variable: source for source in settings.credentials},
        on_refresh=metrics.refreshed if metrics is not None else None,
    )
    credentials.load()
    for line in credentials.describe():
        log.info("secret %s", line)
    return credentials


def log_security_posture(settings: Settings, secrets: DeclaredSecrets) -> None:
    """Say at start what streams may reach: hosts, and which secret goes where (names)."""
    if settings.allowed_hosts is None:
        log.warning(
            "SSE_ALLOWED_HOSTS is unset: anyone who can start workflows on task queue %s "
            "can make this worker connect to any host (a development default; set it in "
            "production)",
            settings.task_queue,
        )
    if secrets.bindings:
        log.info("secrets streams may name: %s", ", ".join(map(str, secrets.bindings)))
    for name in secrets.unset():
        log.warning("SSE_SECRETS declares %s but it is not set on this worker", name)


async def report_redis_failures(resources: WorkerResources, runtime: Runtime) -> None:
    """Export L2's failure count (shared by every stream of this worker) as a counter."""
    counter = redis_failures_counter(runtime.metric_meter)
    reported = 0
    while True:
        await asyncio.sleep(5)
        failures = resources.stores.l2.write_failures if resources.stores.l2 else 0
        if failures > reported:
            counter.add(failures - reported)
            reported = failures


def tune_collector() -> None:
    """Keep the cyclic garbage collector from pausing a worker that holds many streams.

    A worker with a thousand connections holds some 770,000 objects the collector tracks,
    and at Python's default thresholds a full pass stopped it for 0.5-1 s every 6-8 s:
    every event that arrived meanwhile waited, which was the whole p99 cursor lag
    (issue 25, docs/benchmarks.md). What the worker holds once it is built (modules,
    workflow definitions, clients) lives as long as the process: frozen, the collector
    never scans it again. A higher young threshold runs the cheap passes a seventieth as
    often and ages fewer objects into the old generation, so full passes come rarely.
    Cyclic garbage waits a little longer to be freed (at most ``GC_YOUNG_THRESHOLD`` young
    objects); everything else is freed by reference counting as before.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def run_worker(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    handle_signals: bool = True,
    tune_gc: bool = True,
) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM), then shut down gracefully.

    ``tune_gc``: the process is the worker's (:func:`tune_collector`); a test that runs a
    worker inside its own process passes False."""
    stop = stop or asyncio.Event()
    if handle_signals:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    runtime = prometheus_runtime(settings.metrics_port) if settings.metrics_port else None
    credentials = build_credentials(settings, runtime)
    secrets = DeclaredSecrets(settings.secrets, sourced=credentials.sourced)
    log_security_posture(settings, secrets)
    client = await connect_client(settings, runtime=runtime)
    resources = WorkerResources.from_settings(settings)
    await wait_for("the database", resources.stores.create_schema, timeout=DEPENDENCY_WAIT)
    failover = Failover(client, task_queue=settings.task_queue)
    liveness = WorkerLiveness(
        resources.stores.workers,
        pool=f"{settings.temporal_namespace}:{settings.task_queue}",
        move=failover.move,
        unregistered=failover.unregistered,
        metrics=LivenessMetrics(runtime.metric_meter) if runtime is not None else None,
    )
    await wait_for(
        "the worker lease",
        liveness.start,
        timeout=DEPENDENCY_WAIT,
        fatal=lambda error: not isinstance(error, StoreError),
    )
    options: dict[str, Any] = dict(
        client=client,
        resources=resources,
        task_queue=settings.task_queue,
        allowed_hosts=settings.allowed_hosts,
        secrets=secrets,
        credentials=credentials,
        retention=settings.retention,
        liveness=liveness,
        balance=True,
        deployment=settings.deployment,
    )
    worker = build_worker(**options, role=WorkerRole.WORKFLOWS)
    readers = build_worker(**options, role=WorkerRole.ACTIVITIES)
    if tune_gc:
        tune_collector()
    log.info(
        "worker polling task queue %s of %s%s",
        settings.task_queue,
        settings.temporal.describe(),
        f" as version {settings.deployment}" if settings.deployment else " (unversioned)",
    )
    reporter = asyncio.create_task(report_redis_failures(resources, runtime)) if runtime else None
    if settings.metrics_port:
        log.info("Prometheus metrics on http://0.0.0.0:%d/metrics", settings.metrics_port)
    watching = asyncio.Event()
    watchdog = asyncio.create_task(liveness.run(watching))
    waker = (
        asyncio.create_task(
            UpgradeWaker(client, settings.deployment, task_queue=settings.task_queue).run(watching)
        )
        if settings.deployment is not None
        else None
    )
    try:
        async with worker:
            async with readers:
                await stop.wait()
                log.info("shutting down: running connections flush and return")
                await liveness.drain()
            # Their results reach this process's workflow cache, which starts the next
            # connections, on the workers still polling for them.
            await asyncio.sleep(HANDOVER_GRACE)
    finally:
        watching.set()
        await watchdog
        if waker is not None:
            await waker
        await liveness.leave()
        if reporter is not None:
            reporter.cancel()
        await credentials.aclose()
        await resources.close()


def main(*, log_format: str = "plain", profile: str | None = None) -> None:
    configure_logging(log_format)
    try:
        asyncio.run(run_worker(Settings.from_env(profile=profile)))
    except ConfigError as error:
        raise SystemExit(f"durable-sse worker: {error}") from None


if __name__ == "__main__":
    main()
