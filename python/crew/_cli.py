"""crew.verify, crew.plan and crew.scale: the crew command line's verbs, run on the model and arrays
given, returning the dict their --json line prints (docs/VERIFY.md, docs/ADVISOR.md), so that Python
and the shell get the same answer from the same code. The crew executable is the one installed in
this package (bin/crew); `crew` on the command line after pip install runs it too (main below).

The model goes to the verb as a model file (Keras's to_json(), or crew's JSON) and the arrays as a
dataset directory with a train split (crew prep arrays), both in a temporary directory that is gone
afterwards. Each verb's flags are its keyword arguments: shard_optimizer=True is --shard-optimizer,
steps=20 is --steps 20, from_=history (or its run directory) is --from RUN_DIR.
"""
import json
import os
import subprocess
import sys
import tempfile

from ._data import write_dir
from ._model import Model
from .errors import InputError, TrainingError

_HERE = os.path.dirname(os.path.abspath(__file__))


def executable():
    return os.environ.get("CREW_EXECUTABLE") or os.path.join(_HERE, "bin", "crew")


def main():
    """The `crew` console script: the command line installed with the package."""
    os.execv(executable(), [executable()] + sys.argv[1:])


def _flags(options):
    out = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        # from_ is --from (a keyword in Python); a History stands for its run directory
        flag = "--" + key.rstrip("_").replace("_", "-")
        run_dir = getattr(value, "crew", None)
        if isinstance(run_dir, dict) and run_dir.get("run_dir"):
            value = run_dir["run_dir"]
        out += [flag] if value is True else [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return out


def run_verb(verb, model, x=None, y=None, devices=None, **options):
    """Runs `crew VERB MODEL --json ...` and returns its JSON line as a dict. Exit status 2 (bad
    input) raises InputError with crew's line; a verb that fails its own check (verify: exit 1)
    still returns its dict, whose "pass" says so."""
    m = Model(model)
    what = m.what
    try:
        with tempfile.TemporaryDirectory(prefix="crew-") as tmp:
            model_path = os.path.join(tmp, "model.json")
            with open(model_path, "w", encoding="utf-8") as f:
                f.write(m.text)
            args = [executable(), verb, model_path]
            if x is not None:
                data = x if isinstance(x, (str, os.PathLike)) else os.path.join(tmp, "data")
                if not isinstance(x, (str, os.PathLike)):
                    write_dir(x, y, m.classes, data)
                args += ["--data", os.fspath(data)]
            if devices is not None:
                args += ["--devices", devices]
            args += _flags(options) + ["--json"]
            p = subprocess.run(args, capture_output=True, text=True)
    finally:
        m.close()
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode == 2 or not lines:
        err = p.stderr.strip().splitlines()
        message = err[-1] if err else f"crew {verb} exited {p.returncode}"
        message = message.split(": ", 1)[1] if message.startswith(f"crew {verb}: ") else message
        raise (InputError if p.returncode == 2 else TrainingError)(message)
    result = json.loads(lines[-1])
    if "model" in result:
        result["model"] = what  # not the temporary file, gone by now
    return result
