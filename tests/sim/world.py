"""One simulated schedule: the workflow's loop, the reader's attempts, faults, an oracle.

The decisions are the real ones: :func:`workflows.routes.plan_connection`,
:func:`~workflows.routes.record_result` and :func:`~workflows.routes.should_interrupt`
for the workflow; for the reader, the classes the read activity runs:
:class:`~durable_sse.reader.session.ReadSession` (its start through
:class:`~durable_sse.cursor.resolve.CursorResolver`, its intake and gaps, its result) and
:class:`~durable_sse.reader.pipeline.CommitPipeline` (the commit order, what a commit
moves), with the real SSE decoder on the simulated bytes. What is simulated: the server,
the clock, the stores' storage, Temporal's scheduling (an attempt that dies is retried
with its last heartbeat; a result can be lost to a cancel), the moments batches commit
at, and the faults.

A run has a fault phase and a quiet phase (no faults, the server stops generating); at
the end every id the server could still replay must be stored exactly once, every id it
could not must be counted exactly (or lie in a gap reported as of unknown size), and no
gap may be left open. During the run, no cursor may pass a drop notice before its gap is
recorded, and the lagging id may never pass an open gap.

Most schedules (70%) run retention (both phases), at random moments, one delete statement
per step so that statements interleave with commits and connection starts: a row it
deletes counts as stored once (the oracle is the same), and storing it again or counting
it as missing is a violation.
"""

from __future__ import annotations

import logging
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import count

from durable_sse.config.durations import effective_retention
from durable_sse.config.replay import ReplaySignal
from durable_sse.config.spec import StreamSpec
from durable_sse.consume.model import Event as ConsumedEvent
from durable_sse.consume.model import GapClosed as GapClosedItem
from durable_sse.consume.model import Item, Position, Truncated
from durable_sse.contracts import (
    Outcome,
    ReadInput,
    ReadProgress,
    ReadResult,
    Route,
)
from durable_sse.cursor.fence import RunningReader
from durable_sse.cursor.l1 import LocalCursors
from durable_sse.cursor.readers import ReaderLease
from durable_sse.cursor.resolve import CursorResolver
from durable_sse.gaps.model import GapChange, GapState, summarize
from durable_sse.ids import compare_ids
from durable_sse.log.records import EventRecord, InsertResult, StoredPage
from durable_sse.log.workers import WorkerLeaseLostError
from durable_sse.reader.pipeline import CommitPipeline, Settled
from durable_sse.reader.session import ReadSession
from durable_sse.sse.decoder import Comment
from durable_sse.workflows.routes import (
    ConnectionPlan,
    StreamState,
    fold_gaps,
    plan_connection,
    record_result,
    should_interrupt,
)
from tests.sim.server import Profile, SimConnection, SimServer
from tests.sim.stores import MemoryEventLog, MemoryRedis, MemoryWorkers

STEP = 0.05
"""Virtual seconds per step."""
QUIET_GENERATING_STEPS = 60
"""Steps the server keeps generating once the faults stop."""
CONVERGE_SECONDS = 20.0
"""Virtual seconds after the faults stop within which every gap must be closed (repaired,
or unrecoverable and counted), with the connection left up as long as it likes: a gap
no connection re-reads while the source is quiet is a violation, not a slow run."""
QUIET_MAX_AGE = 1000
"""Steps a connection lasts at most once the faults stop (its ``max_connection_age``):
longer than :data:`CONVERGE_SECONDS`."""
RETENTION_CHANCE = 0.1
"""Chance per step that a retention run starts (when the schedule has retention)."""
NEVER = datetime(9999, 1, 1, tzinfo=UTC)
"""A running attempt's registration: it is released when the attempt ends, and a dead
attempt's is made to expire (see ``World.crash``)."""
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
STREAM = "sim"


class Violation(AssertionError):
    """The oracle found an anomaly; the message names it."""


@dataclass
class Faults:
    """Chances per step (or per connection) of each fault."""

    crash: float = 0.01
    zombie: float = 0.3
    """Share of crashes after which the presumed-dead attempt keeps running a while (its
    worker was not dead): its lease is revoked before the retry starts, so the fence
    refuses its commits, but for the one transaction it had open."""
    pause: float = 0.5
    """Share of those whose worker was paused ("paused, not dead": SIGSTOP, a long GC
    pause, a partition): the attempt stops stepping for a while, then steps again."""
    fenced: bool = True
    """The watchdog revokes the lease of a worker it takes for dead (False: the world
    before worker leases, where such an attempt kept committing: schedules found then
    replay as they were, with ``pause=0``)."""
    lose_result: float = 0.2
    """Share of cancellations whose result the workflow never sees."""
    signal: float = 0.01
    truncate: float = 0.004
    redis: float = 0.004
    one_shot: float = 0.04
    """A one-shot drop injected as a connection starts, so that it is taken before the
    connection's first event (chaos scenario 6's timing)."""
    one_shot_replay: float = 0.3
    """The same, as a replay (a lagged or explicit route) starts."""
    one_shot_tick: float = 0.002
    """A one-shot drop injected at a random moment (the connection writing takes it)."""
    quiet: bool = False

    @classmethod
    def none(cls) -> Faults:
        return cls(
            crash=0,
            zombie=0,
            pause=0,
            lose_result=0,
            signal=0,
            truncate=0,
            redis=0,
            one_shot=0,
            one_shot_replay=0,
            one_shot_tick=0,
            quiet=True,
        )


@dataclass
class Tally:
    """What a schedule injected, for the report."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, name: str) -> None:
        self.counts[name] += 1


def random_profile(rng: random.Random) -> Profile:
    contiguous = rng.random() < 0.5
    return Profile(
        contiguous=contiguous,
        counts=rng.random() < 0.7,
        mercure=rng.random() < 0.3,
        drop_rate=rng.choice([0.0, 0.01, 0.03, 0.08]),
        disconnect_rate=rng.choice([0.0, 0.02, 0.06]),
        window=rng.choice([40, 80, 200]),
        late_notices=rng.random() < 0.5,
    )


class World:
    """One stream, one server, the stores, the workflow state, and the clock."""

    def __init__(self, seed: int, *, profile: Profile | None = None, faults: Faults | None = None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.profile = profile or random_profile(self.rng)
        if profile is None:
            # Its own generator: schedules draw what they drew before the setting existed.
            self.profile.verify = random.Random(f"{seed}:verify").random() < 0.5
        self.faults = faults or Faults()
        self.server = SimServer(self.rng, self.profile)
        order = "numeric" if self.rng.random() < 0.5 else "natural"
        events_per_second = 0.75 / STEP
        history_seconds = self.profile.window / events_per_second
        self.spec = StreamSpec(
            name=STREAM,
            url="http://sim.invalid/stream",
            id_order=order,
            replay_window=history_seconds * self.rng.choice([0.5, 0.8, 1.5]),
            lagged_reconnect_interval=self.rng.choice([0.0, 0.5, 2.0]),
            contiguous_ids=self.profile.contiguous,
            verify_reconnects=self.profile.verify,
            mercure_last_event_id=self.profile.mercure,
            batch_max_events=self.rng.choice([1, 3, 8]),
            batch_max_delay=0.1,
        )
        self.log = MemoryEventLog(STREAM, order)
        self.redis = MemoryRedis(order)
        self.clock = 0.0
        self.state = StreamState()
        self.l1 = self._new_l1()
        self.next_advance = self.spec.replay_window
        self.tally = Tally()
        self.generating = True
        self._ids = count(1)
        self.zombies: list[Attempt] = []
        self.late_first_rows: set[int] = set()
        """Ids committed by a presumed-dead attempt of a connection with no cursor after
        its retry had started (also with no cursor, reading live)."""
        self.trace: list[str] = []
        self._history_seen = 1
        self.shots = random.Random(f"{seed}:one-shots")
        """One-shot drops draw from their own generator: a schedule none hits runs as it
        did before they existed."""
        self.deletes = random.Random(f"{seed}:retention")
        """Retention draws from its own generator too."""
        self.retention: float | None = None
        """Seconds kept (None: this schedule runs no retention)."""
        if self.deletes.random() < 0.7:
            self.retention, _ = effective_retention(
                self.spec.replay_window * self.deletes.choice([0.5, 1.0, 1.2, 2.0]),
                None,
                self.spec.replay_window,
            )
        self.deleting: RetentionRun | None = None
        self.ended_connections: list[SimConnection] = []
        """Connections that ended mid-read (cut, or cancelled) since the last one started."""
        self.consumer = SimConsumer(self.log)
        self.zombie_gaps: set[str] = set()
        """Gaps that the transaction a presumed-dead attempt had open at its pause opened
        (the fence cannot stop a transaction already past its check): the workflow learns
        of them only when a connection ends (a live one that outlives them rotates at its
        age). Every later commit of that attempt is refused."""
        self.exempted: set[str] = set()
        self.workers = MemoryWorkers()
        """The worker leases: one worker per attempt, revoked when taken for dead."""
        self._workers = count(1)
        self.pauses = random.Random(f"{seed}:pauses")
        """Pauses draw from their own generator (the schedule's other draws unchanged)."""
        self.quiet_since: float | None = None
        """When the faults stopped (the quiet phase began)."""
        self.reads = random.Random(f"{seed}:consumer")
        """The consumer reads at moments of its own generator's (other draws unchanged)."""
        self.read_rate = self.reads.choice([0.02, 0.1, 0.3])
        """Chance per step that the consumer reads a batch: a slow one falls behind
        retention and meets ``Truncated``."""
        self._attempts = count(1)

    def maybe_inject_drop(self, chance: float) -> None:
        """A one-shot drop of up to one and a half history windows (larger than the
        history, as in chaos scenario 6, a third of the time)."""
        if chance and self.shots.random() < chance:
            window = self.profile.window
            self.server.inject_drop(self.shots.randint(1, window + window // 2))
            self.tally.add("one-shot drop injected")

    def note(self, text: str) -> None:
        self.trace.append(f"{self.clock:7.2f} {text}")

    # -- time, the server, the checkpoint ---------------------------------------------

    @property
    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.clock)

    def _new_l1(self) -> LocalCursors:
        return LocalCursors(ttl=30.0, timer=lambda: self.clock)

    def resolver(self) -> CursorResolver:
        return CursorResolver(self.l1, self.redis, self.log)  # type: ignore[arg-type]

    def tick(self) -> None:
        self.clock += STEP
        if self.server.history_start > self._history_seen:
            self._history_seen = self.server.history_start
        if self.generating and self.rng.random() < 0.5:
            self.server.generate(self.rng.randint(1, 2))
        if (
            self.quiet_since is not None
            and self.clock - self.quiet_since > QUIET_GENERATING_STEPS * STEP
        ):
            self.generating = False  # also while a connection that stays up runs
        if self.clock >= self.next_advance:
            self.next_advance = self.clock + self.spec.replay_window
            before = self.log.lagging_id
            self.log.advance(window=self.spec.replay_window, now=self.now)
            if self.log.lagging_id != before:
                self.check_lagging()
        faults = self.faults
        if self.rng.random() < faults.truncate:
            self.server.truncate(self.rng.randint(1, self.profile.window // 2))
            self.tally.add("history truncated")
        if self.rng.random() < faults.redis:
            stored = sorted(self.log.stored_numbers())
            if stored and self.rng.random() < 0.5:
                self.redis.values[STREAM] = str(self.rng.choice(stored))
                self.tally.add("redis rewound")
            else:
                self.redis.values.clear()
                self.tally.add("redis emptied")
        self.maybe_inject_drop(faults.one_shot_tick)
        self.delete_some()
        if self.reads.random() < self.read_rate:
            self.consumer.read(limit=self.reads.randint(1, 12))
        for zombie in list(self.zombies):
            if zombie.paused:
                zombie.paused -= 1  # its worker is paused: it does nothing at all
                continue
            zombie.lifetime -= 1
            try:
                outcome = zombie.step()
                if outcome is None and zombie.lifetime > 0:
                    continue
                # Its connection ends, or its worker's next renewal finds the lease
                # revoked and ends it: it flushes, unaware.
                zombie.finish(outcome or Outcome.CANCELLED)
            except WorkerLeaseLostError:
                zombie.fenced()
            self.zombies.remove(zombie)

    def new_gap_id(self) -> str:
        return f"g{next(self._ids)}"

    def new_worker(self) -> str:
        """The worker an attempt runs on, with a live lease."""
        worker_id = f"w{next(self._workers)}"
        self.workers.acquire(worker_id)
        return worker_id

    def new_reader(self) -> ReaderLease:
        return ReaderLease(f"a{next(self._attempts)}", NEVER)

    def delete_some(self) -> None:
        """Retention at random moments: a run takes one statement per step, so commits,
        gap openings and connection starts fall between its statements."""
        if self.retention is None:
            return
        run = self.deleting
        if run is None:
            if self.deletes.random() >= RETENTION_CHANCE:
                return
            run = self.deleting = RetentionRun(
                cutoff=self.now - timedelta(seconds=self.retention),
                limit=self.deletes.choice([1, 3, 10, 50, 200]),
                statements=self.deletes.randint(1, 10),
            )
            self.tally.add("retention runs")
        batch = self.log.retention_batch(
            cutoff=run.cutoff, after=run.after, limit=run.limit, now=self.now
        )
        run.after, run.statements = batch.last_seq, run.statements - 1
        if batch.deleted:
            self.tally.counts["rows deleted by retention"] += batch.deleted
            self.note(f"retention deleted {batch.deleted} rows, horizon {self.log.horizon}")
        if batch.done or run.statements <= 0:
            self.deleting = None

    # -- the oracle's running checks --------------------------------------------------

    def check_lagging(self) -> None:
        """The lagging id just moved: not past any open gap (one that a late notice opened
        behind it may exist; it only holds the lagging id where it is)."""
        lagging = self.log.lagging_id
        if lagging is None:
            return
        for gap in self.log.open_gaps():
            resume = gap.resume_from(self.log.order)
            if resume is None or compare_ids(lagging, resume, self.log.order) > 0:
                raise Violation(
                    f"lagging id {lagging} passed the open gap {gap.gap_id} (resume point {resume})"
                )

    def check_converging(self, plan: ConnectionPlan) -> None:
        """Without new faults every gap converges: none stays open longer than
        :data:`CONVERGE_SECONDS` once the faults stopped (or once it opened, for one
        opened later: a verification's suspicion)."""
        if self.quiet_since is None or self.clock - self.quiet_since < CONVERGE_SECONDS:
            return
        for gap in self.log.open_gaps():
            seen = (datetime.fromisoformat(gap.seen_at) - EPOCH).total_seconds()
            open_for = self.clock - max(self.quiet_since, seen)
            if open_for < CONVERGE_SECONDS:
                continue
            if gap.gap_id in self.zombie_gaps:
                # Opened by the one transaction a paused worker had open past the fence:
                # no connection that runs learns of it until it ends (see zombie_gaps).
                if gap.gap_id not in self.exempted:
                    self.exempted.add(gap.gap_id)
                    self.tally.add("convergence: a gap opened at a pause waits")
                continue
            raise Violation(
                f"gap {gap.gap_id} ({gap.kind}, {gap.start_id}..{gap.bound()}, resumes "
                f"after {gap.resume_from(self.log.order)}) still open {open_for:.1f} s with "
                f"the faults stopped; the connection is {plan.route.value} "
                f"(repairs={plan.repairs}), lagging id {self.log.lagging_id}"
            )

    def check_notices(self, connection: SimConnection, cursor: str) -> None:
        """A cursor at ``cursor`` on ``connection``: every skip announced (or, with
        contiguous ids, revealed) before that id was sent must be stored or recorded."""
        number = int(cursor)
        try:
            position = len(connection.sent) - 1 - connection.sent[::-1].index(number)
        except ValueError:
            return
        stored = None
        for notice in connection.notices:
            if notice.announced_after is None:
                if not self.profile.contiguous or number <= max(notice.skipped):
                    continue
            elif notice.announced_after >= position:
                continue
            if stored is None:
                stored = self.log.stored_numbers()
            for missing in notice.skipped:
                if missing in stored or self._recorded(missing):
                    continue
                if connection.cursorless and missing < connection.sent[0]:
                    continue  # before a live-only stream's first event: see verdict()
                raise Violation(
                    f"cursor {cursor} passed the drop of {missing} (skipped with "
                    f"{notice.skipped}) before any gap recorded it"
                )

    def _recorded(self, number: int) -> bool:
        event_id = str(number)
        return any(gap.contains(event_id, self.log.order) for gap in self.log.gaps.values())

    # -- the workflow's loop ----------------------------------------------------------

    async def run(self, *, steps: int = 130, quiet_steps: int = 2000) -> None:
        deadline = steps
        phase_steps = 0
        while True:
            if self.state.gaps_stale:
                fold_gaps(self.state, await self.log.gap_summary(STREAM, self.log.order))
                self.state.lagging_id = self.log.lagging_id
            if self.state.paused:
                for _ in range(self.rng.randint(1, 40)):
                    self.tick()
                self.state.paused = False
            plan = plan_connection(
                self.state,
                now=self.now,
                interval=self.spec.lagged_reconnect_interval,
                id_order=self.spec.id_order,
            )
            used = await self.connection(plan, budget=max(deadline - phase_steps, 1))
            phase_steps += used
            if phase_steps >= deadline and not self.faults.quiet:
                self.faults = Faults.none()
                self.profile.drop_rate = self.profile.disconnect_rate = 0.0
                self.server.clear_one_shots()
                self.tally.add("quiet phase")
                self.quiet_since = self.clock
                deadline, phase_steps = quiet_steps, 0
                continue
            if self.faults.quiet:
                if phase_steps > QUIET_GENERATING_STEPS:
                    self.generating = False
                if self.settled():
                    return
                if phase_steps >= deadline:
                    raise Violation(f"not settled after the quiet phase: {self.describe()}")

    def settled(self) -> bool:
        state = self.state
        return (
            not self.generating
            and not self.zombies
            and not state.gaps_stale
            and not state.repair_wanted
            and state.replay is None
            and state.pending_replay is None
            and not self.log.open_gaps()
            and state.live_cursor == str(self.server.newest)
        )

    def describe(self) -> str:
        state = self.state
        return (
            f"live {state.live_cursor} newest {self.server.newest} open gaps "
            f"{[vars(g) for g in self.log.open_gaps()]} replay {state.replay} "
            f"lagging {self.log.lagging_id} history from {self.server.history_start}"
        )

    async def connection(self, plan: ConnectionPlan, *, budget: int) -> int:
        """Run one read_stream execution (with its retries) and fold the result."""
        state = self.state
        state.counters.connections += 1
        read_input = ReadInput(
            spec=self.spec,
            route=plan.route,
            start_id=plan.start_id,
            known_gaps=plan.known_gaps,
            events_read_before=state.counters.events_read,
            verify=plan.verify,
            verify_from=plan.verify_from,
        )
        for ended in self.ended_connections:
            # What a verification of this reconnect covers, as the store has it now.
            ended.verified = (self.log.lagging_id, self.log.floor)
        self.ended_connections.clear()
        attempt = await Attempt.start(self, read_input, retried=False, progress=None)
        self.note(
            f"connect {plan.route.value} start_id={plan.start_id} -> cursor "
            f"{attempt.start_cursor} ({attempt.source}) known={plan.known_gaps}"
        )
        steps = 0
        result: ReadResult | None = None
        lost = False
        max_age = self.rng.randint(20, 200)
        while True:
            steps += 1
            self.tick()
            self.maybe_signal()
            if should_interrupt(
                state, plan, now=self.now, interval=self.spec.lagged_reconnect_interval
            ):
                result = attempt.finish(Outcome.CANCELLED)
                if self.rng.random() < self.faults.lose_result:
                    lost = True
                    self.tally.add("result lost to a cancel")
                break
            outcome = attempt.step()
            if outcome is not None:
                result = attempt.finish(outcome)
                break
            if self._caught_up(attempt) or steps >= (
                QUIET_MAX_AGE if self.faults.quiet else max_age
            ):
                # Once the faults stop, a connection stays up until it has nothing left to
                # read or repair (max_connection_age is an hour by default): only a route
                # decision or the reader itself may end it, so a gap nobody re-reads shows.
                result = attempt.finish(Outcome.ROTATED)
                break
            self.check_converging(plan)
            if self.rng.random() < self.faults.crash:
                self.crash(attempt)
                attempt = await Attempt.start(
                    self, read_input, retried=True, progress=attempt.heartbeat
                )
                self.note(f"retry from {attempt.start_cursor} ({attempt.source})")
            if steps >= budget * 4:
                result = attempt.finish(Outcome.ROTATED)
                break
        assert result is not None
        if attempt.connection.cut or result.outcome is Outcome.CANCELLED:
            attempt.connection.ended = True
            self.ended_connections.append(attempt.connection)
        self.note(
            f"end {result.outcome.value} last={result.last_cursor} drop={result.drop} "
            f"lost={lost} gaps={[vars(g) for g in self.log.gaps.values() if g.is_open]}"
        )
        decision = record_result(
            state,
            plan,
            None if lost else result,
            id_order=self.spec.id_order,
            jitter=self.rng.random(),
            duration=steps * STEP,
            verify_reconnects=self.spec.verify_reconnects,
        )
        if decision.refresh_gaps:
            fold_gaps(state, await self.log.gap_summary(STREAM, self.log.order))
            state.lagging_id = self.log.lagging_id
        for _ in range(min(int(decision.delay / STEP), 40)):
            self.tick()
            steps += 1
        return steps

    def _caught_up(self, attempt: Attempt) -> bool:
        """Quiet, nothing left to read or repair: end the connection to let the run end."""
        return (
            not self.generating
            and not self.zombies
            and attempt.cursor == str(self.server.newest)
            and not attempt.pipeline.in_flight
            and not self.log.open_gaps()
        )

    def crash(self, attempt: Attempt) -> None:
        """The worker running ``attempt`` is taken for dead: the watchdog revokes its
        lease, then Temporal retries the attempt on another (L1 empty). Most often it was
        dead; else it keeps running a while beside the retry (paused first, or not),
        fenced off: the transaction it had open may still commit, nothing after it."""
        self.tally.add("attempt crashed")
        if self.faults.fenced:
            self.workers.revoke(attempt.worker_id)
        if self.rng.random() >= self.faults.zombie:
            attempt.inflight_lost()  # the process is gone with what it had not committed
            # Its registration stays until it expires, some time after its death.
            reader = self.log.readers.get(attempt.reader.reader_id)
            if reader is not None:
                expires = self.now + timedelta(seconds=self.deletes.uniform(0, 2.0))
                self.log.readers[reader.reader_id] = RunningReader(
                    reader.reader_id, reader.start_id, expires
                )
            if not attempt.committed_any:
                attempt.notices_die()
        else:
            attempt.lifetime = self.rng.randint(1, 30)
            attempt.zombie = True
            attempt.committed_when_revoked = attempt.committed_any or not self.faults.fenced
            if attempt.writer.pending and self.pauses.random() < 0.5:
                attempt.writer.pending[0].open_at_pause = True
            if self.pauses.random() < self.faults.pause:
                attempt.paused = attempt.pause = self.pauses.randint(1, 80)
                self.tally.add("paused, not dead")
            self.zombies.append(attempt)
            self.tally.add("two attempts at once")
        self.l1 = self._new_l1()

    def maybe_signal(self) -> None:
        if self.rng.random() >= self.faults.signal:
            return
        state = self.state
        kind = self.rng.choice(["replay", "from_id", "since", "pause"])
        self.tally.add(f"signal {kind}")
        if kind == "pause":
            state.paused = True
        elif kind == "replay":
            state.pending_replay = ReplaySignal()
        elif kind == "from_id":
            stored = sorted(self.log.stored_numbers())
            if stored:
                state.pending_replay = ReplaySignal(from_id=str(self.rng.choice(stored)))
        else:
            moment = self.now - timedelta(seconds=self.rng.uniform(0, 10))
            state.pending_replay = ReplaySignal(from_id=self.log.newest_at_or_before(moment))

    # -- the end ----------------------------------------------------------------------

    def _verifiable_skips(self) -> set[int]:
        """Ids an ended connection skipped whose notice was lost with it, inside the span the
        next connection's verification covers: ``verify_reconnects`` must bring them back
        (or count them, when the history lost them before the re-read)."""
        found: set[int] = set()
        for connection in self.server.connections:
            if not connection.ended or connection.verified is None:
                continue
            lagging, floor = connection.verified
            if lagging is None or floor is None:
                continue
            low, high = int(lagging), int(floor)
            for notice in connection.notices:
                if not notice.read:
                    found.update(n for n in notice.skipped if low < n <= high)
        return found

    def skipped_ids(self) -> set[int]:
        """Every id the server skipped on some connection (announced, late, silent, or
        with its notice lost): the source's ground truth of what a repair must bring."""
        return {
            n
            for connection in self.server.connections
            for notice in connection.notices
            for n in notice.skipped
        }

    def unannounced_skips(self) -> set[int]:
        """Ids some connection skipped while the server's notice never reached the reader
        (a late notice lost with its connection), on a stream whose ids are not
        contiguous: nothing shows such a skip, and a repair that skipped them looked
        continuous. (With contiguous ids the next id shows every skip.)"""
        if self.profile.contiguous:
            return set()
        return {
            n
            for connection in self.server.connections
            for notice in connection.notices
            if not notice.read
            for n in notice.skipped
        }

    def verdict(self) -> None:
        """The final oracle (after :meth:`run` settled)."""
        self.consumer.check()
        # "Repaired" is a claim about what the server announced: a repair whose own skip
        # went unannounced is taken for continuous (seed 595740684). Those ids are
        # checked below with the losses (``verify_reconnects`` must bring some back).
        self.consumer.check_repaired(self.skipped_ids() - self.unannounced_skips())
        for kind, met in self.consumer.met.items():
            self.tally.counts[f"consumer met: {kind}"] += met
        for connection in self.server.connections:
            early = [
                n
                for n in connection.announced
                if n.one_shot and n.read and n.announced_after == -1 and not connection.cursorless
            ]
            if early:
                self.tally.add("one-shot drop taken before the first event")
                if connection.header == "earliest":
                    self.tally.add("... after a truncation header")
                    if connection.behind:
                        self.tally.add("... on a replay from behind the newest stored id")
                        if self.profile.contiguous:
                            self.tally.add("... ... with contiguous ids (attributed exactly)")
        truth = set(range(1, self.server.newest + 1))
        stored = self.log.stored_numbers()
        extra = stored - truth
        if extra:
            raise Violation(f"stored ids the server never sent: {sorted(extra)[:10]}")
        gaps = list(self.log.gaps.values())
        unrecoverable = [g for g in gaps if g.state == GapState.UNRECOVERABLE]

        def counted_by_a_gap(number: int) -> bool:
            event_id = str(number)
            return any(g.contains(event_id, self.log.order) for g in unrecoverable)

        # The stream starts at its first stored event: a connection with no cursor reads
        # live, so what the server sent before that is the consumer's only if a drop
        # notice said it was skipped (then it is counted).
        # A drop before that event is counted as announced (a gap with no start), and is
        # left out of the comparison of counts below.
        # Two attempts of a connection with no cursor each read live from where they
        # began; the stream starts where the one that carried on began. Rows the presumed-
        # dead one committed late are older extras, and the ids between are before the
        # start (no attempt alive read them).
        first_stored = min(stored - self.late_first_rows or stored, default=self.server.newest + 1)
        lost = {n for n in truth - stored if n > first_stored}
        silent: set[int] = set()
        if not self.profile.contiguous:
            # Without contiguous ids only a notice tells of a skip. Ids no notice the
            # consumer read ever named (history dropped before anyone read them), and ids
            # some connection skipped while its notice was lost with it (a late notice
            # and a disconnect: the repair that skipped them looked continuous), are lost
            # to the server's silence, not ours to count.
            silent = self.unannounced_skips()
            # With verify_reconnects a notice lost with a connection the server cut or
            # the workflow cancelled is no excuse: the next connection suspects
            # everything read since the lagging id and re-reads it. Only ids outside
            # that span (no lagging id yet, or ids the lagging id had passed) stay
            # unknowable.
            must_recover = self._verifiable_skips() if self.profile.verify else set()
            silent -= must_recover
            if must_recover:
                self.tally.counts["ids skipped with a notice lost, verified"] += len(must_recover)
            # A gap that starts at the stream's oldest stored id has no older id to
            # start its repair from, so nothing can show that the history no longer
            # reaches it: its loss is unknowable too.
            blind = [g for g in gaps if g.start_id == str(first_stored)]
            lost = {
                n
                for n in lost
                if counted_by_a_gap(n)
                or (
                    (n in self.server.delivered or n in must_recover)
                    and n not in silent
                    and not any(g.contains(str(n), self.log.order) for g in blind)
                )
            }
        # A silent skip may also land inside a gap that a truncation made unrecoverable:
        # then it is counted, but no one could know that the history still holds it.
        # A connection told that the history no longer reaches its cursor cannot tell
        # the history's new start from a drop right before its first event: it counts
        # both as lost (loud), though the second may still be replayable.
        at_truncation = {
            n
            for connection in self.server.connections
            if connection.header == "earliest" and connection.sent
            for notice in connection.notices
            if not notice.read and notice.skipped and notice.skipped[-1] < connection.sent[0]
            for n in notice.skipped
        }
        in_history = {
            n
            for n in lost
            if n >= self.server.history_start
            and n > first_stored
            and n not in silent
            and n not in at_truncation
        }
        if in_history:
            raise Violation(f"lost ids the server can still replay: {sorted(in_history)[:20]}")
        for number in sorted(lost):
            if not counted_by_a_gap(number):
                raise Violation(f"id {number} is lost and no unrecoverable gap counts it")
        counted = sum(g.missing or 0 for g in unrecoverable)
        if self.profile.contiguous:
            # Exact: every lost id counted once, and every id counted either lost, stored
            # later (an attempt that was streaming it before the history dropped it: the
            # count was exact when the gap closed), or from before the stream's first
            # stored event (a notice before anything was stored).
            counted_ids: set[int] = set()
            for ids in self.log.counted_missing.values():
                if ids & counted_ids:
                    raise Violation(f"ids counted twice: {sorted(ids & counted_ids)[:10]}")
                counted_ids |= ids
            # A notice before the first event of a connection with no cursor, which then
            # ended: its ids are before whatever the stream stored first, uncountable by
            # position; its announced count stands alone.
            unplaced = sum(
                g.missing or 0 for g in unrecoverable if g.start_id is None and g.end_id is None
            )
            if counted != len(counted_ids) + unplaced or not lost <= counted_ids:
                raise Violation(
                    f"{len(lost)} ids lost but {counted} counted as unrecoverable: lost "
                    f"{sorted(lost)[:20]}, counted {sorted(counted_ids)[:20]}, gaps "
                    f"{[vars(g) for g in unrecoverable][:4]}"
                )
            unexplained = counted_ids - lost - stored - set(range(1, first_stored))
            if unexplained:
                raise Violation(
                    f"counted as lost but neither lost nor stored late: {sorted(unexplained)[:20]}"
                )
        totals = self.state.counters
        everything = sum(g.missing or 0 for g in unrecoverable)
        if totals.events_unrecoverable != everything or totals.gaps_unrecoverable != len(
            unrecoverable
        ):
            raise Violation(
                f"status says {totals.events_unrecoverable} events / "
                f"{totals.gaps_unrecoverable} gaps unrecoverable; the records say "
                f"{everything} / {len(unrecoverable)}"
            )
        if self.log.anomalies:
            raise Violation(f"retention: {self.log.anomalies[:3]}")
        self.tally.counts["ids generated"] = self.server.newest
        if self.log.dropped_by_horizon:
            self.tally.counts["events dropped by the horizon"] += self.log.dropped_by_horizon
        self.tally.counts["ids lost for good"] = len(lost)
        self.tally.counts["gaps"] = len(gaps)
        self.tally.counts["gaps unrecoverable"] = len(unrecoverable)


class SimWriter:
    """The writer one attempt submits to: the memory store, committed one batch at a time
    at moments the scheduler picks (in submission order, as group commit does)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.pending: deque[SimJob] = deque()
        self.settling: SimJob | None = None
        """The job whose result the pipeline took last (its cursors move next)."""

    def submit_batch(
        self,
        stream: str,
        id_order: str,
        events: Sequence[EventRecord],
        *,
        after: object = None,
        gap_changes: Sequence[object] = (),
        worker_id: str | None = None,
    ) -> SimJob:
        job = SimJob(list(events), [c for c in gap_changes if isinstance(c, GapChange)], worker_id)
        self.pending.append(job)
        return job

    def finished(self, job: SimJob) -> bool:
        return job.result is not None or job.error is not None

    def result(self, job: SimJob) -> InsertResult:
        self.settling = job
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def commit_next(self) -> SimJob:
        """The oldest pending batch's transaction; the fence (its worker's lease) read
        last, as :meth:`durable_sse.log.writer.Writer._fenced` does. The transaction a
        worker had open when it was paused is past that read: it commits."""
        job = self.pending.popleft()
        world = self.world
        fenced = job.worker_id is not None and not job.open_at_pause
        if fenced and world.workers.revoked_among([job.worker_id]):  # type: ignore[list-item]
            # Failed, and every batch submitted after it (log.commits): none commits.
            for refused in (job, *self.pending):
                refused.error = WorkerLeaseLostError(
                    f"stream {STREAM!r}: worker lease {job.worker_id} was revoked"
                )
            self.pending.clear()
            world.tally.add("commits refused by the fence")
            return job
        job.result = world.log.commit(job.records, job.changes, now=world.now)
        if world.log.anomalies:
            raise Violation(f"retention: {world.log.anomalies[:3]}")
        if world.workers.is_revoked(job.worker_id) and not job.open_at_pause:
            raise Violation(
                f"worker {job.worker_id}: a batch committed after its lease was revoked "
                f"(ids {[r.event_id for r in job.records][:10]}, changes "
                f"{[_described(c) for c in job.changes][:3]})"
            )
        return job


@dataclass(eq=False)
class SimJob:
    records: list[EventRecord]
    changes: list[GapChange]
    worker_id: str | None = None
    result: InsertResult | None = None
    error: WorkerLeaseLostError | None = None
    open_at_pause: bool = False
    """The transaction its worker had open (past the fence's read) when it was paused."""


class Attempt:
    """One execution attempt of ``read_stream``: the real :class:`ReadSession` and
    :class:`CommitPipeline`, fed by the simulated server and committed by the scheduler."""

    def __init__(self, world: World, read_input: ReadInput, session: ReadSession) -> None:
        self.world = world
        self.input = read_input
        self.rng = world.rng
        self.session = session
        self.writer = SimWriter(world)
        self.worker_id = world.new_worker()
        """The worker lease it runs under (each attempt its own worker)."""
        self.pipeline = CommitPipeline(
            session,
            self.writer,
            cursors=[self._to_l1, self._to_l2],
            on_settled=self._settled,
            worker_id=self.worker_id,
        )
        self.heartbeat: ReadProgress | None = None
        self.finished = False
        self.committed_any = False
        self.zombie = False
        self.lifetime = 0
        self.paused = 0
        """Steps its worker stays paused (a presumed-dead attempt that is not dead)."""
        self.pause = 0
        """How long that pause was (0: none)."""
        self.committed_when_revoked = True
        """Whether it had committed anything when its lease was revoked."""
        self.connection: SimConnection
        self.page_coming: StoredPage | None = None
        """A page of stored keys read from the log, not yet handed over (a fetch in
        flight: the log may take more rows meanwhile, never lose one)."""
        self.reader = world.new_reader()
        """Its registration (``sse_readers``): retention keeps its start while it runs."""

    @classmethod
    async def start(
        cls,
        world: World,
        read_input: ReadInput,
        *,
        retried: bool,
        progress: ReadProgress | None,
    ) -> Attempt:
        session = ReadSession(
            read_input,
            previous=progress,
            retried=retried,
            new_gap_id=world.new_gap_id,
            now_iso=lambda: world.now.isoformat(),
        )
        attempt = cls(world, read_input, session)
        start = await session.resolve(world.resolver(), reader=attempt.reader)

        def page_rows() -> int | None:
            # A replay skips what is stored (reader.stored), as the activity does, most of
            # the time: its first page before the first event, the next ones as it reads.
            return world.rng.choice([2, 5, 40]) if world.rng.random() < 0.8 else None

        if session.begin(start, page_rows=page_rows):
            attempt._fetch_stored()
            attempt._page_arrives()
        replay = Route(read_input.route) is not Route.LIVE
        faults = world.faults
        world.maybe_inject_drop(faults.one_shot_replay if replay else faults.one_shot)
        attempt.connection = world.server.connect(start.cursor, world.rng)
        floor = start.context.floor
        attempt.connection.behind = (
            start.cursor is not None
            and floor is not None
            and compare_ids(start.cursor, floor, world.spec.id_order) < 0
        )
        session.head(truncation_header=attempt.connection.header)
        if world.rng.random() < 0.9:
            attempt._beat()
        return attempt

    @property
    def start_cursor(self) -> str | None:
        return self.session.start_cursor

    @property
    def source(self) -> str:
        return self.session.result.cursor_source or ""

    @property
    def cursor(self) -> str | None:
        return self.session.started.cursor

    def _beat(self) -> None:
        self.heartbeat = self.session.progress()

    def step(self) -> Outcome | None:
        """Read a little, cut, commit a little. An outcome when the connection ended."""
        if self.finished:
            return None
        session, connection = self.session, self.connection
        intake = session.started
        if intake.outcome is not None:
            return intake.outcome
        connection.pump()
        if self.rng.random() < self.world.profile.disconnect_rate or connection.cut_due:
            cut = self.rng.randint(0, len(connection.buffer))
            if connection.cut_due:
                cut = len(connection.buffer)  # (scripted) right after the id it cuts at
            self._take(connection.read(cut))
            if not self.zombie:
                connection.cut = True
            outcome = session.ended()
            self._collect()
            return outcome
        chunk = connection.read(self.rng.randint(1, 200))
        if chunk:
            self._take(chunk)
        if intake.stored is not None:
            if self.page_coming is not None and self.rng.random() < 0.5:
                self._page_arrives()
            self._fetch_stored()
        intake.poll(self.world.clock)
        self._collect()
        while self.pipeline.in_flight and (
            len(self.pipeline.in_flight) > 3 or self.rng.random() < 0.6
        ):
            self._commit_one()
        if self.world.deletes.random() < 0.2:
            # The progress report moves the registration's hold (Connection.move_hold).
            hold = intake.retention_hold(self.world.clock)
            if hold is not None:
                self.world.log.move_reader(self.reader.reader_id, hold)
        return intake.outcome

    def _take(self, chunk: bytes) -> None:
        """Decode and hand over: every item of a chunk read is taken, also once the
        intake has decided to end (as the reader takes what it read ahead); an ending
        connection only reads no further chunk (``step``)."""
        items = self.session.feed(chunk, received_at=self.world.now, now=self.world.clock)
        for item in items:
            if isinstance(item, Comment) and item.text != "ping":
                self.connection.notice_taken()

    def _fetch_stored(self) -> None:
        after = self.session.stored_fetch_due()
        if after is not None:
            self.page_coming = self.world.log.stored_page(after, self.session.page_rows)

    def _page_arrives(self) -> None:
        if self.page_coming is not None:
            self.session.stored_page(self.page_coming)
            self.page_coming = None

    def _collect(self) -> None:
        self.pipeline.submit_ready()
        self.pipeline.settle()  # batches with nothing to write move the cursor at once

    def _commit_one(self) -> None:
        """One transaction of this attempt's (the oldest pending), then what it moved."""
        if self.writer.pending:
            self.writer.commit_next()
        self.pipeline.settle()
        self.pipeline.check()

    def _to_l1(self, stream: str, cursor: str, order: str) -> None:
        self._check_cursor("L1", cursor)
        if not self.zombie:  # a presumed-dead attempt's worker kept its own L1
            self.world.l1.advance(stream, cursor, order)

    def _to_l2(self, stream: str, cursor: str, order: str) -> None:
        self._check_cursor("L2", cursor)
        self.world.redis.submit(stream, cursor, order)

    def _check_cursor(self, store: str, cursor: str) -> None:
        """The oracle: once its worker's lease is revoked, an attempt moves no cursor by a
        commit but the transaction it had open at the pause. A batch with nothing to write
        (a replay's events, all stored) has no transaction, so no fence: it still moves
        the cursors, to a stored id, until the attempt's next commit or its worker's next
        renewal ends it (counted; see the report of issue 34)."""
        if not self.world.workers.is_revoked(self.worker_id):
            return
        job = self.writer.settling
        if job is None:
            self.world.tally.add(f"{store} moved by a revoked attempt, nothing to write")
        elif not job.open_at_pause:
            raise Violation(
                f"worker {self.worker_id}: moved {store} to {cursor} after its lease was revoked"
            )

    def _settled(self, settled: Settled) -> None:
        world, batch = self.world, settled.batch
        job, self.writer.settling = self.writer.settling, None
        self.committed_any = True
        if batch.skipped:
            world.tally.add("events skipped as stored")
        if self.zombie and self.start_cursor is None:
            world.late_first_rows.update(int(r.event_id) for r in batch.records if r.event_id)
        opened = [c.gap_id for c in batch.gap_changes if c.opened is not None]
        if self.zombie and opened:
            # Only the transaction it had open at the pause gets past the fence.
            past = job is None or not job.open_at_pause
            if past and world.workers.is_revoked(self.worker_id):
                raise Violation(f"worker {self.worker_id}: opened {opened} past the fence")
            world.zombie_gaps.update(opened)
            world.tally.add("gaps opened by a transaction open at a pause")
        if batch.gap_changes:
            world.note(
                f"commit {[r.event_id for r in batch.records]} changes "
                f"{[_described(change) for change in batch.gap_changes]}"
            )
        if settled.moved.cursor is not None:
            world.check_notices(self.connection, settled.moved.cursor)
        if settled.moved.first or self.rng.random() < 0.7:
            self._beat()

    def notices_die(self) -> None:
        """It committed nothing, so nothing durable shows that it read anything: a notice
        it took died with it, like a notice lost with its connection. (One that committed
        leaves a retry suspicion past what it stored.)"""
        connection = self.connection
        for notice in connection.announced[: connection.taken]:
            notice.read = False

    def fenced(self) -> None:
        """A commit failed with :class:`WorkerLeaseLostError`: the attempt stops there
        (its stream reads elsewhere already); its registration goes with it. Had it
        committed nothing when it was taken for dead, the notices it took die with it, as
        a dead attempt's do (seed 546254972: the retry had nothing to suspect)."""
        if not self.committed_when_revoked:
            self.notices_die()
        self.writer.pending.clear()
        self.pipeline.abandon()
        self.finished = True
        self.world.log.release_reader(self.reader.reader_id)
        self.world.tally.add("presumed-dead attempt stopped by the fence")
        if self.pause:
            self.world.tally.add("... paused, came back, stopped by the fence")

    def inflight_lost(self) -> None:
        """The worker died: batches not yet committed never will be."""
        self.writer.pending.clear()
        self.pipeline.abandon()
        self.finished = True

    def finish(self, outcome: Outcome) -> ReadResult:
        """Flush (commit everything read) and build the result, as the connection does."""
        self.session.stop()
        self._collect()
        while self.pipeline.in_flight:
            self._commit_one()
        self.finished = True
        log = self.world.log
        log.release_reader(self.reader.reader_id)
        result = self.session.finish(outcome)
        result.gaps = summarize(list(log.gaps.values()), log.order)
        result.lagging_id = log.lagging_id
        return result


class SimConsumer:
    """A consumer group (not holding retention) reading the stream while it is written:
    the real merge (:func:`durable_sse.consume.items.merge_items`) over the memory
    store's rows and gap markers, a batch at a time at moments the scheduler picks.

    The oracle: every event once, in ``seq`` order; a row retention deleted before the
    group read it is reported by a ``Truncated`` that covers it; each gap's opening and
    closing met once, the closing after the opening, each between the events where it
    happened (after the events up to its ``after_seq``, before the later ones).
    """

    def __init__(self, log: MemoryEventLog) -> None:
        self.log = log
        self.position = Position()
        self.items: list[Item] = []
        self.met: Counter[str] = Counter()

    def read(self, *, limit: int) -> bool:
        """One batch; True when more may follow at once."""
        read = self.log.consumer_read(self.position, limit=limit)
        self.items.extend(read.items)
        moved = read.end != self.position
        self.position = read.end
        return read.full and moved

    def check(self) -> None:
        for _ in range(100_000):
            if not self.read(limit=50):
                break
        seqs: list[int] = []
        truncations: list[tuple[int, int]] = []
        opened: list[str] = []
        closed: list[str] = []
        place = 0
        for item in self.items:
            if isinstance(item, ConsumedEvent):
                if seqs and item.seq <= seqs[-1]:
                    raise Violation(f"consumer: event seq {item.seq} after {seqs[-1]}")
                if item.seq < place:
                    raise Violation(f"consumer: event {item.seq} after a marker at {place}")
                seqs.append(item.seq)
                place = item.seq
            elif isinstance(item, Truncated):
                truncations.append((item.after_seq, item.through_seq))
            else:
                if seqs and item.after_seq < seqs[-1]:
                    raise Violation(
                        f"consumer: gap {item.gap_id} marked after seq {item.after_seq} met "
                        f"after event {seqs[-1]}"
                    )
                place = max(place, item.after_seq)
                if isinstance(item, GapClosedItem):
                    if item.gap_id not in opened:
                        raise Violation(f"consumer: gap {item.gap_id} closed before opened")
                    closed.append(item.gap_id)
                else:
                    opened.append(item.gap_id)
        log = self.log
        delivered = set(seqs)
        skipped = {row.seq for row in log.rows.values()} - delivered
        if skipped:
            raise Violation(f"consumer: stored rows never delivered: {sorted(skipped)[:10]}")
        unreported = {
            seq
            for seq in log.deleted_seqs - delivered
            if not any(low < seq <= high for low, high in truncations)
        }
        if unreported:
            raise Violation(
                f"consumer: rows deleted unread and not reported: {sorted(unreported)[:10]}"
            )
        self.met.update(events=len(seqs), gaps=len(opened), truncations=len(truncations))
        if sorted(opened) != sorted(log.opened_markers) or len(set(opened)) != len(opened):
            raise Violation(f"consumer: gap openings met {opened}, recorded {log.opened_markers}")
        if sorted(closed) != sorted(log.closed_markers) or len(set(closed)) != len(closed):
            raise Violation(f"consumer: gap closings met {closed}, recorded {log.closed_markers}")

    def check_repaired(self, skipped: set[int]) -> None:
        """A consumer that meets ``GapClosed(repaired)`` may take the stream as whole up
        to there: every id the source skipped inside the gap's bounds is an event it met
        before, at a smaller ``seq`` (stored then; retention may have deleted it since)."""
        log = self.log
        for item in self.items:
            if not isinstance(item, GapClosedItem) or item.state != GapState.REPAIRED:
                continue
            gap = log.gaps[item.gap_id]
            absent = sorted(
                n
                for n in skipped
                if gap.contains(str(n), log.order)
                and log.first_seq.get(n, item.after_seq + 1) > item.after_seq
            )
            if absent:
                self.met["repaired early"] += 1
                raise Violation(
                    f"consumer: gap {item.gap_id} ({gap.kind}, {gap.start_id}..{gap.end_id}, "
                    f"announced {gap.announced}, recovered {gap.recovered}) closed as "
                    f"repaired after seq {item.after_seq}, but ids the source skipped inside "
                    f"it were not stored by then: {absent[:20]}"
                )


@dataclass
class RetentionRun:
    """A retention run in progress (``Prune.apply_retention``, one statement a step)."""

    cutoff: datetime
    limit: int
    statements: int
    after: int | None = None


def _described(change: GapChange) -> dict[str, object]:
    shown: dict[str, object] = {k: v for k, v in vars(change).items() if v and k != "opened"}
    if change.opened is not None:
        shown["opened"] = (change.opened.start_id, change.opened.notice_id)
    return shown


async def run_schedule(seed: int, **options: object) -> World:
    logging.getLogger("durable_sse").setLevel(logging.ERROR)
    world = World(seed, **options)  # type: ignore[arg-type]
    await world.run()
    world.verdict()
    return world
