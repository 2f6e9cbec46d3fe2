"""Fixtures shared across folders: the tiny and real-size upstream VAEs, wrapped ones, cached 2b references."""

import os
import sys

import pytest
import torch

import cogvideox_torchax as ct
from tests.support import cpu_codegen, workers
from tests.support.reference import seeded_latents, upstream_decode

# The heavy tier: each test below takes 15 s to 12 min of this 2-core CPU and
# repeats, at length or in more processes, a promise a default test already
# checks at small size. `python -m pytest` leaves them out (each stack's run
# then takes the time docs/testing.md states); `python -m pytest -m heavy` runs
# them (about 30 minutes). Node ids, parametrized ones by their prefix.
HEAVY = (
    # Length: 1,000 latent frames in the host memory of 10 (test_streamed's
    # streamed-writer tests and the 17-frame checks run by default).
    "tests/families/wan/test_streamed_command.py::test_a_thousand_wan_latent_frames",
    "tests/contracts/test_streamed.py::test_a_thousand_latent_frames",
    "tests/families/cogvideox/test_stream.py::test_live_device_memory_is_the_same_at_10_and_1000",
    "tests/families/cogvideox/test_decode.py::test_chained_batches_cost_a_few_decoder_calls_not_eight",
    # Many processes: the benchmark suite's every step, each system in its own process.
    "tests/test_bench_suite.py::test_quick_suite_writes_the_json_and_the_draft_with_every_step",
    "tests/test_bench.py::test_bench_sweep_plot_and_warm_start",
    "tests/test_bench.py::test_isolate_runs_each_system_in_a_process_of_its_own",
    "tests/test_bench.py::test_compile_time_scans_another_familys_frames",
    "tests/test_bench.py::test_targets_bench_compiles_ours_and_the_flax_port_for_a_gpu",
    "tests/test_bench.py::test_bench_compile_only_runs_nothing",
    "tests/test_bench.py::test_bench_decodes_another_family_without_the_flax_port",
    "tests/test_bench.py::test_bench_measures_all_three_systems_alike",
    # A full or closed stream: the JSON summary's and a closed stderr's cases by default.
    "tests/contracts/test_streams.py::test_a_full_stdout_after_the_outputs_are_written_is_exit_5_in_one_line[summary",
    "tests/contracts/test_streams.py::test_a_decode_succeeds_with_stderr_closed_or_full[full",
    # Signals at random moments: the single-file run by default, the streamed and many-latents kinds here.
    "tests/contracts/test_signals.py::test_a_signal_at_any_moment_ends_with_its_code_and_one_line[streamed",
    "tests/contracts/test_signals.py::test_a_signal_at_any_moment_ends_with_its_code_and_one_line[many",
    # Two processes under jax.distributed: the library's and Wan's command line by default.
    "tests/parallel/test_distributed.py::test_two_processes_decode_wan_as_one_process",
    "tests/parallel/test_distributed.py::test_two_process_cli_many_latents",
    "tests/parallel/test_distributed.py::test_two_process_cli_one_video_over_all_devices",
    "tests/parallel/test_distributed.py::test_two_process_cli_encode",
    # Compiled for devices not attached: the larger programs (their invariants are checked at smaller sizes).
    "tests/platforms/test_targets.py::test_tpu_program_over_two_chips_shards_width",
    "tests/platforms/test_targets.py::test_h200_program_at_1080p_keeps_its_invariants",
    "tests/platforms/test_newest_targets.py::test_v7x_counts_two_tensorcores_per_chip_and_compiles_over_one_chip",
    "tests/platforms/test_accelerator_programs.py::test_cuda_program_has_no_convolution_of_2_31_elements[41",
    # The real 2b config at more frames, the port's and fp16 encode's accuracy (smaller cases run by default).
    "tests/families/cogvideox/test_decode.py::test_cogvideox_2b_fp32[5",
    "tests/test_flax_port.py::test_2b_matches_upstream[2",
    "tests/test_flax_port.py::test_2b_matches_upstream[3",
    "tests/families/cogvideox/test_encode.py::test_tiny_fp16_encode_psnr_level_with_torch",
    # LTX-Video's released configs at their real widths (its architectures run by default at test widths).
    "tests/families/ltx2/test_ltx_video.py::test_the_released_configs_fp32",
    # 8 simulated devices (tests/test_multidevice.py's child): the planner moving to tp; streams but fp32 dp=2,tp=2.
    "tests/multidevice/test_planner_tp.py::test_planner_moves_to_more_devices_on_tp_when_tiles_do_not_fit",
    "tests/multidevice/test_stream.py::test_streamed_frames_equal_the_whole_decode_on_every_mesh[bfloat16",
    "tests/multidevice/test_stream.py::test_streamed_frames_equal_the_whole_decode_on_every_mesh[float32-dp=2,tp=1",
    "tests/multidevice/test_stream.py::test_streamed_frames_equal_the_whole_decode_on_every_mesh[float32-dp=1,tp=2",
)


# The stack tier: the tests whose outcome can depend on the installed stack
# (Python, jax and its compilers, torch, diffusers, transformers), not on our
# code alone. CI runs them on the oldest supported stack (`python -m pytest -m
# stack`), and the whole default tier on the newest, where drift shows first
# (docs/testing.md#the-two-stacks). Node ids, parametrized ones by their prefix.
STACK = (
    # Every family's decode and encode against upstream at tiny sizes (fp32, and bf16/fp16 by PSNR).
    "tests/families/cogvideox/test_decode.py::test_tiny",
    "tests/families/cogvideox/test_encode.py::test_tiny_fp32",
    "tests/families/wan/test_decode.py::test_wan_tiny",
    "tests/families/wan/test_decode.py::test_wan22_tiny",
    "tests/families/wan/test_encode.py",
    "tests/families/ltx2/test_decode.py::test_ltx2_tiny",
    "tests/families/ltx2/test_decode.py::test_a_timestep_conditioned",
    "tests/families/ltx2/test_encode.py",
    "tests/families/hunyuan/test_decode.py::test_decode_is_upstreams_default_path",
    "tests/families/hunyuan/test_encode.py::test_posterior_is_upstreams",
    "tests/families/hunyuan/test_hunyuan15.py::test_decode_is_upstreams_whole_decode",
    # LTX-Video's noise: torch's generator and its function modes, as the stack's torch has them.
    "tests/families/ltx2/test_ltx_video.py::test_decode_with_noise",
    "tests/families/ltx2/test_ltx_video.py::test_encode",
    # What upstream refuses (torch's own checks, on the meta device), refused alike.
    "tests/vae/test_as_upstream.py",
    # The torch shims, torch after wrapping, and the code users run at XLA's default machine code.
    "tests/test_torch_compat.py",
    "tests/test_torchax_device.py",
    "tests/test_suite_processes.py",
    # The README's commands, from the root and elsewhere, beside whatever the stack installs.
    "tests/test_readme.py",
    "tests/test_no_shadowing.py",
    # The compiled accelerator programs (the GPU and TPU compilers the stack pins).
    "tests/platforms/test_targets.py",
    "tests/platforms/test_accelerator_programs.py",
    "tests/platforms/test_wan_programs.py::test_h200",
    "tests/platforms/test_wan_programs.py::test_lowered",
    "tests/platforms/test_newest_targets.py::test_b200",
    # The command lines' exit contract, and pipelines' latents decoded with no flags.
    "tests/contracts/test_safety.py",
    "tests/families/wan/test_commands.py::test_pipeline_latents_decode_with_no_flags",
    "tests/families/ltx2/test_commands.py::test_pipeline_latents_decode_with_no_flags",
    "tests/families/hunyuan/test_commands.py::test_pipeline_latents_decode_with_no_flags",
)


# Run alone under pytest-xdist (tests/support/workers.py): each judges a time
# it measured against another it measured, so another worker's test beside
# it on a 2-core machine could make it fail. Node ids by prefix. Tests that
# only wait (processes joining a cluster, signals at random moments, threads
# at a barrier) run beside others: their timeouts are minutes, their checks
# exit codes and bytes.
SERIAL = (
    # A writer racing a stand-in device's schedule, timed against its own time.
    "tests/io/test_streamed_writer.py",
    # The stand-in bench's met / not met, decided on measured times.
    "tests/test_bench_suite.py",
)


# Started first (in this order), so that no test of a minute or more begins
# near the end of a run while the other worker has nothing left: over
# pytest-xdist's worksteal, the worker that finishes first takes half of what
# the other has not begun. The files whose tests took longest on 2 cores.
LONGEST_FIRST = (
    "tests/test_multidevice.py",
    "tests/families/wan/test_tiling.py",
    "tests/test_suite_processes.py",
    "tests/contracts/test_streamed.py",
    "tests/memory/test_budget.py",
    "tests/families/ltx2/test_decode.py",
    "tests/families/wan/test_decode.py",
    "tests/families/wan/test_accelerator_patches.py",
)


def _started_first(item) -> int:
    path = item.nodeid.split("::")[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_started_first)  # stable: every other test keeps its place
    for item in items:
        if item.nodeid.startswith(HEAVY):
            item.add_marker(pytest.mark.heavy)
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        if item.nodeid.startswith(STACK) and not item.nodeid.startswith(HEAVY):  # heavy stays in its own tier
            item.add_marker(pytest.mark.stack)


def pytest_xdist_auto_num_workers(config):
    return workers.auto_workers()


def _share_the_compile_cache():
    # Every process of the run (each worker, and the 8-device child) compiles
    # into and loads from one JAX cache. A test that turns the cache off or
    # points it elsewhere (the commands' --no-compile-cache, run in-process)
    # leaves it so: it is set again before the next test.
    from cogvideox_torchax.vae import compile_cache

    compile_cache.enable_compile_cache(workers.compile_cache_dir())


def pytest_configure(config):
    cpu_codegen.apply_fast_cpu_codegen()  # before any backend starts; the processes tests start inherit it
    if not hasattr(config, "workerinput"):  # the controller, before it starts the workers
        n = getattr(config.option, "numprocesses", None)
        workers.share_torch_threads(workers.auto_workers() if n in ("auto", "logical") else int(n or 0))
    workers.run_dir()  # made before xdist starts the workers, which inherit it
    _share_the_compile_cache()


def pytest_unconfigure(config):
    workers.remove_run_dir()  # by the process that made it, after every worker has ended


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if "jax" in sys.modules:
        _share_the_compile_cache()
    if not hasattr(item.config, "workerinput"):
        yield  # one process (-n 0, or a run a test starts itself): nothing runs beside it
        return
    with workers.machine_share(alone=item.get_closest_marker("serial") is not None):
        yield

# tests/multidevice needs 8 simulated devices, which must be set before JAX
# starts; tests/test_multidevice.py runs it in its own process with them.
collect_ignore = [] if "device_count=8" in os.environ.get("XLA_FLAGS", "") else ["multidevice"]


@pytest.fixture(scope="session")
def tiny_upstream():
    """diffusers' CogVideoX VAE test config with seeded random weights."""
    return ct.random_upstream("tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_vae(tiny_upstream):
    return ct.wrap(tiny_upstream, dtype="float32", mesh="dp=1,tp=1")


@pytest.fixture(scope="session")
def upstream_2b():
    """The real CogVideoX-2b VAE architecture with seeded random weights."""
    return ct.random_upstream("cogvideox-2b", seed=0)


@pytest.fixture(scope="session")
def reference_2b(upstream_2b):
    """``reference_2b(frames) -> (z, upstream fp32 decode)`` for latents (1,16,frames,8,8), seed = frames.

    Cached for the session: ours and the Flax port are both checked against
    the same upstream decodes, which take most of a 2b parity test's time.
    """
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        if frames not in cache:
            z = seeded_latents((1, 16, frames, 8, 8), seed=frames)
            cache[frames] = (z, upstream_decode(upstream_2b, z))
        return cache[frames]

    return get
