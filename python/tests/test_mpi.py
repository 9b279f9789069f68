"""`mpirun -np 2 python train.py` with crew.fit(..., devices="cpu:1") trains as 2 processes: rank 0
writes the run directory, every rank returns the same History and ends with the trained weights in
its Keras model, and they are those of 2 replicas in one process, bit for bit (crew's ordered
all-reduce); also with the parameters sharded across the processes (ZeRO-3)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import crew
from conftest import SOURCE, mlp, same_bits, weights

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, {tests!r})
from conftest import fashion, mlp
import crew
x, y, xt, yt = fashion.__wrapped__()
model = mlp()
h = crew.fit(model, x[:4096], y[:4096], epochs=2, batch_size=128, devices="cpu:1",
             validation_data=(xt[:1000], yt[:1000]), run_dir={run!r}, verbose=0, **{sharding!r})
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
crew.save_weights(model, {weights!r} + f".{{rank}}")
print("HISTORY", rank, json.dumps(h.history), flush=True)
"""


@pytest.mark.parametrize("shard", [None, "parameters"], ids=["unsharded", "zero3"])
def test_two_processes_train_as_two_replicas(tmp_path, fashion, shard):
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpirun:
        pytest.skip("no mpirun")
    script = tmp_path / "train.py"
    # ZeRO-3 (in units of 0.1 MiB, two of them): each process holds half the parameters, and rank 1's
    # Keras model gets them all at the end all the same
    sharding = {"shard": shard, "shard_unit_mb": 0.1} if shard else {}
    script.write_text(SCRIPT.format(tests=os.path.dirname(__file__), run=str(tmp_path / "run"),
                                    weights=str(tmp_path / "mpi.safetensors"), sharding=sharding))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    extra = [] if "mpich" in os.path.realpath(mpirun) else ["--oversubscribe", "--bind-to", "none"]
    p = subprocess.run([mpirun, *extra, "-np", "2", sys.executable, str(script)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    histories = {}
    for line in p.stdout.splitlines():
        if line.startswith("HISTORY "):
            _, rank, text = line.split(" ", 2)
            histories[int(rank)] = json.loads(text)
    assert sorted(histories) == [0, 1] and histories[0] == histories[1], "every rank returns the same History"
    assert len(histories[0]["val_accuracy"]) == 2
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["devices"] == "2 MPI ranks x cpu:1" and config["plan"]["devices"] == 2

    x, y, xt, yt = fashion
    threads = mlp()
    h = crew.fit(threads, x[:4096], y[:4096], epochs=2, batch_size=128, devices="cpu:2",
                 validation_data=(xt[:1000], yt[:1000]), run_dir=tmp_path / "threads", verbose=0)
    from_mpi, rank1 = mlp(), mlp()
    crew.load_weights(from_mpi, tmp_path / "mpi.safetensors.0")
    crew.load_weights(rank1, tmp_path / "mpi.safetensors.1")
    assert same_bits(weights(threads), weights(from_mpi)), "2 processes and 2 threads ended with other weights"
    assert same_bits(weights(from_mpi), weights(rank1)), "rank 1's Keras model did not get the trained weights"
    assert h.history == histories[0]
