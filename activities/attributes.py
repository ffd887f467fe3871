"""Whether this namespace knows the ``SseStreamState`` search attribute.

Upserting a search attribute the namespace has not registered fails the workflow task,
and a failed workflow task is retried forever: a stream would hang on it. So each run of
``StreamWorkflow`` asks once, at its start, through this activity, and sets the attribute
only where it is registered as a Keyword. Where it is not, the stream works the same and
only Temporal's list views lack the column (the worker logs how to register it).
"""

from __future__ import annotations

import logging

from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError

from durable_sse.contracts import STREAM_STATE_ATTRIBUTE

logger = logging.getLogger(__name__)

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

    @activity.defn(name="stream_state_attribute_registered")
    async def stream_state_attribute_registered(self) -> bool:
        """True when ``SseStreamState`` is a Keyword search attribute of this namespace."""
        namespace = self.client.namespace
        try:
            response = await self.client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=namespace)
            )
        except RPCError as error:
            self._tell(
                f"cannot list the search attributes of namespace {namespace} ({error.message}); "
                f"streams do not set {STREAM_STATE_ATTRIBUTE}"
            )
            return False
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
