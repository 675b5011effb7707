"""RankGroup.call_all against rank processes that are gone: a failure naming the rank, marked for a restart, never a
bare pipe error (the driver's recovery reads `restart` to replace the process group)."""

import multiprocessing as mp

import pytest

from engine.ranks.group import RankFailure, RankGroup


def group_of_one_exited_rank(close_its_end: bool) -> RankGroup:
    """A group whose one rank process (a real one) has exited with code 3; with `close_its_end` no process holds the
    other end of its pipe any more, so a send fails (as when a spawned rank dies), else a send succeeds and only the
    reply never comes."""
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=exit, args=(3,))
    process.start()
    process.join()
    if close_its_end:
        child.close()
    group = RankGroup.__new__(RankGroup)  # the pipes and processes only: no checkpoint, no rig
    group.pipes, group.processes, group.timeouts = [parent], [process], {"build": 5.0}
    group._kept_end = child  # an open end keeps the send from failing
    return group


@pytest.mark.parametrize("close_its_end", [True, False])
def test_a_call_to_a_dead_rank_is_a_rank_failure_asking_for_a_restart(close_its_end):
    group = group_of_one_exited_rank(close_its_end)
    with pytest.raises(RankFailure) as failure:
        group.call_all("step", [None])
    assert failure.value.rank == 0 and failure.value.restart
    assert "the rank process died (exit code 3)" in str(failure.value)
