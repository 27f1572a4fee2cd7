"""What ranks print, shown in the notebook line by line with a ``[rank r]`` prefix.

A rank's file descriptors 1 and 2 are pipes whose read ends live here, so everything written
there arrives: Python's ``print``, C and C++ output (NCCL's warnings, the watchdog's reason),
``faulthandler``'s dump of a crashing rank. Text is decoded as it comes and shown in whole
lines; a line still open when the run ends (``print(".", end="")`` in a loop) is shown then,
as one line. Kineto's note on each profiler start and stop (``USDT:... profiler_start``,
printed by torch 2.13's C++ whatever the log level) is left out: it says nothing a learner
can act on, and ``profile=DIR`` would print it twice per rank and run. A run shows at most
``MAX_LINES`` lines of each rank's stream, then says how many more it left out (a print in a
loop of a million steps would stall the notebook's browser).
"""

from __future__ import annotations

import codecs
import os
import re
import sys

_READ_BYTES = 1 << 16
MAX_LINES = 2000  # per rank, stream and run
_QUIET = re.compile(r"^USDT:.*SyncActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)$")


class RankStream:
    """The read end of one rank's stdout or stderr pipe."""

    def __init__(self, fd: int, rank: int, name: str):
        os.set_blocking(fd, False)
        self.fd, self.rank, self.name = fd, rank, name
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._open_line = ""
        self._shown = self._hidden = 0

    def fileno(self) -> int:
        return self.fd

    def _target(self):
        return sys.stdout if self.name == "stdout" else sys.stderr

    def read(self) -> bool:
        """Show every whole line available now; False once the rank's end is closed."""
        if self.fd < 0:
            return False
        text = []
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._show(self._decoder.decode(b"", final=True))
                self.end_line()
                self.close()
                return False
            text.append(self._decoder.decode(data))
        self._show("".join(text))
        return True

    def _show(self, text: str) -> None:
        if not text:
            return
        text = self._open_line + text
        whole, newline, self._open_line = text.rpartition("\n")
        if newline:
            self._write([line for line in whole.split("\n") if not _QUIET.match(line)])

    def _write(self, lines: list[str]) -> None:
        room = max(0, MAX_LINES - self._shown)
        self._shown += min(room, len(lines))
        self._hidden += max(0, len(lines) - room)
        prefix = f"[rank {self.rank}] "
        self._target().write("".join(prefix + line + "\n" for line in lines[:room]))

    def end_run(self) -> None:
        """The run is over: say how many lines were left out, and count afresh."""
        if self._hidden:
            self._target().write(f"[rank {self.rank}] ... and {self._hidden:,} more lines "
                                 f"(a run shows {MAX_LINES:,} per rank and stream)\n")
        self._shown = self._hidden = 0

    def end_line(self) -> None:
        """Show a line left open (no newline yet) as a line of its own."""
        if self._open_line:
            line, self._open_line = self._open_line, ""
            self._write([line])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def drain(streams, end_lines: bool = True) -> None:
    """Show what ``streams`` hold now (all of it: the ranks wrote it before they answered)."""
    for stream in streams:
        stream.read()
        if end_lines:
            stream.end_line()
            stream.end_run()
    for target in (sys.stdout, sys.stderr):
        try:
            target.flush()
        except (OSError, ValueError):
            pass
