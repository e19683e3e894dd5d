"""A rank-aware logger: rank 0 speaks at INFO, the others only at WARNING, every line says which rank."""

from __future__ import annotations

import logging
import os
import sys


def get_logger(name: str = "cloudtrain", rank: int | None = None) -> logging.Logger:
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    logger = logging.getLogger(f"{name}.rank{rank}")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    return logger
