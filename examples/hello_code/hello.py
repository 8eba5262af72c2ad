"""A plain script that knows nothing of Compute Broker: it reads the torchrun-style
environment every rank gets, prints a line per "step" and writes a result file in its
cwd (the unpacked workdir). It reports no checkpoints, so after a move it starts again
from step 0, and `brokerctl job ID` says so."""

import json
import os
import sys
import time

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 5
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
for step in range(1, steps + 1):
    print(f"rank {rank}/{world} step {step}/{steps} lr={os.environ.get('LR', '?')}", flush=True)
    time.sleep(0.1)
with open(f"result-rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "world_size": world, "steps": steps}, f)
