"""The boundary between the trusted grader and untrusted student code (see DESIGN.md)."""

from grader.sandbox.host import (Limits, SandboxError, Worker, WorkerDied, WorkerTimeout,
                                 Zygote, make_scratch)

__all__ = ["Limits", "SandboxError", "Worker", "WorkerDied", "WorkerTimeout", "Zygote",
           "make_scratch"]
