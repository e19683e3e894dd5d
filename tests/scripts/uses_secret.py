"""Checks that the job received its secret (by digest: the secret itself appears nowhere in this file)."""

import hashlib
import os

digest = hashlib.sha256(os.environ.get("WANDB_API_KEY", "").encode()).hexdigest()
print("secret received:", digest == "8db9c78a3c283dda4efaae5634a8dd0bf817aed9a85d2932370de450c6c4cf69", flush=True)
