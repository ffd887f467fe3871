"""Wake the streams still on an older version once this worker's version is their target.

Changing a Worker Deployment's current (or ramping) version creates no workflow task:
a stream that is reading, waiting, parked or paused learns that its target version
changed only at its next task, which for an idle stream may be hours away. So the
workers of the new version, once it is current or ramping, send the update ``upgrade``
(it does nothing) to each running stream whose ``TemporalWorkerDeploymentVersion`` is
another one (or none: a stream started before the deployment was versioned); the
workflow task it brings tells the run, which ends its connection and continues-as-new
onto the target (:mod:`workflows.upgrade`). An update rather than a signal: a signal
that arrived while a run completed its continue-as-new would make the server refuse that
task (a workflow task failure, ``UnhandledCommand``); an update waits.

Cost: one describe call per ``POLL_INTERVAL`` per worker (no Temporal action), and per
deploy one list and one update per stream that must move; a stream the ramp does not
move takes the update's workflow task and goes on. Every worker of the version sweeps;
the later sweeps find the streams already moved and signal only the stragglers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from durable_sse.config.deployment import DeploymentVersion

logger = logging.getLogger(__name__)

POLL_INTERVAL = 2.0
"""Seconds between two looks at the deployment's routing: a stream moves within about
this long of the switch, plus a workflow task and its connection's flush."""
RESWEEPS = (5.0, 15.0, 30.0, 60.0)
"""Seconds after a sweep to look again for stragglers (a stream started on the old
version during the switch, an update it took while busy, a list that did not show it
yet): each look is one list call, no Temporal action, so a straggler waits seconds, not a
minute (CI: one of eight streams still on the old version 60 s after the switch, when
the looks were at 10 s and 60 s)."""
SIGNAL_CONCURRENCY = 50
UPDATE_TIMEOUT = 30.0
VERSION_ATTRIBUTE = "TemporalWorkerDeploymentVersion"


@dataclass(frozen=True)
class Routing:
    """A deployment's routing, as far as waking goes."""

    current: str | None
    ramping: str | None
    ramp_percentage: float = 0.0

    def targets(self, version: DeploymentVersion) -> bool:
        """Whether ``version`` is a target for some streams: current, or ramping above 0%."""
        ours = str(version)
        return self.current == ours or (self.ramping == ours and self.ramp_percentage > 0)


def stragglers_query(version: DeploymentVersion, task_queue: str) -> str:
    """The running streams of ``task_queue`` on another version (or on none)."""
    return (
        f"WorkflowType = 'StreamWorkflow' AND ExecutionStatus = 'Running' "
        f"AND TaskQueue = '{task_queue}' AND ({VERSION_ATTRIBUTE} != '{version}' "
        f"OR {VERSION_ATTRIBUTE} IS NULL)"
    )


class UpgradeWaker:
    """Watches the deployment's routing and sweeps when this version becomes a target."""

    def __init__(
        self,
        client: Client,
        version: DeploymentVersion,
        *,
        task_queue: str,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.client = client
        self.version = version
        self.task_queue = task_queue
        self.poll_interval = poll_interval
        self.signalled = 0
        """Streams this worker has woken (all sweeps)."""
        self._seen: Routing | None = None

    async def routing(self) -> Routing | None:
        """The deployment's routing (None: the deployment does not exist yet)."""
        request = DescribeWorkerDeploymentRequest(
            namespace=self.client.namespace, deployment_name=self.version.deployment_name
        )
        try:
            response = await self.client.workflow_service.describe_worker_deployment(request)
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        config = response.worker_deployment_info.routing_config
        return Routing(
            current=_version(config.current_deployment_version),
            ramping=_version(config.ramping_deployment_version),
            ramp_percentage=config.ramping_version_percentage,
        )

    async def sweep(self) -> int:
        """Wake every stream still on another version; returns how many."""
        query = stragglers_query(self.version, self.task_queue)
        ids = [execution.id async for execution in self.client.list_workflows(query)]
        slots = asyncio.Semaphore(SIGNAL_CONCURRENCY)

        async def wake(workflow_id: str) -> bool:
            async with slots:
                try:
                    handle = self.client.get_workflow_handle(workflow_id)
                    await asyncio.wait_for(handle.execute_update("upgrade"), UPDATE_TIMEOUT)
                    return True
                except (RPCError, WorkflowUpdateFailedError, TimeoutError) as error:
                    # Ended or moved meanwhile (nothing to do), or the run is busy: the next
                    # sweep looks again.
                    logger.debug("stream %s not woken: %s", workflow_id, error)
                    return False

        woken = sum(await asyncio.gather(*(wake(workflow_id) for workflow_id in ids)))
        self.signalled += woken
        if woken:
            logger.info("woke %d stream(s) still on another version than %s", woken, self.version)
        return woken

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: on each change of the routing that makes this version a target
        (and at start, if it already is), sweep, then sweep again for stragglers."""
        resweeps: list[float] = []
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                routing = await self.routing()
                if routing is not None and routing != self._seen:
                    self._seen = routing
                    if routing.targets(self.version):
                        await self.sweep()
                        resweeps = [loop.time() + delay for delay in RESWEEPS]
                if resweeps and loop.time() >= resweeps[0]:
                    resweeps.pop(0)
                    if self._seen is not None and self._seen.targets(self.version):
                        await self.sweep()
            except (RPCError, OSError) as error:
                logger.warning("could not look at deployment %s: %s", self.version, error)
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.poll_interval)
            except TimeoutError:
                pass


def _version(version: object) -> str | None:
    name = getattr(version, "deployment_name", "")
    build = getattr(version, "build_id", "")
    return f"{name}:{build}" if name and build else None
