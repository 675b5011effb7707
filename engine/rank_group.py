"""The rank processes of one engine: start them, send every rank a message and collect the replies, replace them
all when one dies, stop them."""

from __future__ import annotations

import contextlib
import logging
import socket
from multiprocessing.connection import wait
from pathlib import Path

import torch.multiprocessing as mp

from engine.errors import EngineError
from engine.host_image import HostImage
from engine.rank import rank_main
from solvers.rig import Rig

log = logging.getLogger("seam.engine")


class RankFailure(EngineError):
    """A rank reported an error or died; carries which rank and what it said."""

    def __init__(self, rank: int, message: str, died: bool = False):
        super().__init__(f"rank {rank}: {message}")
        self.rank, self.died = rank, died


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RankGroup:
    def __init__(self, rig: Rig, checkpoint: str | Path, image: HostImage):
        self.rig, self.checkpoint, self.image = rig, checkpoint, image
        self.pipes: list = []
        self.processes: list = []
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

    def restart(self) -> None:
        """A dead rank breaks the process group: replace every rank process (layouts are rebuilt after)."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
        self.start()

    def alive(self) -> bool:
        return all(process.is_alive() for process in self.processes)

    def call_all(self, kind: str, payloads: list) -> list:
        """Send one message to every rank and collect every reply; the first failure is raised."""
        for pipe, payload in zip(self.pipes, payloads, strict=True):
            pipe.send((kind, payload))
        replies, failure = [], None
        for rank, pipe in enumerate(self.pipes):
            # A dead rank never answers, and its peers block on it: stop waiting at once.
            ready = wait([pipe, self.processes[rank].sentinel])
            try:
                if pipe not in ready:
                    raise EOFError
                reply = pipe.recv()
            except (EOFError, OSError):
                self.processes[rank].join(timeout=5)
                raise RankFailure(rank, f"the rank process died (exit code {self.processes[rank].exitcode})",
                                  died=True) from None
            if reply[0] == "error":
                log.warning("rank %d: %s\n%s", rank, reply[1], reply[2])
                failure = failure or RankFailure(rank, reply[1])
            replies.append(reply[1])
        if failure:
            raise failure
        return replies

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError, BrokenPipeError):
                pipe.send(("stop", None))
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
