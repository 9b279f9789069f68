"""The processes of a run under mpirun: `mpirun -np 2 python train.py` with crew.fit(..., devices="cpu:1")
trains as 2 processes. crew starts MPI itself on the first crew.fit (crew_mpi_start: a script needs
no MPI code of its own) and ends it when the interpreter exits; one process (rank 0) writes the run
directory and holds the trained weights, and every process returns the same History.
"""
import atexit
import ctypes
import json
import os

from . import _lib

lib = _lib.lib
GROUP_TIMEOUT_S = 60.0  # how long the processes may take to find each other at start
HISTORY_BYTES = 1 << 18


class Group:
    def __init__(self, handle=None):
        self.handle = handle
        self.rank = lib.crew_group_rank(handle) if handle else 0
        self.size = lib.crew_group_size(handle) if handle else 1


_world = None


def world():
    """This process's group: none (rank 0 of 1) unless mpirun started it."""
    global _world
    if _world is None:
        if not lib.crew_launched_by_mpi():
            _world = Group()
        else:
            # MPI_Iallreduce's algorithm, as crew train sets it (docs/PERFORMANCE.md); a user's own wins.
            os.environ.setdefault("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1")
            handle = ctypes.c_void_p()
            _lib.check(lib.crew_mpi_start(GROUP_TIMEOUT_S, ctypes.byref(handle)))
            _world = Group(handle)
            atexit.register(_end)
    return _world


def _end():
    if _world is not None and _world.handle:
        lib.crew_group_close(_world.handle)
        lib.crew_mpi_stop(0)


def share(group, value):
    """Rank 0's value (JSON-able), on every process."""
    if not group.handle:
        return value
    buf = ctypes.create_string_buffer(HISTORY_BYTES)
    if group.rank == 0:
        text = json.dumps(value).encode()
        if len(text) >= HISTORY_BYTES:
            text = json.dumps({}).encode()
        buf.value = text
    _lib.check(lib.crew_group_broadcast(group.handle, buf, HISTORY_BYTES, GROUP_TIMEOUT_S, b"the run's history"))
    return json.loads(buf.value.decode())
