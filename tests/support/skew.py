"""A host whose wall clock is off by a fixed amount: an LD_PRELOAD shim, compiled here.

It shifts ``clock_gettime(CLOCK_REALTIME[_COARSE])``, ``gettimeofday`` and ``time`` by
``PHALANX_TEST_SKEW`` seconds (or those in the file ``PHALANX_TEST_SKEW_FILE``, read at
every call: a clock that steps while the process runs) and leaves every other clock alone: CLOCK_MONOTONIC (which
Python's timed waits and phalanx's deadlines use) runs true, as on a real host whose NTP is
wrong. (libfaketime shifts the monotonic clock too, which breaks Python's timed waits.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long skew(void) {
    const char *path = getenv("PHALANX_TEST_SKEW_FILE");
    if (path) {  /* read at every call: a test steps the clock by rewriting the file */
        long seconds = 0;
        FILE *file = fopen(path, "r");
        if (file) {
            if (fscanf(file, "%ld", &seconds) != 1) seconds = 0;
            fclose(file);
        }
        return seconds;
    }
    const char *text = getenv("PHALANX_TEST_SKEW");
    return text ? atol(text) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && ts && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        ts->tv_sec += skew();
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *);
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int rc = real(tv, tz);
    if (rc == 0 && tv) tv->tv_sec += skew();
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


def skewed_env(directory: Path, seconds: int) -> dict[str, str]:
    """The environment that runs a process (and its children) ``seconds`` ahead of this
    host's wall clock. Fails (never skips) without a C compiler: the fault is the point."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler (cc) is needed to skew a host's clock: apt-get install gcc")
    directory.mkdir(parents=True, exist_ok=True)
    source, library = directory / "skew.c", directory / "libskew.so"
    source.write_text(_SHIM)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(library), str(source), "-ldl"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return {"LD_PRELOAD": str(library), "PHALANX_TEST_SKEW": str(seconds)}


def stepping_env(directory: Path, skew_file: Path) -> dict[str, str]:
    """As ``skewed_env``, by the seconds written in ``skew_file`` (read at every clock call):
    rewriting the file steps the wall clock of the running process, as NTP or a person
    setting the date does. The file starts at 0."""
    skew_file.write_text("0\n")
    env = skewed_env(directory, 0)
    env["PHALANX_TEST_SKEW_FILE"] = str(skew_file)
    return env
