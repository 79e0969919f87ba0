"""What dead processes left behind: runs still RUNNING whose owner is gone (src.tracking.store.owner) are ended,
jobs as failed (interrupted), then their sweeps, with their job counts."""

from __future__ import annotations

from src.tracking.store import owner
from src.tracking.store.locks import replay_lock
from src.tracking.store.names import HEARTBEAT, OUTCOME, OWNER, ROLE


def reap(store) -> list[str]:
    """End runs left RUNNING by owners that are gone: jobs as failed (interrupted), then their sweeps. Not
    while a replay into the store is under way here: its runs' owners are gone too, yet they are being ended."""
    with replay_lock(store.uri):
        return _reap(store)


def _reap(store) -> list[str]:
    lines = []
    running = store.search("attributes.status = 'RUNNING'", max_results=1000)
    for run in sorted(running, key=lambda r: r.data.tags.get(ROLE) == "sweep"):  # jobs first
        tags = run.data.tags
        why = owner.gone(tags.get(OWNER), tags.get(HEARTBEAT))
        if not why:
            continue
        reason = f"interrupted: {why} without ending the run"
        if tags.get(ROLE) == "sweep":
            # Its jobs may all have ended (a store that was down when the sweep ended): then it is done.
            jobs = store.latest_jobs(run.info.run_id)
            done = jobs and all(j.data.tags.get(OUTCOME) in ("finished", "skipped") for j in jobs)
            counts = store.close_sweep(
                run.info.run_id,
                "FINISHED" if done else "FAILED",
                f"closed by a later process: {why}" if done else reason,
            )
            lines.append(
                f"{run.info.run_name} was left running ({why}); closed with "
                + ", ".join(f"{n} {o}" for o, n in counts.items() if n)
            )
        else:
            store.end_run(run.info.run_id, "failed", reason)
            lines.append(f"job {run.info.run_name} was left running ({why}); marked failed")
    return lines
