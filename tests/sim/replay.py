"""Replay one simulated schedule and print its trace: ``python -m tests.sim.replay SEED``."""

from __future__ import annotations

import asyncio
import sys

from tests.sim.world import Violation, World


async def replay(seed: int) -> int:
    world = World(seed)
    try:
        await world.run()
        world.verdict()
    except Violation as violation:
        print("\n".join(world.trace))
        print(f"{world.profile}\n{world.spec}\nseed {seed}: {violation}")
        return 1
    print("\n".join(world.trace))
    print(f"seed {seed}: no violation ({dict(world.tally.counts)})")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(replay(int(sys.argv[1]))))
