"""A main wrapped in torch.distributed.elastic's ``@record`` (as torchtitan's is): the exception it raises is written
to the error file torchrun names in TORCHELASTIC_ERROR_FILE. A cleanup at exit then raises too, so the last
traceback in stderr is not the one that failed the run; the error file still names it."""

import atexit
import os

from torch.distributed.elastic.multiprocessing.errors import record


def cleanup() -> None:
    raise RuntimeError("cleanup after the failure failed too")


@record
def main() -> None:
    if os.environ["LOCAL_RANK"] == "0":
        atexit.register(cleanup)
        raise ValueError("bad config: lr must be positive, got -1")


if __name__ == "__main__":
    main()
