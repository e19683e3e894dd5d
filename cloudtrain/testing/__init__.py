"""The provider conformance suite, shipped with cloudtrain so a provider's own package tests itself with it (no
cloudtrain source checkout needed): every provider, built in or a plugin, passes the same tests; a store plugin's
package does the same with ``StoreConformance`` (cloudtrain.testing.stores).

    from cloudtrain.testing import Harness, ProviderConformance

    class TestMine(ProviderConformance):
        @pytest.fixture
        def harness(self, ct_home, tmp_path):
            return MyHarness(ddp_project(tmp_path))

Installing cloudtrain registers ``cloudtrain.testing.fixtures`` as a pytest plugin (entry point ``pytest11``): the
fixtures the suite uses (``ct_home``: an isolated cloudtrain home and profile) are there without a conftest. That
module is imported by every pytest run on a machine with cloudtrain installed, so it stays light; this package's
exports load on first use, and the CLI never imports it (pyproject's import-linter contracts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cloudtrain._lazy import lazy_exports

__all__ = ["Harness", "ProviderConformance", "StoreConformance", "ddp_project", "stop_every_job"]

if TYPE_CHECKING:
    from cloudtrain.testing.conformance import Harness, ProviderConformance
    from cloudtrain.testing.fixtures import ddp_project, stop_every_job
    from cloudtrain.testing.stores import StoreConformance

__getattr__ = lazy_exports(__name__, {
    "Harness": "cloudtrain.testing.conformance",
    "ProviderConformance": "cloudtrain.testing.conformance",
    "StoreConformance": "cloudtrain.testing.stores",
    "ddp_project": "cloudtrain.testing.fixtures",
    "stop_every_job": "cloudtrain.testing.fixtures",
})
