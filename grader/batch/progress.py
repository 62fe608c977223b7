"""Progress of a batch: a rich bar on a terminal, plain 'graded i/n ... ETA' lines otherwise."""

from __future__ import annotations

import sys
import time
from collections import deque

ETA_WINDOW = 50                      # students whose pace the plain progress lines extrapolate


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """A rich progress bar on a terminal; plain 'graded i/n ... ETA' lines otherwise."""

    def __init__(self, *, total: int, enabled: bool, stream=None):
        self.total, self.enabled = total, enabled and total > 0
        self.stream = stream or sys.stdout
        self.done = self.failed = 0
        self.started = time.monotonic()
        self.last_line = 0.0
        self.recent: deque = deque(maxlen=ETA_WINDOW)    # when the latest students finished
        self.bar = None
        if self.enabled and self.stream.isatty():
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)
            self.bar = RichProgress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                                    TextColumn("ETA"), TimeRemainingColumn())
            self.bar.start()
            self.task = self.bar.add_task("grading", total=total, failed="")

    def advance(self, reply: dict) -> None:
        self.done += 1
        self.failed += reply.get("fault") is not None
        if not self.enabled:
            return
        failed = f"{self.failed} not ok" if self.failed else ""
        if self.bar is not None:
            self.bar.update(self.task, advance=1, failed=failed)
            return
        now = time.monotonic()
        self.recent.append(now)
        step = max(1, self.total // 20)
        if self.done == self.total or self.done % step == 0 or now - self.last_line > 30:
            self.last_line = now
            # The pace of the latest ETA_WINDOW students: once they are all past the
            # start-up, neither it nor the rejected zips (written at once) skew it.
            span = self.recent[-1] - self.recent[0]
            left = self.total - self.done
            if not left:
                eta = "0s"
            elif len(self.recent) > 1 and span > 0:
                eta = duration(span / (len(self.recent) - 1) * left)
            else:
                eta = "?"
            print(f"graded {self.done}/{self.total}" + (f" ({failed})" if failed else "")
                  + f"  elapsed {duration(now - self.started)}  ETA {eta}",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
