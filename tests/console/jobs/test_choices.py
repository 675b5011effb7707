"""The job state machine as docs/architecture.md §3.5 draws it, declared once."""

from console.jobs.choices import ACTIVE, CANCELLABLE, TERMINAL, TRANSITIONS, JobStatus, can_move

S = JobStatus


def test_the_main_line_and_the_side_exits_are_the_only_ways_through():
    main_line = [S.PROPOSED, S.APPROVED, S.QUEUED, S.RUNNING]
    for here, there in zip(main_line, main_line[1:], strict=False):
        assert can_move(here, there)
    assert {to for to in TRANSITIONS[S.RUNNING]} == {S.SUCCEEDED, S.FAILED, S.ROLLED_BACK, S.STALE}
    assert can_move(S.PROPOSED, S.REJECTED) and can_move(S.QUEUED, S.CANCELLED)
    assert not can_move(S.PROPOSED, S.QUEUED)  # no skipping the approval
    assert not can_move(S.PROPOSED, S.RUNNING)
    assert not can_move(S.RUNNING, S.CANCELLED)  # once the engine may be acting, only the engine's outcome ends it


def test_terminal_statuses_have_no_way_out():
    assert set(S) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert {S.SUCCEEDED, S.FAILED, S.ROLLED_BACK, S.REJECTED, S.STALE, S.CANCELLED} == TERMINAL
    for status in TERMINAL:
        assert not any(can_move(status, to) for to in S)


def test_only_jobs_that_have_not_started_can_be_cancelled():
    assert {S.PROPOSED, S.APPROVED, S.QUEUED} == CANCELLABLE
