"""A store plugin as a third party writes one (issue 39.3): Cloudflare R2 speaks the S3 API at an endpoint of its
own, so its store is cloudtrain's S3 store with another scheme and endpoint. Registered as
``[cloudtrain.stores] r2 = r2store:R2Store``; tested with cloudtrain.testing.stores.StoreConformance."""

from __future__ import annotations

import os
from typing import Any

from cloudtrain.storage.s3 import S3Store


class R2Store(S3Store):
    scheme = "r2"
    INSTALL = "pip install 'cloudtrain[aws]'"

    def client_options(self) -> dict[str, Any]:
        return {"endpoint_url": os.environ["R2_ENDPOINT_URL"]}  # https://<account>.r2.cloudflarestorage.com
