"""The ``("dp", "tp")`` device mesh and where activations live on it.

Batch goes over ``dp`` and width over ``tp``. Time is never sharded: every
convolution is causal in time and carries a cache of past frames between frame
batches, so splitting time would serialise the devices. Height is
left whole so that one axis carries all the convolution halos.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("dp", "tp")

_MESH_RE = re.compile(r"^\s*(dp|tp)\s*=\s*(\d+)\s*$")


def parse_mesh_spec(spec: str) -> tuple[int, int]:
    """Parses ``"dp=2,tp=4"`` (either order; an omitted axis is 1).

    Returns:
        ``(dp, tp)``.

    Raises:
        ValueError: on anything else.
    """
    sizes: dict[str, int] = {}
    parts = [p for p in spec.split(",") if p.strip()]
    for part in parts:
        m = _MESH_RE.match(part)
        if not m:
            raise ValueError(f"mesh must look like 'dp=2,tp=4', got {spec!r}")
        axis, size = m.group(1), int(m.group(2))
        if axis in sizes:
            raise ValueError(f"mesh axis {axis!r} given twice in {spec!r}")
        if size < 1:
            raise ValueError(f"mesh axis {axis!r} must be >= 1 in {spec!r}")
        sizes[axis] = size
    if not sizes:
        raise ValueError(f"mesh must look like 'dp=2,tp=4', got {spec!r}")
    return sizes.get("dp", 1), sizes.get("tp", 1)


def make_mesh(
    mesh: Mesh | str | tuple[int, int] | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """Builds the ``("dp", "tp")`` mesh the decode runs on.

    Args:
        mesh: None for every device on ``tp`` (``dp=1``), or under
            `jax.distributed` one ``dp`` row per process with its devices on
            ``tp``; ``"dp=2,tp=4"``;
            a ``(dp, tp)`` pair; or a ready `jax.sharding.Mesh` whose axis
            names are ``("dp", "tp")``.
        devices: devices to use; default ``jax.devices()``. Their order is
            not kept (process, then id); pass a `Mesh` to choose it.

    Returns:
        The mesh, devices in process order then id (``tp`` inner); with fewer
        cells than devices, the first ``dp * tp`` (one process only: under
        `jax.distributed` every device takes part).

    Raises:
        ValueError: the mesh does not fit the devices, or has other axes.
    """
    if isinstance(mesh, Mesh):
        if tuple(mesh.axis_names) != AXES:
            raise ValueError(f"mesh axes must be {AXES}, got {tuple(mesh.axis_names)}")
        # `jax.make_mesh` makes Explicit axes by default, which reject the
        # sharding constraints the decode places; same devices, Auto axes.
        return Mesh(mesh.devices, AXES)
    # Process by process, so that tp (the inner axis) stays inside a host
    # when it divides a host's device count: its halo exchanges are the
    # chatty ones, dp's only split the batch.
    devices = sorted(jax.devices() if devices is None else devices, key=lambda d: (d.process_index, d.id))
    processes = len({d.process_index for d in devices})
    if mesh is None:
        # One process: every device on tp. Several: dp across processes.
        dp, tp = (1, len(devices)) if processes == 1 else (processes, len(devices) // processes)
    elif isinstance(mesh, str):
        dp, tp = parse_mesh_spec(mesh)
    elif isinstance(mesh, tuple) and len(mesh) == 2 and all(isinstance(v, int) and v >= 1 for v in mesh):
        dp, tp = mesh
    else:
        raise ValueError(f"mesh must be None, 'dp=..,tp=..', (dp, tp) or a jax Mesh, got {mesh!r}")
    if dp * tp > len(devices):
        kind = devices[0].platform if devices else "no"
        raise ValueError(
            f"mesh dp={dp},tp={tp} needs {dp * tp} devices but only {len(devices)} {kind} device(s) are available"
        )
    if processes > 1 and dp * tp != len(devices):
        raise ValueError(
            f"under jax.distributed the mesh must use every device: dp={dp},tp={tp} is {dp * tp} of "
            f"{len(devices)} devices over {processes} processes"
        )
    return Mesh(np.array(devices[: dp * tp]).reshape(dp, tp), AXES)


def activation_spec(shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Where an ``(N, C, [T,] H, W)`` activation lives on the mesh.

    Batch is split over ``dp`` when it divides (a 4-D activation here has
    ``N = batch * frames`` with batch outermost, so the same test holds).
    Width is split over ``tp`` even when it does not divide: XLA pads the last
    shard inside the program, so odd latent widths still shard.
    """
    dp, tp = mesh.shape["dp"], mesh.shape["tp"]
    batch_axis = "dp" if dp > 1 and shape[0] % dp == 0 else None
    width_axis = "tp" if tp > 1 else None
    return PartitionSpec(batch_axis, *([None] * (len(shape) - 2)), width_axis)


def constrain_activation(x: jax.Array, mesh: Mesh) -> jax.Array:
    """`jax.lax.with_sharding_constraint` of ``x`` to `activation_spec`."""
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activation_spec(x.shape, mesh)))


def input_sharding(shape: Sequence[int], mesh: Mesh) -> NamedSharding:
    """Sharding for a jit argument of this shape: batch over ``dp`` only.

    Arguments and results of a jit must split evenly, so width stays whole
    here; the first constraint inside the program splits it.
    """
    dp = mesh.shape["dp"]
    batch_axis = "dp" if dp > 1 and shape[0] % dp == 0 else None
    return NamedSharding(mesh, PartitionSpec(batch_axis))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (the weights)."""
    return NamedSharding(mesh, PartitionSpec())


def place(x: np.ndarray | jax.Array, where: NamedSharding) -> jax.Array:
    """Puts a host array (the same on every process) onto ``where``, which may span processes.

    Each process places only its own devices' shards, cut from its copy;
    with one process, or for an array already on devices, this is
    `jax.device_put`.
    """
    if where.is_fully_addressable or isinstance(x, jax.Array):
        return jax.device_put(x, where)
    return jax.make_array_from_callback(x.shape, where, lambda index: x[index])
