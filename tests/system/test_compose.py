"""docker-compose.yml, checked without a Docker engine (none runs on these machines)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def settings_variables() -> set[str]:
    """Every variable durable_sse.config.settings reads, taken from its source so it stays true."""
    source = (ROOT / "durable_sse" / "config" / "settings.py").read_text()
    return set(re.findall(r'env\.get\("([A-Z_]+)"\)', source))


def test_worker_service_sets_every_variable_the_worker_reads() -> None:
    variables = settings_variables()
    assert {"TEMPORAL_ADDRESS", "DATABASE_URL", "REDIS_URL", "SSE_TASK_QUEUE"} <= variables
    environment = SERVICES["worker"]["environment"]
    assert variables <= set(environment), variables - set(environment)


def test_every_dependency_has_a_health_check_and_is_awaited_healthy() -> None:
    """Long-running services are awaited healthy; a one-shot job (``restart: "no"``, e.g.
    the search attribute's registration) is awaited until it has completed successfully."""
    for name, service in SERVICES.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            if SERVICES[dependency].get("restart") == "no":
                assert condition == {"condition": "service_completed_successfully"}, (
                    name,
                    dependency,
                )
                continue
            assert "healthcheck" in SERVICES[dependency], f"{name} depends on {dependency}"
            assert condition == {"condition": "service_healthy"}, (name, dependency)


def test_the_stream_state_search_attribute_is_registered_before_the_worker_starts() -> None:
    setup = SERVICES["temporal-setup"]
    script = " ".join(setup["command"])
    assert "search-attribute create" in script and "--name SseStreamState --type Keyword" in script
    assert SERVICES["worker"]["depends_on"]["temporal-setup"] == {
        "condition": "service_completed_successfully"
    }


def test_images_build_from_paths_that_exist() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
        if "build" in service:
            assert (ROOT / service["build"] / "Dockerfile").exists()
    for source in re.findall(r"^COPY\s+(.+?)\s+\S+$", dockerfile, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), f"Dockerfile copies missing {path}"


def test_no_secret_is_written_in_the_file() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for line in text.splitlines():
        if re.match(r"\s*[A-Z_]*(PASSWORD|PWD|TOKEN|SECRET|KEY)\s*:", line):
            value = line.split(":", 1)[1].strip()
            assert value.startswith("${") and ":?" in value, line
    assert "${POSTGRES_PASSWORD:?" in SERVICES["worker"]["environment"]["DATABASE_URL"]
