"""How the suite's processes compile and thread, and the machine code users run checked against upstream.

The rest of the suite compiles XLA:CPU programs with LLVM at -O0
(`tests/support/cpu_codegen.py`): the same programs, other machine code.
Here a tiny fp32 decode of every family and encode of two against
upstream, and a streamed decode's exact equality with the whole one, run
again in a pytest process of their own, compiled as a user's process is.
"""

import os
import pathlib
import subprocess
import sys

from tests.support import cpu_codegen, workers

ROOT = pathlib.Path(__file__).resolve().parents[1]

# One multi-frame case of each (a first batch and a scan, where the family scans): tiny programs
# compiled at XLA's default take the time here. A node id that no longer exists fails the run.
AT_DEFAULT = (
    "tests/families/cogvideox/test_decode.py::test_tiny_fp32[shape6]",  # (1, 4, 13, 2, 2)
    "tests/families/cogvideox/test_encode.py::test_tiny_fp32[shape3]",  # (1, 3, 13, 16, 16)
    "tests/families/wan/test_decode.py::test_wan_tiny_fp32[shape3]",  # (1, 16, 13, 2, 3)
    "tests/families/wan/test_encode.py::test_wan_tiny_posterior[shape3]",  # (1, 3, 13, 8, 16)
    "tests/families/ltx2/test_decode.py::test_ltx2_tiny_fp32[shape2]",  # (1, 8, 5, 5, 2)
    "tests/families/cogvideox/test_stream.py::test_streamed_frames_and_video_equal_the_whole_decode_exactly[1]",
)


def test_the_suite_compiles_xla_cpu_code_at_o0_unless_told():
    # This run's processes: -O0, unless the run chose its level (XLA_FLAGS, or KEEP_DEFAULT).
    flags = os.environ.get("XLA_FLAGS", "")
    chose = os.environ.get(cpu_codegen.KEEP_DEFAULT) == "1" or "--xla_backend_optimization_level" in flags
    assert cpu_codegen.FLAG in flags.split() or chose
    added = cpu_codegen.fast_cpu_flags({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert added.split() == ["--xla_force_host_platform_device_count=8", cpu_codegen.FLAG]
    assert cpu_codegen.fast_cpu_flags({"XLA_FLAGS": "--xla_backend_optimization_level=2"}) is None
    assert cpu_codegen.fast_cpu_flags({cpu_codegen.KEEP_DEFAULT: "1"}) is None
    child = cpu_codegen.default_codegen_env()
    assert cpu_codegen.FLAG not in child["XLA_FLAGS"] and child[cpu_codegen.KEEP_DEFAULT] == "1"


def test_tiny_parity_and_exactness_hold_with_xla_default_machine_code():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *AT_DEFAULT],
        cwd=ROOT,
        env=dict(cpu_codegen.default_codegen_env(), JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(proc.stdout[-20000:], proc.stderr[-5000:])
    assert proc.returncode == 0, f"the default-codegen run failed (exit {proc.returncode}); its output is above"
    last = proc.stdout.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last and "deselected" not in last


def test_each_worker_s_torch_gets_its_share_of_the_cores():
    # The other half of what the suite's processes run under (tests/support/workers.py).
    assert [workers.torch_threads(n, cores=2) for n in (0, 1, 2, 4)] == [2, 2, 1, 1]
    assert workers.torch_threads(2, cores=8) == 4
