"""``python -m bench.targets``: ours, plain torchax and the Flax port compiled for an accelerator that is not attached.

Every system is compiled the same way, by the target's own XLA compiler on
its compile-only devices (`cogvideox_torchax.platforms.accelerators`), in bf16::

    python -m bench.targets --target h200 --shape 1,16,13,60,90 --shape 1,16,21,96,170
    python -m bench.targets --target v6e-8 --mesh dp=1,tp=8 --shape 1,16,21,96,170
    python -m bench.targets --target h200 --shape 1,16,21,90,160 --systems ours,torchax,tiled   # Wan 2.1, 720p x 81

Each shape is decoded by the model its latent channels and size name
(``--model`` overrides; `MODELS`: CogVideoX-2b for 13 latent frames at
60x90, 1.5 for 21 at 96x170, Wan 2.1 for 21 at 60x104 and 90x160).
Systems: ``ours`` (the library's plan for the target), ``torchax`` (the
same upstream module in the same one jit with every switch off: torchax's
own lowering, upstream's loops unrolled), ``tiled`` (as ``torchax``, after
upstream's ``enable_tiling()`` with its defaults) and ``flax`` (the Flax NNX
port, CogVideoX's only: a Wan row says so and compiles nothing). Every
(system, target, shape) compiles in a fresh process with JAX's persistent
cache off, the model built before the clock starts, so the times are first
compiles (``--timeout`` stops one). Printed per row: per-device temp /
argument / output bytes (or the bytes a TPU compile refused for), the
seconds to build what is traced (ours and torchax: wrapping the loaded VAE
and patching its copy for the target; the port: its abstract model; not
part of the first compile), trace+lower and compile seconds, the 1-minute
load average before and after, convolutions by layout and result dtype,
the largest convolution operand or result of the lowered program (in
elements; 2^31 is cuDNN's limit), the activations (at least 2^20 elements)
moved to another layout (transposes, relayouting copies) or copied as they
are, as steps of their own, and the collectives (tp > 1). Nothing runs:
these are the compiled program's facts, not times on a device.

``--hlo-dir DIR`` keeps each optimized HLO text for reading.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SYSTEMS = ("ours", "torchax", "tiled", "flax")
# Systems that trace the upstream module through our one jit.
_TORCHAX = ("ours", "torchax", "tiled")
# The model a headline shape belongs to: (T, H, W) of the latents -> preset.
MODELS = {
    (13, 60, 90): "random:cogvideox-2b",  # 49 frames at 480x720
    (21, 96, 170): "random:cogvideox-1.5",  # 81 frames at 768x1360
    (21, 60, 104): "random:wan2.1",  # 81 frames at 480x832
    (21, 90, 160): "random:wan2.1",  # 81 frames at 720x1280
}
FLAX_ONLY = "the Flax port is CogVideoX's only (no port of Wan's VAE): not run"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.splitlines()[0])
    p.add_argument("--target", action="append", help="a name of cogvideox_torchax.platforms.accelerators.TARGETS (repeatable)")
    p.add_argument("--mesh", default=None, help="dp=D,tp=T over the target's devices (default: all on tp)")
    p.add_argument("--shape", action="append", help="latents B,C,T,H,W (repeatable; default 1,16,13,60,90)")
    p.add_argument("--model", default=None, help="random:PRESET or a local diffusers VAE folder (default: by shape)")
    p.add_argument("--systems", default="ours,flax", help="comma-separated: ours, torchax, tiled, flax")
    p.add_argument("--timeout", type=float, default=None, help="seconds one compile may take (default: no limit)")
    p.add_argument("--hlo-dir", default=None, help="write each optimized HLO text here")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--option", action="append", default=[], metavar="NAME=BOOL",
                   help="a RuntimeOptions switch for ours, e.g. wan_tail_chunks=true (repeatable)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: compile one system in this process
    return p


def _model_for(shape: tuple[int, ...], model: str | None) -> str:
    if model is not None:
        return model
    return MODELS.get(tuple(shape[2:]), "random:cogvideox-2b")


def _compile_one(system: str, target: str, mesh: str | None, model: str, shape: tuple[int, ...],
                 option: list[str] = ()) -> dict[str, Any]:
    import jax

    import cogvideox_torchax as ct
    from bench.inputs import load_upstream
    from cogvideox_torchax.memory import budget
    from cogvideox_torchax.platforms import accelerators, hlo

    jax.config.update("jax_enable_compilation_cache", False)
    acc = accelerators.get(target)
    on = accelerators.target_mesh(acc.name, mesh)
    upstream = load_upstream(model, seed=0)
    row: dict[str, Any] = {
        "system": system, "target": acc.name, "mesh": dict(on.shape), "model": model, "shape": list(shape),
        "dtype": "bfloat16",
    }
    if option and system == "ours":
        row["options"] = list(option)
    from cogvideox_torchax import families

    if system == "flax" and families.of_module(upstream).name != "cogvideox":
        row["skipped"] = FLAX_ONLY
        return row
    # Each process imports only its own system: flax's import alone slows
    # a later lowering by garbage collection (ours: 0.17 -> 0.41 s).
    if system in _TORCHAX:
        from cogvideox_torchax.vae.program_cache import ProgramKey
    else:
        from bench import flax_vae

    # Building what is traced (ours and plain torchax: the wrapped VAE and
    # the target's patched copy of the module; the port: its abstract
    # model) is timed apart, imports done before: the first compile is
    # trace + lower + compile.
    row["load_1min"] = [round(os.getloadavg()[0], 2)]
    t_build = time.perf_counter()
    if system in _TORCHAX:
        vae = ct.wrap(upstream, mesh="dp=1,tp=1", options=_options(system, option))
        if system == "tiled":
            vae.enable_tiling()  # upstream's defaults
            row["tiling"] = {k: v for k, v in vars(vae.module).items() if k.startswith("tile_")}
        key = ProgramKey.for_target(acc.name, (on.shape["dp"], on.shape["tp"]))
        vae.programs.program(key)
        row["build_s"] = round(time.perf_counter() - t_build, 2)
        row["plan"] = vae.programs.program(key).plan.as_dict()  # the target mesh's plan
        t0 = time.perf_counter()
        lowered = vae.lower_decode(shape, target=acc.name, mesh=key.mesh)
        options = vae.programs.compiler_options(key)  # the library's own for the target
    else:
        port = flax_vae.abstract(upstream.config, dtype="bfloat16", mesh=on)
        row["build_s"] = round(time.perf_counter() - t_build, 2)
        t0 = time.perf_counter()
        lowered = port.lower(shape)
        options = _port_compiler_options(acc)
    t1 = time.perf_counter()
    row["trace_lower_s"] = round(t1 - t0, 2)
    # The lowered program's shapes are global ones (one device's, for a one-device target).
    row["largest_conv_elements"] = max((c.max_elements for c in hlo.convolutions(lowered.as_text())), default=0)
    try:
        compiled = lowered.compile(compiler_options=options)
    except Exception as e:  # a TPU compile refused for memory says how much it needed
        needed = budget.refused_bytes(e)
        if needed is None:
            raise
        row.update(compile_s=round(time.perf_counter() - t1, 2), refused_bytes=needed, error=str(e).splitlines()[0])
        row["load_1min"].append(round(os.getloadavg()[0], 2))
        return row
    row["compile_s"] = round(time.perf_counter() - t1, 2)
    row["load_1min"].append(round(os.getloadavg()[0], 2))
    m = compiled.memory_analysis()
    row["per_device_bytes"] = {"temp": int(m.temp_size_in_bytes), "arguments": int(m.argument_size_in_bytes),
                               "outputs": int(m.output_size_in_bytes)}
    text = compiled.as_text()
    row["compiled"] = hlo.compiled_summary(text)
    row["_hlo"] = text
    return row


def _options(system: str, option: list[str] = ()):
    """Ours: the library's defaults and the ``--option`` switches; plain torchax: every switch off."""
    import cogvideox_torchax as ct
    from bench import inputs

    if system == "ours":
        return inputs.options(argparse.Namespace(dtype="bfloat16", option=list(option)))
    return ct.RuntimeOptions(dtype="bfloat16", **{name: False for name in ct.RuntimeOptions.switches()})


def _port_compiler_options(acc) -> dict[str, Any] | None:
    """The port's compile takes the library's compiler configuration for the target, not our patches' options.

    That is the platform's own options (`PlatformProfile.compiler_options`,
    XLA:GPU's scheduler as jax 0.10.2 set it) and the target's (a TPU's HBM
    limit, `budget.compiler_options`).
    """
    from cogvideox_torchax.memory import budget
    from cogvideox_torchax.platforms.profiles import profile

    options = {**profile(acc.platform).compiler_options, **(budget.compiler_options(acc) or {})}
    return options or None


def _run_child(system: str, target: str, args: argparse.Namespace, shape: tuple[int, ...]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.targets", "--one", system, "--target", target,
           "--shape", ",".join(map(str, shape))]
    if args.mesh:
        cmd += ["--mesh", args.mesh]
    if args.model:
        cmd += ["--model", args.model]
    if args.hlo_dir:
        cmd += ["--hlo-dir", args.hlo_dir]
    for item in args.option:
        cmd += ["--option", item]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"system": system, "target": target, "shape": list(shape),
                "error": f"not finished in {args.timeout:.0f} s (trace, lower and compile; stopped)"}
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"system": system, "target": target, "shape": list(shape), "error": _error_line(done.stderr)}
    return json.loads(lines[-1])


def _error_line(stderr: str) -> str:
    """The exception a child died of: the last ``SomethingError: ...`` line, else the last line (JAX's traceback
    note comes after the exception)."""
    lines = stderr.strip().splitlines() or ["(no output)"]
    raised = [x for x in lines if re.match(r"^[\w.]+(Error|Exception)\b", x)]
    return (raised or lines)[-1]


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**30:.2f}"


def _s(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.2f}"


def _load(r: dict[str, Any]) -> str:
    return " -> ".join(f"{v:.2f}" for v in r.get("load_1min") or [])


def _row_line(r: dict[str, Any]) -> str:
    mesh = r.get("mesh") or {}
    where = f"{r['target']} dp={mesh.get('dp', '?')},tp={mesh.get('tp', '?')}"
    shape = "(" + ",".join(map(str, r["shape"])) + ")"
    start = f"| {r['system']} | {where} | {shape} | {_s(r.get('build_s'))} | {_s(r.get('trace_lower_s'))} "
    if "per_device_bytes" not in r:
        if "skipped" in r:
            need = r["skipped"]
        elif "refused_bytes" in r:
            need = f"refused: needs {r['refused_bytes'] / 2**30:.2f} GiB"
        else:
            need = f"error: {r['error']}"
        return start + f"| {_s(r.get('compile_s'))} | {_load(r)} | {need} | | | | | | | | | |"
    b, c = r["per_device_bytes"], r["compiled"]
    layouts = ", ".join(f"{k}: {v}" for k, v in sorted(c["conv_layouts"].items(), key=lambda kv: -kv[1]))
    dtypes = ", ".join(f"{k}: {v}" for k, v in c["conv_output_dtypes"].items())
    collectives = ", ".join(f"{k}: {v}" for k, v in c["collectives"].items()) or "-"
    largest = r.get("largest_conv_elements")
    return (start + f"| {_s(r['compile_s'])} | {_load(r)} | {_gib(b['temp'])} | {_gib(b['arguments'])} "
            f"| {_gib(b['outputs'])} | {c['convolutions']} ({layouts}) -> {dtypes} "
            f"| {'' if largest is None else f'{largest / 2**31:.3f}'} "
            f"| {c['activation_layout_changes']} ({c['layout_changes']}) | {c['activation_copies']} ({c['copies']}) "
            f"| {collectives} | {_count(c.get('convolution_calls'))} | {_count(c.get('movement_bytes'), 2**30)} |")


def _count(n: int | None, unit: int = 1) -> str:
    """A count read from the program, or "?" where one of its loops has no known trip count."""
    return "?" if n is None else (str(n) if unit == 1 else f"{n / unit:.2f}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(",")) for s in (args.shape or ["1,16,13,60,90"])]
    if any(len(s) != 5 for s in shapes):
        raise SystemExit("error: --shape takes B,C,T,H,W")
    targets_ = args.target or ["h200"]
    from cogvideox_torchax.platforms import accelerators

    for name in targets_:
        try:
            accelerators.get(name)
        except ValueError as e:
            raise SystemExit(f"error: --target: {e}") from None
    if args.one:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        row = _compile_one(args.one, targets_[0], args.mesh, _model_for(shapes[0], args.model), shapes[0], args.option)
        text = row.pop("_hlo", None)
        if args.hlo_dir and text is not None:
            name = f"{row['system']}-{row['target']}-tp{row['mesh']['tp']}-{'x'.join(map(str, shapes[0]))}.hlo.txt"
            Path(args.hlo_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.hlo_dir) / name).write_text(text)
        print(json.dumps(row))
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or any(s not in SYSTEMS for s in systems):
        raise SystemExit(f"error: --systems takes any of {', '.join(SYSTEMS)}")
    import jax

    print(f"# python -m bench.targets {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"# jax {jax.__version__}, compiled on a host of {os.cpu_count()} CPUs for compile-only devices; "
          "bf16; per-device bytes; nothing run")
    if not args.json:
        print("| system | target, mesh | latents | build s | trace+lower s | compile s | load (1 min) | temp GiB "
              "| args GiB | out GiB | convolutions (layouts) -> result dtypes | largest conv (x 2^31 elements) "
              "| activations moved to another layout (all moves) | activations copied (all copies) | collectives "
              "| convolution calls per decode | GiB padded, joined, cut and copied per decode |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    for target in targets_:
        for shape in shapes:
            for system in systems:
                row = _run_child(system, target, args, shape)
                failed |= "error" in row and "refused_bytes" not in row
                print(json.dumps(row) if args.json else _row_line(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
