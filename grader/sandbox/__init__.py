"""The boundary between the trusted grader and untrusted student code (see docs/DESIGN.md, "The trust line").

Importing the package costs no torch: ``host`` (the zygote) is standard library only, so a
grader can launch its zygote before it imports torch itself. ``Worker`` and its errors
(``channel``, which needs torch for the wire) load when first named.
"""

from grader.sandbox.host import Limits, SandboxError, Zygote, make_scratch

_CHANNEL = ("Worker", "WorkerDied", "WorkerTimeout")

__all__ = ["Limits", "SandboxError", "Worker", "WorkerDied", "WorkerTimeout", "Zygote",
           "make_scratch"]


def __getattr__(name: str):
    if name in _CHANNEL:
        from grader.sandbox import channel
        return getattr(channel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
