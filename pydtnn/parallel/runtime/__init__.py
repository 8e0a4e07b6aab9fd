"""The process around a replica.

    environment.py   what the environment mpiexec (or srun) gave this process says about the job
    mpirun.py        `mpiexec -n K python -m mpi4py ...` command lines (experiments, tests)
    threads.py       threads per replica: the node's cores shared among its ranks
    shutdown.py      how a job ends early: a user's mistake in one line on every rank, a bug as an abort
"""
