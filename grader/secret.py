"""The course secret: what makes hidden-test inputs this course's own.

Hidden suites draw their inputs from a generator seeded per test. Seeded from the test's
name alone, the inputs would be the same in every course that uses the kit, forever: once
leaked (a past term's student, a public repository), a table of outputs looked up by input
would score everywhere. Seeded from the test's name *and* this secret, they are the same for
every grading within a course (regrades are reproducible) and unknown elsewhere, so a table
leaked from another course scores nothing. Public inputs stay fixed in a student's own check
(it agrees with the docs); a graded run draws them from the secret and the files handed in
(``graded_public_seed``), since public tests show the student's messages (issue #44).

The secret is created once, at random, in the course folder (``.grader-secret``, 0600,
git-ignored by default); the Gradescope bundle carries it, a student release never does.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
from pathlib import Path

from grader.errors import UsageError

SECRET_FILE = ".grader-secret"
SECRET_BYTES = 32


def secret_path(course: str | Path) -> Path:
    """The secret's file in the course folder ``course``."""
    return Path(course) / SECRET_FILE


def course_secret(course: str | Path) -> bytes:
    """The course's secret, created (atomically, at most once) if there is none yet."""
    path = secret_path(course)
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = _create(path)
    try:
        value = bytes.fromhex(text)
    except ValueError:
        value = b""
    if len(value) < 16:
        raise UsageError(f"{path}: not a course secret (64 hex digits); delete it to have a "
                         "new one made (hidden inputs then change)")
    return value


def _create(path: Path) -> str:
    """A new secret, published whole: written to a private file beside ``path``, then
    linked to it (which fails if it exists), so that a process reading ``path`` never sees
    it half-written. If another process published one first, that one is used."""
    text = secrets.token_hex(SECRET_BYTES)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:      # another process published one first: use theirs
            return path.read_text(encoding="ascii").strip()
        except OSError:              # a file system without hard links: create it in place
            return _create_in_place(path, text)
    finally:
        os.unlink(tmp)
    return text


def _create_in_place(path: Path, text: str) -> str:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:          # another process made it first: use theirs
        return path.read_text(encoding="ascii").strip()
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(text + "\n")
    return text


def hidden_seed(secret: bytes, test_id: str) -> int:
    """The generator seed of hidden test ``test_id`` (a pytest node id) in this course."""
    digest = hashlib.sha256(secret + b"\0" + test_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def secret_digest(secret: bytes) -> str:
    """A name for the secret that gives nothing of it away (batch fingerprints)."""
    return hashlib.sha256(b"attention-labs course secret\0" + secret).hexdigest()


def training_start_seed(secret: bytes, lab: str, source: bytes) -> int:
    """The seed of the initial weights the grader gives a training (lab 8): from the course
    secret and the lab file's bytes, so unknown before grading (and elsewhere), different
    for every file handed in, and the same at a regrade. Without a secret (a student's own
    check) it still differs per file, and proves nothing: local checks vouch for nothing."""
    digest = hashlib.sha256(source).hexdigest()
    return hidden_seed(secret, f"{lab}:training start:{digest}")


def submission_digest(files: dict[str, bytes]) -> str:
    """A name for a submission's lab files (file name -> bytes), order aside."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode("utf-8") + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def graded_public_seed(secret: bytes, test_id: str, submission: str) -> int:
    """The generator seed of public test ``test_id`` in a graded run of the submission whose
    ``submission_digest`` is ``submission``: from the course secret and every lab file
    handed in (a lab's worker can read them all), so each graded run of other files draws
    its own inputs and a table of inputs and answers leaked from one run (its feedback
    shows the student's messages) matches nothing in the next; a regrade of the same files
    draws the same. A student's own check keeps the kit's fixed inputs."""
    return hidden_seed(secret, f"{test_id}:graded public inputs:{submission}")
