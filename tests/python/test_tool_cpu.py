"""The muse-decode tool's answers to bad flags: exit status 2 and one line
that names the flag and the values it accepts, the same whether the value is
not a number or a number the flag refuses. The tool exits before it looks
for a GPU, so this runs anywhere the tool is built: MUSE_DECODE_TOOL names
it, else the developer build next to the package (build/muse-decode for
PYTHONPATH=build/python), else the one on PATH."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import muse_decode as md


def tool():
    candidates = [os.environ.get("MUSE_DECODE_TOOL"),
                  str(Path(md._C.__file__).resolve().parent.parent.parent / "muse-decode"),
                  shutil.which("muse-decode")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("the muse-decode tool is not built here (set MUSE_DECODE_TOOL to its path)")


def usage_error(*flags):
    run = subprocess.run([tool(), *flags], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, (flags, run.returncode, run.stdout, run.stderr)
    assert run.stdout == ""
    first, hint = run.stderr.splitlines()
    assert hint == "(see muse-decode --help)"
    return first


@pytest.mark.parametrize(
    "flag, accepted, values",
    [
        ("--tp", "one of 1, 2, 4, 8", ["abc", "3", "0", "16", "-8", "", "2.0", "99999999999999999999"]),
        ("--tile-n", "one of 8, 16, 32, 64, 128, 256", ["x", "12", "0", "512"]),
        ("--context", "an integer in [8, 262144]", ["x", "7", "262145", "1e3", "-1"]),
        ("--requests", "an integer in [1, 8]", ["x", "0", "9"]),
        ("--layers", "an integer in [1, 64]", ["x", "0", "65"]),
        ("--calls", "an integer in [1, 1024]", ["x", "0", "1025"]),
        ("--replays", "an integer in [5, 101]", ["x", "4", "102"]),
        ("--layer", "one of sliding, full", ["x", "Sliding", ""]),
    ],
)
def test_a_flag_says_what_it_accepts_whatever_the_value(flag, accepted, values):
    for v in values:
        assert usage_error(flag, v) == f"muse-decode: {flag} must be {accepted}, got '{v}'"
    assert usage_error(flag) == f"muse-decode: {flag} needs a value: {accepted}"


def test_an_unknown_option():
    assert usage_error("--bogus") == "muse-decode: unknown option '--bogus'"
