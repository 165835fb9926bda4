"""The drain at a stop: running handlers get ``drain_timeout`` to finish; then those that
can be stopped are cancelled (their tasks come back after ``ack_wait``), and those that
cannot, handlers in worker threads, are waited for and their outcomes reported. Outcomes
not recorded yet (the server away) get ``drain_timeout`` more. And the signals that start
a stop in ``Agent.run``.

A cancelled ``def`` handler went on in its thread to its end all the same (the process
waited for it to exit), its result thrown away: the task came back and ran again, its
effect twice (a walkthrough's SIGTERM during a 15 s blocking handler)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from agentreach.broker.tasks import cancel_and_wait
from agentreach.logs import get_logger

log = get_logger("agents")

# The tasks waiting on a handler's worker thread (see the module).
IN_THREADS: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
# The tasks whose handler has ended: their message ids, and whether the outcome is recorded
# (it is being reported then).
ENDED: weakref.WeakKeyDictionary[asyncio.Task[Any], tuple[str, bool]] = weakref.WeakKeyDictionary()


def recording(message_id: str, *, recorded: bool = False) -> None:
    """Say that the running task's handler has ended and its outcome is being recorded (or,
    ``recorded``, reported): a stop's drain does not cut it with the handlers still running
    (an outside trial: a run that ended before a SIGTERM during an outage was thrown away,
    and ran again)."""
    if (task := asyncio.current_task()) is not None:
        ENDED[task] = (message_id, recorded)


async def drain(tasks: list[asyncio.Task[None]], timeout: float, agent_id: str) -> None:
    """Wait up to ``timeout`` for ``tasks``; then cancel the running handlers but those in
    a worker thread, which are waited for to their end; outcomes being recorded get up to
    ``timeout`` more."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    in_threads = [task for task in pending if task in IN_THREADS and task not in ENDED]
    if cut := [task for task in pending if task not in IN_THREADS and task not in ENDED]:
        log.warning(
            "handlers still running after the drain timeout were cancelled: the coordinator"
            " assigns their tasks again (with none running, they come back after ack_wait)",
            agent_id=agent_id,
            cancelled=len(cut),
            drain_timeout_s=timeout,
        )
        await cancel_and_wait(*cut)
    if in_threads:
        log.warning(
            "handlers in worker threads still running after the drain timeout cannot be"
            " cancelled: their outcomes are waited for and reported before the agent stops",
            agent_id=agent_id,
            running=len(in_threads),
            drain_timeout_s=timeout,
        )
        await asyncio.wait(in_threads)
    if ended := [task for task in pending if task in ENDED]:
        await _outcomes_recorded(ended, timeout, agent_id)


async def _outcomes_recorded(tasks: list[asyncio.Task[Any]], timeout: float, agent_id: str) -> None:
    """Give runs whose outcomes are not recorded yet ``timeout`` more (the server may come
    back); those still unrecorded are given up, their tasks to run again."""
    log.warning(
        "runs that ended are still recording their outcomes (is NATS reachable?): waiting"
        " up to drain_timeout more for them",
        agent_id=agent_id,
        recording=len(tasks),
        drain_timeout_s=timeout,
    )
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    if unrecorded := sorted(ENDED[task][0] for task in pending if not ENDED[task][1]):
        log.error(
            "outcomes given up at the stop, never recorded: NATS was unreachable; these"
            " tasks run again when delivered again",
            agent_id=agent_id,
            message_ids=unrecorded,
        )
    if unreported := sorted(ENDED[task][0] for task in pending if ENDED[task][1]):
        log.warning(
            "outcomes recorded but not reported at the stop: NATS was unreachable; their"
            " tasks, delivered again, are answered from the records",
            agent_id=agent_id,
            message_ids=unreported,
        )
    await cancel_and_wait(*pending)


@contextlib.contextmanager
def stopped_by_signals(stop: Callable[[], Awaitable[None]], enabled: bool = True) -> Iterator[None]:
    """While inside: SIGTERM and SIGINT call ``stop``; a second one ends the process as the
    signal would have (a stop that cannot finish, its server gone, must not leave a process
    that ignores Ctrl-C). Nothing where the loop takes no signal handlers (a thread other
    than the main one, Windows), or when not ``enabled``."""
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Future[None]] = []

    def on_signal(sig: signal.Signals) -> None:
        if stopping:
            log.warning("a second signal while stopping: the process ends now", signal=sig.name)
            loop.remove_signal_handler(sig)
            signal.raise_signal(sig)  # its default action: SIGTERM ends, SIGINT interrupts
            return
        log.info("stopping on a signal", signal=sig.name)
        stopping.append(asyncio.ensure_future(stop()))

    taken = []
    for sig in (signal.SIGTERM, signal.SIGINT) if enabled else ():
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (ValueError, RuntimeError, NotImplementedError):
            continue  # not the main thread, or no such handlers here
        taken.append(sig)
    try:
        yield
    finally:
        for sig in taken:
            loop.remove_signal_handler(sig)
