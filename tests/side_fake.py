"""A side task for the local runner's tests (`python -m side_fake OUT RC [SECONDS]`): it
writes its start time, pid and parent's pid to OUT, waits SECONDS, and exits with RC."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    start = time.time()
    time.sleep(float(argv[2]) if len(argv) > 2 else 0.0)
    Path(argv[0]).write_text(json.dumps({"start": start, "end": time.time(), "pid": os.getpid(),
                                         "ppid": os.getppid()}))
    return int(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
