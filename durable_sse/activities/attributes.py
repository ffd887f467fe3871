"""Whether this namespace knows the ``SseStreamState`` search attribute.

Upserting a search attribute the namespace has not registered fails the workflow task,
and a failed workflow task is retried forever: a stream would hang on it. So each run of
``StreamWorkflow`` asks once, at its start, through this activity, and sets the attribute
only where it is registered as a Keyword. Where it is not, the stream works the same and
only Temporal's list views lack the column (the worker logs how to register it).

A worker answers from its last listing, and concurrent asks share one listing: a thousand
streams started at once ask the server once, not a thousand times (docs/benchmarks.md,
section 3). A listing older than ``ANSWER_TTL`` is renewed in the background while runs
still get its answer: only a worker that has no answer yet waits for the server, so a
listing slowed by a start burst times no run's check out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError

from durable_sse.contracts import STREAM_STATE_ATTRIBUTE

logger = logging.getLogger(__name__)

LISTING_TIMEOUT = timedelta(seconds=5)
"""A listing the server has not answered by then fails (the run goes without the
attribute, and the next ask lists again) rather than holding every run's check."""
ANSWER_TTL = 30.0
"""Seconds after which a worker lists again: an attribute registered (or removed)
meanwhile is seen by runs that start once that listing answered."""

REGISTER_HINT = (
    f"register it with `temporal operator search-attribute create --name "
    f"{STREAM_STATE_ATTRIBUTE} --type Keyword --namespace NAMESPACE` (Temporal Cloud: "
    f'`tcld namespace search-attributes add -n NAMESPACE --sa "{STREAM_STATE_ATTRIBUTE}=Keyword"`)'
)


class SearchAttributeActivities:
    """Built once per worker with its client (the namespace it lists is the client's)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._told = False
        self._lock = asyncio.Lock()
        self._answer: tuple[float, bool] | None = None
        """(monotonic time it was listed, the answer)."""
        self._renewal: asyncio.Task[bool] | None = None
        self.listings = 0

    @activity.defn(name="stream_state_attribute_registered")
    async def stream_state_attribute_registered(self) -> bool:
        """True when ``SseStreamState`` is a Keyword search attribute of this namespace."""
        answer = self._answer
        if answer is not None:
            if not answer_fresh(answer, time.monotonic()):
                self._renew_in_background()
            return answer[1]
        async with self._lock:
            if self._answer is not None:
                return self._answer[1]
            return await self._listing()

    def _renew_in_background(self) -> None:
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.create_task(self._renew())

    async def _renew(self) -> bool:
        try:
            return await self._listing()
        except Exception as error:  # noqa: BLE001 - the next ask tries again
            logger.debug("could not renew the search attribute listing: %s", error)
            return False

    async def _listing(self) -> bool:
        """List, and keep the answer; a listing that fails keeps the last one (with
        none, this run goes without the attribute)."""
        listed_at = time.monotonic()
        answer = await self._list()
        if answer is None:
            return False
        self._answer = (listed_at, answer)
        return answer

    async def _list(self) -> bool | None:
        """The answer, or None when the namespace could not be listed."""
        self.listings += 1
        namespace = self.client.namespace
        try:
            response = await self.client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=namespace), timeout=LISTING_TIMEOUT
            )
        except RPCError as error:
            self._tell(
                f"cannot list the search attributes of namespace {namespace} ({error.message}); "
                f"streams do not set {STREAM_STATE_ATTRIBUTE}"
            )
            return None
        kind = response.custom_attributes.get(STREAM_STATE_ATTRIBUTE)
        if kind is None:
            self._tell(
                f"namespace {namespace} has no search attribute {STREAM_STATE_ATTRIBUTE}: "
                f"streams work without it, but Temporal's lists cannot filter by state; "
                + REGISTER_HINT
            )
            return False
        if kind != IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD:
            self._tell(
                f"search attribute {STREAM_STATE_ATTRIBUTE} of namespace {namespace} is "
                f"{IndexedValueType.Name(kind)}, not Keyword: streams do not set it"
            )
            return False
        return True

    def _tell(self, message: str) -> None:
        """Once per worker as a warning (every run asks), then at debug."""
        logger.log(logging.DEBUG if self._told else logging.WARNING, message)
        self._told = True

    def activities(self) -> list[object]:
        return [self.stream_state_attribute_registered]


def answer_fresh(answer: tuple[float, bool] | None, now: float, ttl: float = ANSWER_TTL) -> bool:
    """Whether a listing made at ``answer[0]`` still answers at ``now``."""
    return answer is not None and 0 <= now - answer[0] < ttl
