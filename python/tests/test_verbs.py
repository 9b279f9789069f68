"""crew.verify, crew.plan and crew.scale return the dicts crew verify, crew plan and crew scale print
with --json, on the same model and arrays."""
import json

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
