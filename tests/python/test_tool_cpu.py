"""The muse-decode tool on the CPU: its answers to bad flags (exit status 2
and one line that names the flag and the values it accepts, the same whether
the value is not a number or a number the flag refuses), values given as
--flag=value or --flag value, the CPU reference path (every op checked, the
JSON's "pass" covering each) and, on a machine without an NVIDIA driver, the
reason the GPU part did not run. Runs anywhere the tool is built:
MUSE_DECODE_TOOL names it, else the developer build next to the package
(build/muse-decode for PYTHONPATH=build/python), else the one on PATH."""

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


@pytest.mark.parametrize(
    "flag, value",
    [("--tp", "4"), ("--tile-n", "12"), ("--context", "7"), ("--requests", "x"), ("--layers", "0"),
     ("--calls", "1025"), ("--replays", "4"), ("--layer", "Sliding"), ("--tp", "")],
)
def test_a_value_joined_with_equals_is_read_as_the_next_argument(flag, value):
    """--flag=value and --flag value are the same option: the same refusal
    for a bad value (and, for a good one, the same deployment: below)."""
    joined = subprocess.run([tool(), f"{flag}={value}", "--cpu", "--json"], capture_output=True, text=True, timeout=120)
    apart = subprocess.run([tool(), flag, value, "--cpu", "--json"], capture_output=True, text=True, timeout=120)
    assert joined.returncode == apart.returncode, (joined.stderr, apart.stderr)
    assert joined.stderr == apart.stderr
    if joined.returncode == 2:
        assert joined.stderr.startswith(f"muse-decode: {flag} must be ")


def cpu_json(*flags):
    import json

    run = subprocess.run([tool(), "--cpu", "--json", *flags], capture_output=True, text=True, timeout=120)
    assert run.returncode in (0, 1), (run.returncode, run.stderr)
    return run.returncode, json.loads(run.stdout)


def test_joined_values_choose_the_deployment():
    _, joined = cpu_json("--tp=2", "--context=4096", "--requests=3", "--layer=full", "--tile-n=64")
    _, apart = cpu_json("--tp", "2", "--context", "4096", "--requests", "3", "--layer", "full", "--tile-n", "64")
    for key, want in [("tp", 2), ("context", 4096), ("requests", 3), ("layer", "full")]:
        assert joined[key] == want and apart[key] == want, (key, joined[key], apart[key])


@pytest.mark.parametrize("flag", ["--cpu", "--json", "--quiet", "--help"])
def test_an_option_without_a_value_refuses_one(flag):
    assert usage_error(f"{flag}=1") == f"muse-decode: {flag} takes no value, got '{flag}=1'"


def test_the_cpu_path_checks_every_op_and_pass_covers_them():
    """Without a GPU (here: --cpu) the tool checks each op's CPU reference,
    o_proj's included, against the formula; "pass" is every check passing,
    and the exit status says the same."""
    status, report = cpu_json()
    ops = [r["op"] for r in report["cpu"]]
    assert ops == ["qkv_front", "attn2", "o_proj", "route"], ops
    assert all(r["check"] == "pass" for r in report["cpu"]), report["cpu"]
    assert report["pass"] is True and status == 0
    o_proj = report["cpu"][ops.index("o_proj")]
    assert "against the formula in double" in o_proj["detail"], o_proj
    assert report["gpu"] == [] and report["gpu_skipped"] == "--cpu was given"


def libcuda_loads():
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_without_a_driver_the_tool_says_no_driver_was_found():
    """A machine with no NVIDIA driver at all (libcuda.so.1 does not load):
    the reason the GPU part did not run names the missing driver, not a
    driver that is too old."""
    import json

    if libcuda_loads():
        pytest.skip("this machine has an NVIDIA driver (libcuda.so.1 loads)")
    report = json.loads(subprocess.run([tool(), "--json"], capture_output=True, text=True, timeout=120).stdout)
    if report["device"].endswith("(this build has no CUDA kernels)"):
        pytest.skip("this build of the tool has no CUDA kernels, so it never looks for a driver")
    assert report["device"] == ("no CUDA device (no NVIDIA driver found: the CUDA runtime could not load "
                                "libcuda.so.1)"), report["device"]
    assert report["gpu_skipped"].endswith(report["device"]), report["gpu_skipped"]
    table = subprocess.run([tool()], capture_output=True, text=True, timeout=120).stdout
    assert table.splitlines()[-1] == f"GPU part not run: {report['gpu_skipped']}", table
