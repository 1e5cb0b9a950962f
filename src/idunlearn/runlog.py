"""Send a stage's output (prints, warnings, progress bars) to its log file."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from pathlib import Path


@contextlib.contextmanager
def stage_log(path: str | Path | None, stage: str):
    """Redirect stdout/stderr and the logging module to ``path`` for the duration of a stage."""
    if path is None:
        yield logging.getLogger(stage)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", buffering=1) as handle, contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
        handler = logging.StreamHandler(handle)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        log = logging.getLogger(stage)
        start = time.perf_counter()
        log.info("stage %s started", stage)
        try:
            yield log
        except BaseException:
            log.exception("stage %s failed", stage)
            raise
        else:
            log.info("stage %s finished in %.1f s", stage, time.perf_counter() - start)
        finally:
            root.removeHandler(handler)
            sys.stderr.flush()


def logs_duration(part: str):
    """Decorator: log how long each call of one part of a stage took (wall seconds) to the stage's log, so that a
    stage's cost splits into its parts without a profiler (e.g. the audit's probes)."""
    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            result = function(*args, **kwargs)
            logging.getLogger("idunlearn").info("%s took %.1f s", part, time.perf_counter() - start)
            return result
        return wrapper
    return decorate
