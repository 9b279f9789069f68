"""Ctrl-C during crew.fit: the run stops after the step with a checkpoint, says how to resume, and
raises KeyboardInterrupt with the interpreter still usable; resume= continues it to the weights of
a run never stopped, bit for bit."""
import os
import signal
import time

import keras
import pytest

import crew
from conftest import mlp, same_bits, weights


class CtrlC(keras.callbacks.Callback):
    """Sends this process SIGINT at one batch, as a user's Ctrl-C (a callback makes it one batch, not
    a time: the test does not depend on the machine's speed), then holds that batch until crew.fit
    says it is stopping (its line on stderr): the main thread handles a signal when it next runs, and
    on a loaded machine the rest of the run could otherwise end first. `said` keeps what stderr held."""

    def __init__(self, epoch, batch, capsys):
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = 0
        self.capsys = capsys
        self.said = ""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 120  # a bound no machine comes near; the test fails if passed
            while "stopping after this step" not in self.said and time.monotonic() < deadline:
                time.sleep(0.01)
                self.said += self.capsys.readouterr().err


@pytest.fixture
def ctrl_c_reaches_python():
    """Python's own Ctrl-C handler, as at a terminal: a process started in the background by a
    shell without job control (nohup ... &, some CI runners) inherits SIGINT ignored, and Python
    then leaves it so."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_keeps_the_work_and_resume_continues_bitwise(tmp_path, fashion, capsys, ctrl_c_reaches_python):
    x, y, xt, yt = fashion
    x, y = x[:8192], y[:8192]
    kw = dict(epochs=3, batch_size=128, devices="cpu:2", validation_data=(xt[:1000], yt[:1000]), verbose=0)
    whole = mlp()
    crew.fit(whole, x, y, run_dir=tmp_path / "whole", **kw)

    stopped = mlp()
    run = tmp_path / "stopped"
    ctrl_c = CtrlC(1, 20, capsys)
    with pytest.raises(KeyboardInterrupt):
        crew.fit(stopped, x, y, run_dir=run, callbacks=[ctrl_c], **kw)
    err = ctrl_c.said + capsys.readouterr().err
    assert "stopping after this step" in err and f"resume={str(run)!r}" in err
    checkpoints = sorted(os.listdir(run / "checkpoints"))
    assert checkpoints and checkpoints[-1].startswith("step-"), checkpoints
    assert "(none)" not in err

    resumed = mlp(seed=9)  # other starting weights: a resume takes the checkpoint's
    history = crew.fit(resumed, x, y, run_dir=run, resume=True, **kw)
    assert same_bits(weights(resumed), weights(whole)), "the resumed run ended elsewhere than the run never stopped"
    assert len(history.history["loss"]) >= 2  # the epochs this call ran: the interrupted one and the last
    # the interpreter is as usable as before (Python's own Ctrl-C handler back in place), and a new fit runs
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    crew.fit(mlp(), x[:512], y[:512], batch_size=128, devices="cpu:1", run_dir=tmp_path / "after", verbose=0)
