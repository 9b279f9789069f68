"""crew.fit: a model trained by libcrew on every device asked for, with what crew train has: the
plan, progress, metrics.jsonl, TensorBoard, the report, checkpoints, events, and a stop on Ctrl-C
that keeps the work.

The order is crew train's, so that bad input never leaves a half-made run directory: the model, the
data and the plan are checked first (crew_fit_prepare writes nothing); only then is the run
directory made, locked and written. The run itself goes on a thread of its own while the calling
thread waits on it: ctypes releases the GIL, progress comes back through callbacks from crew's
rank-0 thread, and a KeyboardInterrupt reaches the waiting thread, which asks crew to stop after
the step (a checkpoint, then the resume hint) and raises it once the run has stopped.
"""
import ctypes
import json
import os
import platform
import signal
import sys
import threading

from . import _group, _lib
from ._data import dataset
from ._model import Model
from ._progress import Progress
from .errors import InputError

lib = _lib.lib

# Option values in words, as crew train's flags take them, for the crew_fit_options members that
# are enums (the member's integer is taken too).
_ENUMS = {
    "precision": {"fp32": 0, "bf16": 1},
    "lr_scaling": {"none": 0, "linear": 1, "sqrt": 2},
    "on_nan": {"stop": 0, "skip": 1},
    "conv": {"auto": 0, "im2col": 1, "library": 2, "cudnn": 2},
    "communicator": {"auto": 0, "host": 1, "nccl": 2},
    "pipeline_schedule": {"1f1b": 0, "gpipe": 1},
    "sync_batch_norm": {"auto": -1, "off": 0, "on": 1},
    "attention_recompute": {"store": 0, "recompute": 1},
    "unordered_allreduce": {"ordered": 0, "fast": 1},
    "shard": {"none": 0, "optimizer": 1, "gradients": 2, "parameters": 3},
    "shard_overlap": {"auto": 0, "on": 1, "off": -1},
    "bind_cores": {"auto": 0, "on": 1, "off": -1},
    "loader_inline": {"auto": 0, "on": 1, "off": -1},
}
# crew train's flag names that differ from the member they set.
_ALIASES = {"sync_bn": "sync_batch_norm", "attention": "attention_recompute", "allreduce": "unordered_allreduce",
            "comm": "communicator", "pipeline": "pipeline_stages", "schedule": "pipeline_schedule",
            "stages": "pipeline_split", "collective_timeout": "collective_timeout_s",
            "threads": "threads_per_device"}
# Members crew.fit sets from its own arguments, or that only it may set.
_OWN = {"struct_size", "epochs", "seed", "device_kind", "devices", "batch_per_device", "global_batch", "test",
        "on_step", "on_epoch", "on_event", "user", "cancel", "group", "run_dir", "checkpoint_dir", "resume",
        "peak_gflops", "checkpoint_every_s"}

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


def _set_option(o, key, value):
    member = _ALIASES.get(key, key)
    if member in _OWN or member not in o:
        known = sorted((set(o.fields()) - _OWN) | set(_ALIASES) | {"checkpoint_every", "augment"})
        raise TypeError(f"crew.fit() got an unexpected keyword argument '{key}' (crew's options: "
                        f"{', '.join(known)})")
    if member in _ENUMS and isinstance(value, str):
        if value not in _ENUMS[member]:
            raise InputError(f"{key} takes one of {', '.join(_ENUMS[member])}, not '{value}'")
        value = _ENUMS[member][value]
    kind = o.kind(member)
    try:
        if kind in (_lib.INT, _lib.INT64, _lib.UINT64):
            value = int(value)
        elif kind in (_lib.FLOAT, _lib.DOUBLE):
            value = float(value)
        elif kind == _lib.STRING:
            value = str(value)
    except (TypeError, ValueError):
        raise InputError(f"{key}: {value!r} is not a value for it") from None
    o[member] = value


def _set_checkpoint_every(o, value):
    """Steps (an int), or seconds and minutes as crew train takes them ("90s", "10m")."""
    if isinstance(value, str) and value[-1:] in ("s", "m"):
        o["checkpoint_every_s"] = float(value[:-1]) * (60.0 if value[-1] == "m" else 1.0)
    else:
        o["checkpoint_every"] = int(value)


def _set_augment(o, value):
    """{"crop_padding": 4, "flip": True}, or crew train's text: "crop=4,flip", "none"."""
    if isinstance(value, str):
        parsed = {}
        for part in filter(None, value.split(",")):
            if part.startswith("crop="):
                parsed["crop_padding"] = int(part[5:])
            elif part == "flip":
                parsed["flip"] = True
            elif part != "none":
                raise InputError(f"augment takes crop=P, flip or none, not '{part}'")
        value = parsed
    o["augment.crop_padding"] = int(value.get("crop_padding", 0))
    o["augment.flip"] = int(bool(value.get("flip", False)))


def _devices(devices, group):
    kind = ctypes.create_string_buffer(32)
    count = ctypes.c_int()
    text = devices if devices else ("cpu:1" if group.handle else "cpu")
    _lib.check(lib.crew_devices_parse(text.encode(), kind, 32, ctypes.byref(count)))
    return kind.value.decode(), count.value


def _batches(batch_size, batch_per_device, replicas):
    """(batch_per_device, global_batch) from Keras's batch_size (the global batch) and crew's own."""
    if batch_size is None:
        return batch_per_device, 0
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, not {batch_size}")
    if batch_per_device is None:
        if batch_size % replicas:
            raise InputError(f"batch_size {batch_size} (the global batch) does not split evenly across {replicas} "
                             f"replicas: give a multiple of {replicas}, or batch_per_device as well")
        return batch_size // replicas, batch_size
    if batch_size % (replicas * batch_per_device):
        raise InputError(f"batch_size {batch_size} is not a multiple of {replicas} replicas x batch_per_device "
                         f"{batch_per_device}")
    return batch_per_device, batch_size


class _RunDir:
    """The run directory as crew train handles it: checked before anything is loaded, locked, made
    once the plan holds, its config written; messages say what to do next in crew.fit's words."""

    def __init__(self, wanted, name, resume, replace):
        self.resume = resume
        self.replace = replace
        buf = ctypes.create_string_buffer(1024)
        lib.crew_run_dir_choose(_lib.text(wanted), name.encode(), buf, 1024)
        self.path = buf.value.decode()
        self.lock = ctypes.c_void_p()
        note = ctypes.create_string_buffer(5200)
        _lib.check(lib.crew_run_dir_follow(self.path.encode(), note, 5200))
        self.note = note.value.decode()
        if resume:
            _lib.check(lib.crew_run_dir_check_resume(self.path.encode()))
            self._take_lock()  # a resume reads and sets aside checkpoints while it prepares
            _lib.check(lib.crew_run_dir_check_links(self.path.encode()))
        else:
            self._check_new()

    def _check_new(self):
        _lib.check(lib.crew_run_dir_usable(self.path.encode()))
        held = ctypes.create_string_buffer(256)
        if not self.replace and lib.crew_run_dir_holds(self.path.encode(), held, 256):
            raise InputError(f"run directory {self.path} holds another run ({held.value.decode()}): continue it with "
                             f"resume='{self.path}', or start a new one there with replace=True, which deletes those")

    def _take_lock(self):
        _lib.check(lib.crew_run_lock_take(self.path.encode(), b"crew.fit (Python)", ctypes.byref(self.lock)))
        note = lib.crew_run_lock_note(self.lock)
        if note:
            print(f"crew: warning: {note.decode()}", file=sys.stderr)

    def make(self):
        """After the plan holds: the directory, its lock, and for replace=True the old run's files."""
        if self.resume:
            return
        _lib.check(lib.crew_run_dir_create(self.path.encode()))
        self._take_lock()
        self._check_new()  # again under the lock: another run may have started there since
        if self.replace:
            _lib.check(lib.crew_run_dir_clear(self.path.encode()))

    def write_config(self, model, data, devices, plan):
        c = _lib.Struct("crew_run_config")
        c["model_path"] = model.what
        c["data_dir"] = data
        c["devices"] = devices
        c["front_end"] = f"crew.fit, python {platform.python_version()}" + _keras_version()
        c["plan"] = plan.address
        _lib.check(lib.crew_run_dir_write_config(self.path.encode(), c.ptr))

    def release(self):
        if self.lock:
            lib.crew_run_lock_release(self.lock)
            self.lock = ctypes.c_void_p()


def _keras_version():
    keras = sys.modules.get("keras")
    return f", keras {keras.__version__}" if keras is not None and hasattr(keras, "__version__") else ""


class History:
    """What Keras's fit returns, for a model that is not a Keras one: .history {"loss": [...], ...},
    .epoch, .params; and .weights, the trained tensors by crew's names."""

    def __init__(self, history, epochs, params, weights=None):
        self.history = history
        self.epoch = epochs
        self.params = params
        self.weights = weights


def _history(model, hist, params, weights):
    epochs = list(range(len(hist.get("loss", []))))
    if model.keras is not None:
        import keras  # the model is Keras's: so is its History

        h = keras.callbacks.History()
        h.set_model(model.keras)
        h.set_params(params)
        h.history = hist
        h.epoch = epochs
        return h
    return History(hist, epochs, params, weights)


class _Callbacks:
    """Keras callbacks (keras.callbacks.Callback, or any object with some of its methods) called as
    Keras's fit calls them, from crew's rank-0 thread: on_train_begin, on_epoch_begin,
    on_train_batch_end (logs: the epoch's running loss and accuracy), on_epoch_end (logs: the epoch's
    loss, accuracy, val_loss, val_accuracy), on_train_end. A callback that sets
    model.stop_training (EarlyStopping) ends the run as a finished one: set at the end of an epoch, it
    stops the run there, before the next epoch's first step (the replicas agree on it at the epoch's
    end); set during an epoch, after the step every replica agrees on. An exception in a callback
    stops the run too, and crew.fit raises it once the run has stopped."""

    def __init__(self, callbacks, keras_model, params, cancel):
        self.items = list(callbacks or [])
        self.model = keras_model
        self.cancel = cancel
        self.error = None
        self.stop_requested = False
        self.stop_epoch = self.epoch = 0
        for c in self.items:
            if keras_model is not None and hasattr(c, "set_model"):
                c.set_model(keras_model)
            if hasattr(c, "set_params"):
                c.set_params(params)
        if keras_model is not None:
            keras_model.stop_training = False

    def call(self, method, *args):
        if self.error is not None or (self.stop_requested and method != "on_train_end"):
            return
        if method in ("on_epoch_begin", "on_epoch_end"):
            self.epoch = args[0]
        try:
            for c in self.items:
                f = getattr(c, method, None)
                if f is not None:
                    f(*args)
            if self.model is not None and getattr(self.model, "stop_training", False) and not self.stop_requested:
                self.stop_requested = True
                self.stop_epoch = self.epoch
                self.cancel.value = 1
        except BaseException as e:  # raised again by crew.fit once the run has stopped
            self.error = e
            self.cancel.value = 1


def _per_step(callbacks):
    """Whether any callback has something to do at a step (Keras's base class does nothing there)."""
    for c in callbacks or []:
        for name in ("on_epoch_begin", "on_train_batch_end"):
            mine = getattr(type(c), name, None)
            base = next((getattr(b, name) for b in type(c).__mro__[1:] if b.__name__ == "Callback" and
                         hasattr(b, name)), None)
            if mine is not None and mine is not base:
                return True
    return False


def fit(model, x, y=None, *, epochs=1, batch_size=None, batch_per_device=None, devices=None,
        validation_data=None, run_dir=None, seed=1, verbose=1, resume=None, replace=False, callbacks=None,
        **options):
    group = _group.world()
    lead = group.rank == 0
    m = Model(model)
    datasets = []
    rd = None
    fit_handle = ctypes.c_void_p()
    try:
        train = dataset(m, x, y, "x")
        datasets.append(train)
        val = None
        if validation_data is not None:
            vx, vy = (validation_data, None) if isinstance(validation_data, (str, os.PathLike)) else validation_data
            val = dataset(m, vx, vy, "validation_data", split="test")
            datasets.append(val)
        elif isinstance(x, (str, os.PathLike)):
            val = dataset(m, x, None, "x", split="test")  # a directory's test split, as crew train
            datasets.append(val)

        kind, count = _devices(devices, group)
        replicas = count * group.size
        o = _lib.Struct("crew_fit_options")
        lib.crew_model_default_fit(m.handle, o.ptr)
        o["epochs"] = int(epochs)
        o["seed"] = int(seed)
        o["device_kind"] = kind
        o["devices"] = count
        bpd, global_batch = _batches(batch_size, batch_per_device, replicas)
        if bpd:
            o["batch_per_device"] = int(bpd)
        o["global_batch"] = int(global_batch)
        o["checkpoint_every_s"] = 600.0  # crew train's default: --checkpoint-every 10m
        for key, value in options.items():
            if key == "checkpoint_every":
                _set_checkpoint_every(o, value)
            elif key == "augment":
                _set_augment(o, value)
            else:
                _set_option(o, key, value)
        if "loader_threads" in options and "loader_inline" not in options:
            o["loader_inline"] = -1  # threads asked for, as crew train's --loader-threads
        if val is not None:
            o["test"] = val.handle
        if group.handle:
            o["group"] = group.handle.value
        resume_dir = run_dir if resume is True else resume
        if lead:
            rd = _RunDir(resume_dir or run_dir, m.name, bool(resume_dir), replace)
            if rd.note:
                print(f"crew: note: {rd.note}", file=sys.stderr)
            o["run_dir"] = rd.path
            o["checkpoint_dir"] = os.path.join(rd.path, "checkpoints")
            threads = o["threads_per_device"] or 1
            o["peak_gflops"] = lib.crew_run_peak(kind.encode(), count, threads, group.size, None)
        o["resume"] = int(bool(resume_dir))

        progress = Progress(verbose if lead else 0, int(epochs), val is not None)
        cancel = ctypes.c_int(0)
        o["cancel"] = ctypes.addressof(cancel)
        hist = {}
        running = {"loss": 0.0, "accuracy": 0.0, "steps": 0, "epoch_steps": 0}

        def on_step(user, info):
            i = _lib.Struct("crew_step_info", info)
            if i["epoch_step"] == 1:
                running.update(loss=0.0, accuracy=0.0, steps=0)
                calls.call("on_epoch_begin", i["epoch"], {})
            running["loss"] += i["loss"]
            running["accuracy"] += i["accuracy"]
            running["steps"] += 1
            running["epoch_steps"] = i["epoch_steps"]
            progress.step(i)
            n = running["steps"]
            calls.call("on_train_batch_end", i["epoch_step"] - 1,
                       {"loss": running["loss"] / n, "accuracy": running["accuracy"] / n})

        def on_epoch(user, info):
            e = _lib.Struct("crew_epoch_info", info).dict()
            if calls.stop_requested and e["epoch"] > calls.stop_epoch:
                return  # an epoch begun after a callback stopped the run (none since crew stops at the epoch's end)
            logs = {"accuracy": e["train_accuracy"], "loss": e["train_loss"]}
            if val is not None:
                logs.update(val_accuracy=e["test_accuracy"], val_loss=e["test_loss"])
            for k, v in logs.items():
                hist.setdefault(k, []).append(v)
            progress.epoch(e, running["epoch_steps"] or e["steps"])
            calls.call("on_epoch_end", e["epoch"], dict(logs))

        def on_event(user, info):
            progress.event(_lib.Struct("crew_event_info", info))

        handlers = (_CALLBACK(on_step), _CALLBACK(on_epoch), _CALLBACK(on_event))
        # A step's call into Python costs tens of microseconds: made only when something shows it.
        o["on_step"] = handlers[0] if (verbose == 1 and lead) or _per_step(callbacks) else None
        o["on_epoch"], o["on_event"] = handlers[1:]

        _lib.check(lib.crew_fit_prepare(m.handle, train.handle, o.ptr, ctypes.byref(fit_handle)))
        plan = _lib.Struct("crew_fit_plan", lib.crew_fit_get_plan(fit_handle))
        params = {"epochs": int(epochs), "steps": plan["steps_per_epoch"], "verbose": verbose,
                  "global_batch": plan["global_batch"], "batch_per_device": plan["batch_per_device"]}
        calls = _Callbacks(callbacks if lead else None, m.keras, params, cancel)
        described = f"{group.size} MPI ranks x {kind}:{count}" if group.handle else f"{kind}:{count}"
        if lead:
            rd.make()
            rd.write_config(m, train.what, described, plan)
            if verbose:
                text = ctypes.create_string_buffer(8192)
                lib.crew_fit_plan_text(plan.ptr, described.encode(), text, 8192)
                sys.stdout.write(text.value.decode() + f"run directory: {rd.path}\n")
                sys.stdout.flush()

        result = _lib.Struct("crew_fit_result")
        calls.call("on_train_begin", {})
        status = _run(fit_handle, result, cancel)
        asked = calls.stop_requested or calls.error is not None  # a callback stopped it, not the user
        # Rank 0 holds the run's result: whether it stopped before its end, and the History, which
        # every process returns (and, stopped, raises KeyboardInterrupt as rank 0 does).
        stopped = not asked and (bool(cancel.value) or (not status and result["steps"] < plan["total_steps"]))
        weights = None
        if lead and not status and result["steps"] > 0:
            weights = _save(m, rd.path, result, plan)
        if status and lead and result["last_checkpoint"]:
            print(f"crew: the last checkpoint is {result['last_checkpoint']}", file=sys.stderr)
        _lib.check(status)
        shared = _group.share(group, {"history": hist, "stopped": stopped, "asked": asked,
                                      "steps": result["steps"] if lead else 0})
        hist, stopped, asked = shared["history"], shared["stopped"], shared["asked"]
        if not lead and shared["steps"] > 0:  # libcrew put the trained values into every process's model
            weights = m.get()
            if m.keras is not None:
                m.to_keras(weights)
        if calls.error is not None:
            raise calls.error
        calls.call("on_train_end", {})
        if lead and verbose:
            _summary(result, plan, rd.path, not stopped and not asked)
        if stopped:
            if lead:
                _stop_hint(result, plan, rd.path)
            raise KeyboardInterrupt
        history = _history(m, hist, params, weights)
        history.crew = {"plan": plan.dict(), "result": result.dict() if lead else None, "run_dir": rd.path if lead else None}
        return history
    finally:
        if fit_handle:
            lib.crew_fit_free(fit_handle)
        if rd is not None:
            rd.release()
        for d in datasets:
            d.close()
        m.close()


def _save(m, run_dir, result, plan):
    """The trained weights into the run directory (marked with how far the run got) and into the
    Keras model, and the report: rank 0's, after a run that did at least a step."""
    path = os.path.join(run_dir, "weights.safetensors")
    _lib.check(lib.crew_model_save_weights_progress(m.handle, path.encode(), result["steps"], plan["total_steps"]))
    report = lib.crew_report_write(run_dir.encode(), None)
    if report:  # the report is written at the end of every run; failing to write it fails nothing else
        print(f"crew: no report: {lib.crew_status_message(report).decode()}", file=sys.stderr)
        lib.crew_status_free(report)
    weights = m.get()
    if m.keras is not None:
        m.to_keras(weights)
    return weights


def _run(fit_handle, result, cancel):
    """crew_fit_run on a thread of its own, while this thread waits; Ctrl-C asks it to stop after the
    step. On the main thread with Python's default SIGINT handler in place, a handler of our own
    stands in for it during the run: it sets the cancel flag and raises nothing, so no
    KeyboardInterrupt can land anywhere else (between two lines of this loop, or late, in the code
    that runs after the fit); crew.fit raises it once the run has stopped. Elsewhere (another
    thread, a handler of the user's) a KeyboardInterrupt caught around the wait does the same. The
    wait is on an Event, not on Thread.join: a join that KeyboardInterrupt breaks can leave
    is_alive() False for a thread that still runs (CPython 3.11), and the fit would be freed under it;
    it wakes every 0.1 s, so that a signal another thread received is handled within that."""
    done = threading.Event()
    box = {}

    def work():
        try:
            box["status"] = lib.crew_fit_run(fit_handle, result.ptr)
        finally:
            done.set()

    def interrupted(*_):
        if not cancel.value:
            print("\ncrew: stopping after this step, with a checkpoint (a step is never cut short)",
                  file=sys.stderr, flush=True)
        cancel.value = 1

    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, interrupted)
    try:
        t = threading.Thread(target=work, name="crew-fit", daemon=True)
        t.start()
        while not done.is_set():
            try:
                while not done.wait(0.1):
                    pass
            except KeyboardInterrupt:
                interrupted()
    finally:
        if not done.is_set():  # something escaped the wait: stop the run, and never free it under the thread
            cancel.value = 1
            done.wait()
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return box.get("status")


def _summary(r, plan, run_dir, finished):
    peak = f" = {100 * r['peak_fraction']:.0f}% of the peak" if plan["peak_gflops"] > 0 and \
        r["peak_fraction"] == r["peak_fraction"] else ""
    test = ""
    if r["test_accuracy"] == r["test_accuracy"]:
        test = f": test accuracy {r['test_accuracy']:.4f}, test loss {r['test_loss']:.4f}"
    print(f"{'trained' if finished else 'stopped'} after {r['steps']} steps in {r['wall_s']:.1f}s "
          f"({r['samples_per_s']:.0f} samples/s, {r['gflops']:.1f} GFLOP/s{peak}){test}")
    print(r["bottleneck"])
    print(r["noise_text"])
    print(f"weights: {run_dir}/weights.safetensors\nreport: {run_dir}/report.html\n"
          f"run directory: {run_dir} (config.json, metrics.jsonl, tb/, checkpoints/)", flush=True)


def _stop_hint(r, plan, run_dir):
    print(f"crew: stopped after step {r['steps']} of {plan['total_steps']}; the last checkpoint is "
          f"{r['last_checkpoint'] or '(none)'}", file=sys.stderr)
    print(f"crew: resume with: crew.fit(model, x, y, ..., resume={run_dir!r}) (the same data and batch)",
          file=sys.stderr, flush=True)
