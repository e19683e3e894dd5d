"""Which Vertex machine type and accelerator serve a spec's ``accelerator`` ("A100:8"), from cloudtrain's catalog.

On Vertex a GPU job names both the machine type and the accelerator (type and count) in its MachineSpec; the A2, A3,
A4 and G2 families come with a fixed set of GPUs, N1 machines take T4/V100/P100 attached. ``providers.gcp.machine_type``
and ``providers.gcp.accelerator_type`` always win over the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain.errors import SpecError
from cloudtrain.platforms import catalog

# Families whose GPUs come with the machine: the machine type alone says which GPUs and how many.
_FIXED = ("a2-", "a3-", "a4-", "g2-")


@dataclass(frozen=True)
class Machine:
    machine_type: str
    accelerator_type: str | None  # a Vertex AcceleratorType value; None: no GPU
    accelerator_count: int


def accelerators() -> dict[str, str]:
    """GPU model (as a spec names it) -> Vertex AcceleratorType."""
    return {m.gpu: m.accelerator_type for m in catalog.machines("gcp") if m.gpu and m.accelerator_type}


def _model_of(accelerator_type: str) -> str | None:
    return next((m for m, a in accelerators().items() if a == accelerator_type), None)


def machine_for(model: str | None, count: int, machine_type: str | None, accelerator_type: str | None) -> Machine:
    """The MachineSpec for ``count`` x ``model`` GPUs per node; explicit options win, and fill in what they omit."""
    known = accelerators()
    if accelerator_type is None and model is not None:
        accelerator_type = known.get(model)
        if accelerator_type is None:
            raise SpecError(f"Vertex has no GPU model {model!r} in cloudtrain's catalog (known: {', '.join(known)})",
                            field="accelerator",
                            remedy="use one of those, or set providers.gcp.accelerator_type (a Vertex AcceleratorType "
                                   "such as NVIDIA_TESLA_A100) and providers.gcp.machine_type")
    rows = catalog.machines("gcp")
    if machine_type and accelerator_type is None and machine_type.startswith(_FIXED):
        fixed = next((m for m in rows if m.instance_type == machine_type and m.gpu), None)
        if fixed:  # an A2/A3/G2 machine names its GPUs: the API still wants them spelled out
            return Machine(machine_type, fixed.accelerator_type, fixed.gpus)
    if accelerator_type is None:
        default = catalog.lookup("gcp", None, 0)
        return Machine(machine_type or (default.instance_type if default else "n1-standard-8"), None, 0)
    model = model or _model_of(accelerator_type)
    count = count or next((m.gpus for m in rows if m.instance_type == machine_type and m.gpu == model), 1)
    if machine_type:
        return Machine(machine_type, accelerator_type, count)
    found = catalog.lookup("gcp", model, count)
    if found:
        return Machine(found.instance_type, accelerator_type, count)
    if model is None:
        raise SpecError(f"no gcp machine for {count} x {accelerator_type} in cloudtrain's catalog",
                        field="providers.gcp.accelerator_type", remedy="set providers.gcp.machine_type explicitly")
    raise catalog.unknown_accelerator("gcp", model, count)
