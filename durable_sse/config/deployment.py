"""Which Worker Deployment Version a worker polls as: both names, or neither.

``TEMPORAL_DEPLOYMENT_NAME`` and ``TEMPORAL_WORKER_BUILD_ID`` are the names the Temporal
Worker Controller for Kubernetes injects into each worker (also ``durable-sse worker
--deployment-name/--build-id``). With both, the worker is that version of a Worker
Deployment and the workflows are Pinned to it (docs/deploys.md); with
neither, it is unversioned, as the demo and most tests run. One without the other is
refused in one line: a worker that silently ran unversioned would take every new
stream away from the versioned ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from durable_sse.errors import ConfigError

DEPLOYMENT_NAME_ENV = "TEMPORAL_DEPLOYMENT_NAME"
BUILD_ID_ENV = "TEMPORAL_WORKER_BUILD_ID"
MAX_NAME = 255
"""Temporal's bound on a deployment name and a build id (bytes)."""


@dataclass(frozen=True)
class DeploymentVersion:
    """A Worker Deployment Version: ``deployment_name`` and ``build_id``."""

    deployment_name: str
    build_id: str

    def __str__(self) -> str:
        """How Temporal writes it (``TemporalWorkerDeploymentVersion``)."""
        return f"{self.deployment_name}:{self.build_id}"


def parse_deployment(env: Mapping[str, str]) -> DeploymentVersion | None:
    """The version the environment names (None: unversioned); a bad or half-given pair
    raises :class:`ConfigError` naming what is wrong."""
    name = _value(env, DEPLOYMENT_NAME_ENV)
    build = _value(env, BUILD_ID_ENV)
    if name is None and build is None:
        return None
    if name is None or build is None:
        given, missing = (
            (DEPLOYMENT_NAME_ENV, BUILD_ID_ENV)
            if build is None
            else (BUILD_ID_ENV, DEPLOYMENT_NAME_ENV)
        )
        raise ConfigError(
            f"{given} is set but {missing} is not: set both (a versioned worker) or neither"
        )
    for variable, value in ((DEPLOYMENT_NAME_ENV, name), (BUILD_ID_ENV, build)):
        if len(value.encode()) > MAX_NAME or any(c.isspace() for c in value):
            raise ConfigError(
                f"{variable} must be at most {MAX_NAME} bytes without spaces, got {value!r}"
            )
    if "." in name or ":" in name:
        raise ConfigError(f"{DEPLOYMENT_NAME_ENV} must not contain '.' or ':', got {name!r}")
    return DeploymentVersion(deployment_name=name, build_id=build)


def _value(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{name} is set but empty")
    return value.strip()
