"""toyprov: a provider from outside cloudtrain, for the tests. One folder, registered through a real
``cloudtrain.providers`` entry point (tests/test_conformance.py writes its .dist-info), and no line of cloudtrain
changed for it: a toy batch scheduler that runs each node of a job as a process on this machine, with a node
contract of its own (TOY_NODE_INDEX, TOY_NODE_COUNT, TOY_HEAD)."""

from cloudtrain.registry import Declaration

PROVIDER = Declaration(
    name="toy", summary="a toy batch scheduler (cloudtrain's tests)", package=__name__, distribution="toyprov",
    provider="provider:ToyProvider", title="Toy batch", options="options:ToyOptions",
    env={"queue": ("TOY_QUEUE",)}, placeholders={"queue": "set-providers-toy-queue"},
    doctor="doctor:checks", node="node", platform="toybatch",
    name_pattern=r"[a-z0-9][a-z0-9-]{0,47}", name_rule="the spool's folder names: lowercase, digits, '-', at most 48",
)
