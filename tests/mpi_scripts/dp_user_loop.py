"""docs/data_parallel.md's example loop under mpiexec -n 3 (sizes [10, 20, 30]) against the same loop in one
process on the global batch. Prints JSON: {"rel_diff": params, "loss_diff": max over steps, "sizes": ...}."""
import json
import re
from pathlib import Path

import numpy as np
from mpi4py import MPI

doc = (Path(__file__).resolve().parents[2] / "docs" / "data_parallel.md").read_text()
code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
serial_code = code.replace("sizes=[10, 20, 30])", "sizes=[60], comm=SerialComm())")
assert serial_code != code, "the example's DataParallel line changed: update this script"
record = "\n    losses.append(loss)\n"               # the loop's losses, for the comparison
code = code.rstrip() + record
serial_code = serial_code.rstrip() + record

comm = MPI.COMM_WORLD
parallel = {"losses": []}
exec(code, parallel)
params = parallel["model"].params.copy()
assert parallel["dp"].sizes == [10, 20, 30]
losses = np.asarray(parallel["losses"])
every = comm.allgather(np.concatenate([params, losses]))
assert all(np.array_equal(e, every[0]) for e in every), "ranks disagree"
if comm.rank == 0:
    from pydtnn.parallel.comm import SerialComm
    serial = {"losses": [], "SerialComm": SerialComm}
    exec(serial_code, serial)
    ref = serial["model"].params
    print(json.dumps({"rel_diff": float(np.abs(params - ref).max() / np.abs(ref).max()),
                      "loss_diff": float(np.abs(losses - np.asarray(serial["losses"])).max()),
                      "steps": len(losses), "sizes": parallel["dp"].sizes, "moved": float(np.abs(ref).max())}))
