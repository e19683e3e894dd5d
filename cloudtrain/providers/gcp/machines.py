"""Which Vertex machine type and accelerator serve a spec's ``accelerator`` ("A100:8"): a table, no SDK needed.

On Vertex a GPU job names both the machine type and the accelerator (type and count) in its MachineSpec; the A2, A3
and G2 families come with a fixed set of GPUs, N1 machines take T4/V100/P100 attached. ``providers.gcp.machine_type``
and ``providers.gcp.accelerator_type`` always win over this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain.errors import SpecError

# GPU model (as a spec names it) -> Vertex AcceleratorType enum value.
ACCELERATORS: dict[str, str] = {
    "T4": "NVIDIA_TESLA_T4", "V100": "NVIDIA_TESLA_V100", "P100": "NVIDIA_TESLA_P100", "L4": "NVIDIA_L4",
    "A100": "NVIDIA_TESLA_A100", "A100-80GB": "NVIDIA_A100_80GB", "H100": "NVIDIA_H100_80GB",
    "H100-MEGA": "NVIDIA_H100_MEGA_80GB", "H200": "NVIDIA_H200_141GB", "B200": "NVIDIA_B200",
}

# (GPU model, GPUs per node) -> machine type.
MACHINES: dict[tuple[str, int], str] = {
    ("T4", 1): "n1-standard-8", ("T4", 2): "n1-standard-16", ("T4", 4): "n1-standard-32",
    ("V100", 1): "n1-standard-8", ("V100", 2): "n1-standard-16", ("V100", 4): "n1-standard-32",
    ("V100", 8): "n1-standard-64",
    ("P100", 1): "n1-standard-8", ("P100", 2): "n1-standard-16", ("P100", 4): "n1-standard-32",
    ("L4", 1): "g2-standard-8", ("L4", 2): "g2-standard-24", ("L4", 4): "g2-standard-48", ("L4", 8): "g2-standard-96",
    ("A100", 1): "a2-highgpu-1g", ("A100", 2): "a2-highgpu-2g", ("A100", 4): "a2-highgpu-4g",
    ("A100", 8): "a2-highgpu-8g", ("A100", 16): "a2-megagpu-16g",
    ("A100-80GB", 1): "a2-ultragpu-1g", ("A100-80GB", 2): "a2-ultragpu-2g", ("A100-80GB", 4): "a2-ultragpu-4g",
    ("A100-80GB", 8): "a2-ultragpu-8g",
    ("H100", 8): "a3-highgpu-8g", ("H100-MEGA", 8): "a3-megagpu-8g", ("H200", 8): "a3-ultragpu-8g",
    ("B200", 8): "a4-highgpu-8g",
}
CPU_DEFAULT = "n1-standard-8"
# Families whose GPUs come with the machine: the machine type alone says which GPUs and how many.
_FIXED = ("a2-", "a3-", "a4-", "g2-")


@dataclass(frozen=True)
class Machine:
    machine_type: str
    accelerator_type: str | None  # a Vertex AcceleratorType value; None: no GPU
    accelerator_count: int


def _model_of(accelerator_type: str) -> str | None:
    return next((m for m, a in ACCELERATORS.items() if a == accelerator_type), None)


def machine_for(model: str | None, count: int, machine_type: str | None, accelerator_type: str | None) -> Machine:
    """The MachineSpec for ``count`` x ``model`` GPUs per node; explicit options win, and fill in what they omit."""
    if accelerator_type is None and model is not None:
        accelerator_type = ACCELERATORS.get(model)
        if accelerator_type is None:
            raise SpecError(f"Vertex has no GPU model {model!r} in cloudtrain's table "
                            f"(known: {', '.join(ACCELERATORS)})", field="accelerator",
                            remedy="use one of those, or set providers.gcp.accelerator_type (a Vertex AcceleratorType "
                                   "such as NVIDIA_TESLA_A100) and providers.gcp.machine_type")
    if machine_type and accelerator_type is None and machine_type.startswith(_FIXED):
        fixed = next(((m, c) for (m, c), name in MACHINES.items() if name == machine_type), None)
        if fixed:  # an A2/A3/G2 machine names its GPUs: the API still wants them spelled out
            return Machine(machine_type, ACCELERATORS[fixed[0]], fixed[1])
    if accelerator_type is None:
        return Machine(machine_type or CPU_DEFAULT, None, 0)
    model = model or _model_of(accelerator_type)
    count = count or next((c for (m, c), name in MACHINES.items() if name == machine_type and m == model), 1)
    if machine_type:
        return Machine(machine_type, accelerator_type, count)
    found = MACHINES.get((model or "", count))
    if found:
        return Machine(found, accelerator_type, count)
    offered = sorted(c for m, c in MACHINES if m == model)
    hint = f"{model} comes {', '.join(f'{model}:{c}' for c in offered)} per node on gcp" if offered else \
        f"no machine for {accelerator_type} in cloudtrain's table"
    raise SpecError(f"no gcp machine with {count} x {model or accelerator_type} ({hint})", field="accelerator",
                    remedy="pick one of those, or set providers.gcp.machine_type explicitly")
