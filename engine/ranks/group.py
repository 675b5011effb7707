"""The rank processes of one engine: start them, send every rank a message and collect the replies within a
timeout, replace them all when one dies or stalls, stop them."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from multiprocessing.connection import wait
from pathlib import Path

import torch.multiprocessing as mp

from engine.errors import EngineError
from engine.memory.host_image import HostImage
from engine.ranks.pipeline import RENDEZVOUS_S, STEP_TIMEOUT_S, seconds_from_env
from engine.ranks.rank import rank_main
from solvers.rig import Rig

log = logging.getLogger("seam.engine")

STEP_TIMEOUT_ENV, BUILD_TIMEOUT_ENV = "SEAM_STEP_TIMEOUT_S", "SEAM_BUILD_TIMEOUT_S"
# How long the driver waits for every rank's reply, per kind of message and device type. A step allows twice the
# ranks' own receive timeout (engine/ranks/pipeline.py), so a rank waiting on a stalled peer usually names it first; a
# build
# (which probes also use) copies layers from the host image, minutes for a large model on a GPU.
DEFAULT_TIMEOUT_S = {"step": {device: 2 * seconds for device, seconds in STEP_TIMEOUT_S.items()},
                     "build": {"cpu": 300.0, "cuda": 1800.0}}


class RankFailure(EngineError):
    """A rank reported an error, died or stalled; carries which rank and what it said. `restart`: the process group
    cannot be trusted any more (a rank died, stalled, or a transfer between ranks failed), so every rank process
    must be replaced before the ranks can step again."""

    def __init__(self, rank: int, message: str, restart: bool = False):
        super().__init__(f"rank {rank}: {message}")
        self.rank, self.restart = rank, restart


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RankGroup:
    def __init__(self, rig: Rig, checkpoint: str | Path, image: HostImage):
        self.rig, self.checkpoint, self.image = rig, checkpoint, image
        device = "cuda" if any(spec.device.startswith("cuda") for spec in rig.ranks) else "cpu"
        self.timeouts = {"step": seconds_from_env(STEP_TIMEOUT_ENV, DEFAULT_TIMEOUT_S["step"][device]),
                         "build": seconds_from_env(BUILD_TIMEOUT_ENV, DEFAULT_TIMEOUT_S["build"][device])}
        self.pipes: list = []
        self.processes: list = []
        self.restarts = 0
        self.start()

    @property
    def shared_device(self) -> bool:
        """Two ranks on one GPU (a rig emulated on one card): NCCL cannot join them, so they talk gloo."""
        gpus = [spec.device for spec in self.rig.ranks if spec.device.startswith("cuda")]
        return len(set(gpus)) < len(gpus)

    def start(self) -> None:
        context = mp.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self.pipes, self.processes = [], []
        for rank, spec in enumerate(self.rig.ranks):
            parent, child = context.Pipe()
            device = spec.device if spec.device.startswith("cuda") else "cpu"
            process = context.Process(target=rank_main, name=f"seam-rank-{rank}", daemon=True, args=(
                rank, self.rig.size, init_method, child, str(self.checkpoint), self.image, device,
                spec.memory_bytes, self.shared_device))
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)
        self._await_ready()

    def _await_ready(self) -> None:
        """Wait until every rank has joined the process group, so the timeouts of call_all time only the work; a
        rank that exits meanwhile fails the start at once (its peers would wait for it until the rendezvous ends)."""
        deadline = time.monotonic() + RENDEZVOUS_S
        waiting = dict(enumerate(self.pipes))
        while waiting:
            sentinels = {self.processes[rank].sentinel: rank for rank in waiting}
            ready = wait([*waiting.values(), *sentinels], timeout=max(0.0, deadline - time.monotonic()))
            exited = [sentinels[item] for item in ready if item in sentinels]
            if not ready or exited:
                why = (f"rank {exited[0]} exited at start (exit code {self.processes[exited[0]].exitcode})" if exited
                       else f"ranks {sorted(waiting)} did not join the process group within {RENDEZVOUS_S:g} s")
                self._kill()
                raise EngineError(why)
            for rank, pipe in list(waiting.items()):
                if pipe in ready:
                    pipe.recv()
                    del waiting[rank]

    def restart(self) -> None:
        """A dead or stalled rank breaks the process group: replace every rank process (SIGKILL, which a stopped
        process obeys too); layouts are rebuilt after."""
        self._kill()
        self.restarts += 1
        self.start()

    def _kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)

    def alive(self) -> bool:
        return all(process.is_alive() for process in self.processes)

    def call_all(self, kind: str, payloads: list) -> list:
        """Send one message to every rank and collect every reply within the kind's timeout (a build's for anything
        but a step); the first failure is raised, marked `restart` when the process group is no longer sound."""
        timeout_s = self.timeouts.get(kind, self.timeouts["build"])
        deadline = time.monotonic() + timeout_s
        for rank, (pipe, payload) in enumerate(zip(self.pipes, payloads, strict=True)):
            try:
                pipe.send((kind, payload))
            except OSError:  # its end of the pipe is closed: the process is gone
                raise self._died(rank) from None
        replies, failure, transport = [], None, False
        for rank, pipe in enumerate(self.pipes):
            # A dead rank never answers, and its peers block on it: stop waiting at once. A stalled one (SIGSTOP, a
            # hung kernel) is alive but silent: stop waiting at the deadline.
            ready = wait([pipe, self.processes[rank].sentinel], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RankFailure(rank, f"no reply to {kind} within {timeout_s:g} s: the rank is stalled",
                                  restart=True)
            try:
                if pipe not in ready:
                    raise EOFError
                reply = pipe.recv()
            except (EOFError, OSError):
                raise self._died(rank) from None
            if reply[0] == "error":
                log.warning("rank %d: %s\n%s", rank, reply[1], reply[2])
                failure = failure or RankFailure(rank, reply[1])
                transport |= reply[3]  # this rank's failed transfer condemns the group, whoever failed first
            replies.append(reply[1])
        if failure:
            failure.restart = transport
            raise failure
        return replies

    def _died(self, rank: int) -> RankFailure:
        self.processes[rank].join(timeout=5)
        return RankFailure(rank, f"the rank process died (exit code {self.processes[rank].exitcode})", restart=True)

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError, BrokenPipeError):
                pipe.send(("stop", None))
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
