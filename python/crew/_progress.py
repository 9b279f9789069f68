"""What crew.fit prints while it trains, as Keras's fit prints it:

    Epoch 1/3
    469/469 ━━━━━━━━━━━━━━━━━━━━ 4s 8ms/step - accuracy: 0.7864 - loss: 0.6112 - val_accuracy: 0.8388 - val_loss: 0.4472

verbose=1: one line that updates in place (a terminal, Jupyter) or, where output is a file, that
line once an epoch; verbose=2: the line once an epoch; verbose=0: nothing. The step's figures are
the running means over the epoch so far, as Keras's. Events (a straggler, a NaN, a hang) go to
stderr once per kind and replica, as crew train prints them. Called from crew's rank-0 thread.
"""
import sys
import time


def _interactive():
    return "ipykernel" in sys.modules or (hasattr(sys.stdout, "isatty") and sys.stdout.isatty())


def _seconds(s):
    return f"{s:.0f}s" if s >= 1 else f"{s * 1e3:.0f}ms" if s >= 1e-3 else f"{s * 1e6:.0f}us"


class Progress:
    def __init__(self, verbose, epochs, with_validation):
        self.verbose = verbose
        self.epochs = epochs
        self.live = verbose == 1 and _interactive()
        self.with_validation = with_validation
        self.seen_events = set()
        self._reset()

    def _reset(self):
        self.loss_sum = self.acc_sum = 0.0
        self.steps = 0
        self.last_draw = 0.0
        self.width = 0

    def _line(self, done, total, elapsed, loss, acc, extra=""):
        filled = int(20 * done / total) if total else 20
        per = elapsed / done if done else 0.0
        bar = "\u2501" * filled + "\u2500" * (20 - filled)
        return (f"{done}/{total} {bar} {_seconds(elapsed)} {_seconds(per)}/step - accuracy: {acc:.4f} - "
                f"loss: {loss:.4f}{extra}")

    def step(self, info):
        if self.verbose == 0:
            return
        if info["epoch_step"] == 1:
            self._reset()
            if self.live or self.verbose == 1:
                print(f"Epoch {info['epoch'] + 1}/{self.epochs}", flush=True)
        self.loss_sum += info["loss"]
        self.acc_sum += info["accuracy"]
        self.steps += 1
        now = time.monotonic()
        if not self.live or (now - self.last_draw < 0.1 and info["epoch_step"] != info["epoch_steps"]):
            return
        self.last_draw = now
        line = self._line(info["epoch_step"], info["epoch_steps"], info["elapsed_s"], self.loss_sum / self.steps,
                          self.acc_sum / self.steps)
        sys.stdout.write("\r" + line + " " * max(0, self.width - len(line)))
        sys.stdout.flush()
        self.width = len(line)

    def epoch(self, info, steps_per_epoch):
        if self.verbose == 0:
            return
        extra = ""
        if self.with_validation:
            extra = f" - val_accuracy: {info['test_accuracy']:.4f} - val_loss: {info['test_loss']:.4f}"
        if not self.live and self.verbose == 2:
            print(f"Epoch {info['epoch'] + 1}/{self.epochs}")
        line = self._line(steps_per_epoch, steps_per_epoch, info["wall_s"], info["train_loss"], info["train_accuracy"],
                          extra)
        if self.live:
            sys.stdout.write("\r" + line + " " * max(0, self.width - len(line)) + "\n")
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        self.width = 0

    def event(self, info):
        key = (info["kind"], info["rank"])
        if key in self.seen_events:
            return
        self.seen_events.add(key)
        if self.live and self.width:
            sys.stdout.write("\n")
            self.width = 0
        sys.stdout.flush()
        print(f"crew: {info['kind_name']}: {info['message']}", file=sys.stderr, flush=True)
