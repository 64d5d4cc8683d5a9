"""This rank's place in a Horovod process set, asked of one framework's own Horovod library.

``ProcessSet.included()/rank()/size()`` ask ``horovod.common.process_sets._basics``: one module
global that every ``import horovod.<framework>`` overwrites with its own library. A process that
imports both ``horovod.torch`` and ``horovod.tensorflow`` (a test session, a notebook, a script
that converts a model) then asks the library it did not initialise: ``included()`` answers None
and ``rank()`` raises "not initialized", although Horovod's reductions (which use the
framework's own library) work. So each frontend passes its own ``HorovodBasics`` here.

Uses Horovod 0.28.1's ``_process_set_rank/_process_set_size`` (the calls behind the public
methods) and its error codes; the pinned version is what ``scripts/setup.sh`` installs.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

from ..errors import GradqError
from ..plan.hosts import ranks_per_host


class Membership(NamedTuple):
    included: bool
    rank: int  # this process's rank within the set (-1 when not included)
    size: int


def membership(basics: Any, process_set: Any) -> Membership:
    """Whether this process is in ``process_set``, its rank there, and the set's size, asked of
    ``basics`` (``horovod.torch.mpi_ops._basics`` or ``horovod.tensorflow.mpi_ops._basics``)."""
    pid = process_set.process_set_id
    if pid is None:
        raise GradqError(f"{process_set} is not registered with Horovod: pass it to hvd.init(process_sets=[...]) "
                         "or add it with hvd.add_process_set() before reducing over it")
    size = basics._process_set_size(int(pid))
    rank = int(basics.MPI_LIB_CTYPES.horovod_process_set_rank(ctypes.c_int(int(pid))))
    if rank == basics.HOROVOD_PROCESS_SET_ERROR_FOREIGN_SET:
        return Membership(False, -1, int(size))
    if rank < 0:
        basics._process_set_rank(int(pid))  # raises Horovod's own message for the other codes
    return Membership(True, rank, int(size))


def ranks_a_host(horovod: Any, basics: Any, process_set: Any) -> int:
    """Ranks a host for the hierarchical pattern and the cost model over ``process_set``, asked of
    one framework's Horovod module (``horovod.torch``, ``horovod.tensorflow``) and its ``basics``
    (:func:`hvd_gradq.plan.hosts.ranks_per_host`: several alike hosts, ranks numbered host by
    host); 1 for any process set but the global one, whose ranks may sit anywhere."""
    if process_set.process_set_id != horovod.global_process_set.process_set_id:
        return 1
    return ranks_per_host(horovod.size(), horovod.rank(), horovod.local_size(), horovod.local_rank(),
                          horovod.cross_rank(), bool(basics.is_homogeneous()))


def host_count(horovod: Any, basics: Any) -> int | None:
    """Hosts the job runs on, asked of one framework's Horovod module and its ``basics``: its
    size over the ranks of a host where every host runs as many (``is_homogeneous``), else None
    (Horovod does not say how many hosts of unlike sizes there are to every rank)."""
    if not basics.is_homogeneous():
        return None
    return max(int(horovod.size()) // max(int(horovod.local_size()), 1), 1)
