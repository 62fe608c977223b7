"""The boundary between the trusted grader and untrusted student code (see docs/DESIGN.md, "The trust line")."""

from grader.sandbox.host import (Limits, SandboxError, Worker, WorkerDied, WorkerTimeout,
                                 Zygote, make_scratch)

__all__ = ["Limits", "SandboxError", "Worker", "WorkerDied", "WorkerTimeout", "Zygote",
           "make_scratch"]
