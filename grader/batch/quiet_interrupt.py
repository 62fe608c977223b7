"""Imported first by a batch's forkserver (its preload): Ctrl-C is ignored from here on.

A terminal's Ctrl-C reaches the whole process group. The forkserver imports torch before
multiprocessing makes it ignore SIGINT, so a Ctrl-C during that import would print a
traceback of its own; and the grading processes it forks inherit what it had before.
Importing this module first closes both gaps: the batch process alone handles Ctrl-C
(``grader.batch``), stopping its grading processes by pid.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
