#!/usr/bin/env python3
"""read_tensorboard.py — load crew's TensorBoard event files with TensorBoard's own reader.

    pip install tensorboard
    python3 tools/read_tensorboard.py RUN_DIR_OR_TB_DIR [--expect-tags a,b,c] [--expect-steps N]

Takes a run directory (its tb/ is used), a directory of event files, or one event file. Prints
each event file with its file_version and record count (read by
tensorboard.backend.event_processing.event_file_loader, which checks both CRCs of every record),
then every scalar tag with its number of points and its first and last (step, value), as
TensorBoard's EventAccumulator loads them (size_guidance 0: keep every point).

Exits 1 when a tag named in --expect-tags is missing, when a tag (each expected tag, or every
tag if none are named) has fewer than --expect-steps points, or when a tag has two points at one
step; 2 when there are no event files. Two points at a step are what a resumed run leaves when
its restart is not marked: crew writes a SessionLog START at the first step it runs again, and
TensorBoard then drops the earlier points from that step on (docs/TENSORBOARD.md, "Resumed runs").
It is a check that real TensorBoard reads what crew writes; crew's own tests do not need it.
"""
import argparse
import os
import sys


def event_files(path):
    """The event files under path (a file, a directory of them, or a run directory with tb/)."""
    if os.path.isfile(path):
        return os.path.dirname(path) or ".", [path]
    if os.path.isdir(os.path.join(path, "tb")):
        path = os.path.join(path, "tb")
    if not os.path.isdir(path):
        return path, []
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if "tfevents" in f)
    return path, files


def describe_file(path):
    """(file_version, records) read record by record with TensorBoard's loader."""
    from tensorboard.backend.event_processing import event_file_loader

    version, records = None, 0
    for event in event_file_loader.LegacyEventFileLoader(path).Load():
        records += 1
        if event.HasField("file_version"):
            version = event.file_version
    return version, records


def load_scalars(path):
    """{tag: [ScalarEvent]} as TensorBoard loads them, every point kept."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", help="run directory, tb directory or event file")
    ap.add_argument("--expect-tags", default="", help="comma-separated tags that must be present")
    ap.add_argument("--expect-steps", type=int, default=0, help="points each (expected) tag must have at least")
    args = ap.parse_args()

    try:
        import tensorboard
    except ImportError:
        sys.exit("read_tensorboard.py needs the tensorboard package: pip install tensorboard")

    where, files = event_files(args.path)
    if not files:
        print(f"{where}: no event files", file=sys.stderr)
        return 2
    print(f"tensorboard {tensorboard.__version__}")
    for f in files:
        version, records = describe_file(f)
        print(f"{f}: file_version {version!r}, {records} records")

    # One file given: load just it; otherwise the directory, as `tensorboard --logdir` does.
    scalars = load_scalars(files[0] if os.path.isfile(args.path) else where)
    width = max((len(t) for t in scalars), default=3)
    for tag in sorted(scalars):
        pts = scalars[tag]
        first, last = pts[0], pts[-1]
        print(f"{tag:<{width}}  {len(pts):6d} points  first step {first.step:>7} = {first.value:<14.7g}"
              f"last step {last.step:>7} = {last.value:.7g}")

    failures = []
    expected = [t for t in args.expect_tags.split(",") if t]
    for tag in expected:
        if tag not in scalars:
            failures.append(f"tag {tag!r} is missing")
    if args.expect_steps:
        for tag in expected or sorted(scalars):
            n = len(scalars.get(tag, []))
            if tag in scalars and n < args.expect_steps:
                failures.append(f"tag {tag!r} has {n} points, expected at least {args.expect_steps}")
    for tag in sorted(scalars):
        steps = [p.step for p in scalars[tag]]
        twice = len(steps) - len(set(steps))
        if twice:
            first = next(s for i, s in enumerate(steps) if s in steps[:i])
            failures.append(f"tag {tag!r} has {twice} points at steps it already had (the first at step {first}): "
                            "a restart that TensorBoard was not told of")
    for msg in failures:
        print(f"FAIL: {msg}", file=sys.stderr)
    if not failures:
        print(f"ok: {len(scalars)} tags")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
