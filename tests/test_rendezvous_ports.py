"""The rendezvous ports ddlbench derives for SLURM jobs, packed steps and mpirun launches
(ddlbench.launch.rendezvous)."""

from __future__ import annotations

import random
import socket

from ddlbench.launch import rendezvous
from ddlbench.launch.rendezvous import (
    MPI_PORTS,
    PORT_TRIES,
    STEP_LANES,
    mpi_master_port,
    port_is_free,
    slurm_master_port,
    step_port,
)


def _listen(port: int) -> socket.socket:
    """A listener on `port`, bound as torch's store binds (SO_REUSEADDR: a connection of an earlier test
    lingering in TIME_WAIT there does not refuse it); Linux still refuses a second listener on it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", port))
    listener.listen()
    return listener


def test_derived_ports_stay_below_the_ephemeral_range(monkeypatch):
    monkeypatch.setattr(rendezvous, "port_is_free", lambda port: True)
    monkeypatch.setattr(rendezvous, "ephemeral_range", lambda: rendezvous.DEFAULT_EPHEMERAL)
    ports = [slurm_master_port(str(job)) for job in range(0, 200_000, 7)]
    ports += [step_port(str(job), lane) for job in range(0, 5_000, 13) for lane in range(0, 300, 17)]
    assert min(ports) >= 20000 and max(ports) < 32768  # Linux hands out 32768-60999 to outgoing connections
    drawn = [mpi_master_port(random.Random(seed)) for seed in range(2_000)]
    assert min(drawn) >= 10000 and max(drawn) < 20000 and len(set(drawn)) > 1_500  # spread: launches rarely meet


def test_a_port_in_use_moves_the_choice_to_the_next_candidate_alike_each_time():
    job = "31337"
    first = slurm_master_port(job, check=False)
    if not port_is_free(first):  # taken on this host by something else already: the check moved past it
        assert slurm_master_port(job) != first
        return
    with _listen(first):
        moved = slurm_master_port(job)
        assert moved != first and slurm_master_port(job) == moved  # deterministic: one launcher, one answer
        assert 20000 <= moved < 32768
    assert slurm_master_port(job) == first


def test_steps_in_different_lanes_never_share_a_port_even_when_one_moves():
    # a job whose lane-0 port nothing on this host holds now (the suite's packed SLURM steps use this range):
    # this test takes it itself
    job = next(str(j) for j in range(4242, 4242 + 64) if port_is_free(step_port(str(j), 0, check=False)))
    taken = step_port(job, 0, check=False)
    with _listen(taken):
        ports = [step_port(job, lane) for lane in range(STEP_LANES)]
    assert taken not in ports
    assert len(set(ports)) == STEP_LANES


def test_a_site_whose_ephemeral_range_reaches_lower_is_avoided_too(monkeypatch):
    monkeypatch.setattr(rendezvous, "ephemeral_range", lambda: (20000, 21999))
    monkeypatch.setattr(rendezvous, "port_is_free", lambda port: True)
    assert all(not 20000 <= slurm_master_port(str(job)) <= 21999 for job in range(100))


def test_an_mpirun_launch_passes_over_a_port_in_use_to_a_free_one():
    # the first candidate a seed draws, held by a listener (a seed whose first candidate nothing here holds)
    seed = next(seed for seed in range(64) if port_is_free(random.Random(seed).sample(MPI_PORTS, PORT_TRIES)[0]))
    first = random.Random(seed).sample(MPI_PORTS, PORT_TRIES)[0]
    assert mpi_master_port(random.Random(seed)) == first
    with _listen(first):
        moved = mpi_master_port(random.Random(seed))
        assert moved != first and moved in MPI_PORTS and port_is_free(moved)
