"""crew.verify, crew.plan and crew.scale return the dicts crew verify, crew plan and crew scale print
with --json, on the same model and arrays."""
import json

import pytest

import crew
from conftest import crew_cli, mlp


def test_verify_passes_and_says_what_it_proved(fashion):
    x, y, _, _ = fashion
    r = crew.verify(mlp(), x[:4096], y[:4096], devices="cpu:2", steps=8)
    assert r["pass"] is True and r["bitwise_equal"] is True and r["devices"] == 2
    assert r["first_step_ok"] is True and r["epochs_crossed"] >= 1
    assert any(p["sharded"] for p in r["paths"]), "the sharded path runs by default"


def test_plan_is_the_clis(tmp_path):
    model = mlp()
    r = crew.plan(model, devices="cpu:4", batch_per_device=64, device_memory="1G")
    (tmp_path / "m.json").write_text(model.to_json())
    cli = json.loads(crew_cli("plan", tmp_path / "m.json", "--devices", "cpu:4", "--batch-per-device", 64,
                              "--device-memory", "1G", "--json").stdout.splitlines()[-1])
    assert r["model"] == "keras model 'mlp'"
    cli["model"] = r["model"]
    assert r == cli
    assert r["devices"] == 4 and r["global_batch"] == 256 and r["device_memory_bytes"] == 1 << 30


def test_scale_measures(fashion):
    x, y, _, _ = fashion
    r = crew.scale(mlp(), x[:8192], y[:8192], devices="cpu:2")
    assert r["trials"] and r["recommended_devices"] >= 1 and r["reason"]


def test_a_runs_noise_scale_reaches_plan_and_scale(fashion, tmp_path):
    x, y, _, _ = fashion
    model = mlp()
    history = crew.fit(model, x[:8192], y[:8192], devices="cpu:2", batch_size=128, epochs=1,
                       run_dir=tmp_path / "run", verbose=0)
    measured = history.crew["result"]["noise_scale"]
    assert measured > 0, "two replicas measure the gradient noise scale"

    p = crew.plan(model, devices="cpu:2", global_batch=512, from_=history)
    n = p["noise"]
    assert n["noise_scale"] == pytest.approx(measured, rel=1e-5) and n["noise_batch"] == 128
    e = (measured + 128) / (measured + 512)
    assert n["statistical_efficiency"] == pytest.approx(e, rel=1e-4)
    assert n["steps_ratio"] == pytest.approx(128 / 512 / e, rel=1e-4)
    assert crew.plan(model, devices="cpu:2")["noise"] is None

    s = crew.scale(model, x[:8192], y[:8192], devices="cpu:1,2", from_=str(tmp_path / "run"), steps=4, repeats=1,
                   warmup=1, batch_per_device=64)
    assert s["noise_scale"] == pytest.approx(measured, rel=1e-5) and s["noise_batch"] == 128
    assert s["noise_source"].startswith("run ")
    for point in s["projection"]:
        assert point["statistical_efficiency"] == pytest.approx(
            (measured + 128) / (measured + point["global_batch"]), rel=1e-4)
        assert point["to_target_s"] == pytest.approx(point["epochs_s"] / point["statistical_efficiency"], rel=1e-4)
    assert 1 <= s["pays_until_devices"] <= s["projection"][-1]["devices"] and s["goodput_reason"]

    with pytest.raises(crew.InputError, match="no gradient noise scale|cannot open"):
        crew.plan(model, from_=tmp_path)
