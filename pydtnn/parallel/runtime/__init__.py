"""The process around a replica: the MPI launcher's environment, mpirun lines, threads, how a job ends."""
