"""The runtime helpers run on the torch of every image cloudtrain picks, not only the newest."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_fsdp2_found_where_torch_2_4_and_2_5_keep_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed._composable.fsdp as composable
    import torch.distributed.fsdp as public

    from cloudtrain.runtime.model import fsdp2_api

    if hasattr(public, "fully_shard"):  # torch >= 2.6; `nox -s compat` runs this on 2.4, which has no public names
        assert fsdp2_api() == (public.fully_shard, public.MixedPrecisionPolicy)
        # torch 2.4/2.5 (the default image on Vertex, and on SageMaker/Azure for torch_version 2.5)
        monkeypatch.delattr(public, "fully_shard")
        monkeypatch.delattr(public, "MixedPrecisionPolicy")
    assert fsdp2_api() == (composable.fully_shard, composable.MixedPrecisionPolicy)
