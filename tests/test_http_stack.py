"""What the HTTP stack needs at run time to stay cheap on the read path."""

import sys


async def test_httpcore_finds_sniffio_rather_than_searching_for_it_on_every_lock() -> None:
    """httpcore runs ``import sniffio`` each time it sets up a lock; without the package
    (anyio stopped depending on it) each of those imports walks ``sys.path`` and fails,
    which cost 12% of a worker's CPU (pyproject.toml pins it)."""
    from httpcore._synchronization import current_async_library

    assert current_async_library() == "asyncio"
    assert "sniffio" in sys.modules
