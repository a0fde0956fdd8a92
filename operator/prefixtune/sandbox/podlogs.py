"""Container logs: what the twin kubelet keeps of each container's output, served as ``pods/log``.

A real kubelet keeps each container's stdout and stderr, the current run and the one before it
(``kubectl logs --previous``), and kube-apiserver's ``pods/log`` reads them from the pod's node. A
twin prints nothing, so the sandbox kubelet writes the lines it knows a run produced: the command
it starts, the server listening (after the model load), and the exit, with the engine's own message
(argparse's usage error, the CUDA out-of-memory error). The emulator reads them through
``PodLogSource`` (``emulator/logs.py``); nothing else reads them.

Bounded: at most ``max_lines`` lines per run (the oldest dropped first), each cut to ``max_line``
characters; two runs per container; a pod's logs are forgotten when its worker stops (the pod was
deleted), as a node removes a deleted pod's log files.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

_Key = tuple[str, str]  # (pod uid, container)


@dataclass(frozen=True)
class LogLine:
    stamp: str  # RFC 3339, on the sandbox clock
    text: str


@dataclass
class _Runs:
    current: collections.deque[LogLine]
    previous: tuple[LogLine, ...] | None = None


@dataclass
class ContainerLogs:
    """The log lines of every container of the node, by pod uid (``read`` is ``PodLogSource``)."""

    max_lines: int = 1000
    max_line: int = 4096
    _runs: dict[_Key, _Runs] = field(default_factory=dict)

    def start(self, uid: str, container: str) -> None:
        """A new run of the container: the current run becomes the previous one."""
        runs = self._runs.get((uid, container))
        fresh: collections.deque[LogLine] = collections.deque(maxlen=self.max_lines)
        if runs is None:
            self._runs[uid, container] = _Runs(fresh)
        else:
            runs.previous, runs.current = tuple(runs.current), fresh

    def write(self, uid: str, container: str, stamp: str, text: str) -> None:
        """Lines of the current run (``text`` may hold several; each is cut to ``max_line``)."""
        runs = self._runs.get((uid, container))
        if runs is None:
            self.start(uid, container)
            runs = self._runs[uid, container]
        for line in text.splitlines() or [""]:
            runs.current.append(LogLine(stamp, line[: self.max_line]))

    def forget(self, uid: str) -> None:
        for key in [k for k in self._runs if k[0] == uid]:
            del self._runs[key]

    def read(self, uid: str, container: str, previous: bool) -> tuple[LogLine, ...] | None:
        """The run's lines, or None when that run never started."""
        runs = self._runs.get((uid, container))
        if runs is None:
            return None
        return runs.previous if previous else tuple(runs.current)
