"""Command line front end of the prediction API (``python -m pipeline.predict``; ``make predict ARGS='...'``).

Predict forward/backward/total times of op configs on some GPUs and precisions::

    python -m pipeline.predict conv2d \\
        --config batch=32,in_channels=64,out_channels=64,height=56,width=56,kernel_size=3,padding=1 \\
        --gpus h100,l4,t4 --precisions fp32,bf16

Scale a time measured on one GPU to others (Habitat's ratio, ``measured * model(dest) / model(origin)``)::

    python -m pipeline.predict bmm --config batch=8,m=512,k=512,n=512 --scale 0.42 --origin v100 --dest h100,l4

(``--scale`` takes one measured time per ``--config``, comma-separated.)

``--config`` may repeat (one table block per config). Values are integers, or true/false for bias and
bidirectional. Precisions a GPU cannot run are listed as unsupported. Times the model extrapolates (features
outside its training ranges) are marked ``*``. ``--json`` prints the same as JSON. ``--root`` points at another
checkpoints folder, ``--version`` picks a version (default: the champion). Bad input exits with code 2 and
a message naming the field.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from pipeline import api, gpus

_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$|^[+-]?(nan|inf)$", re.IGNORECASE)


class UsageError(ValueError):
    pass


def _value(text: str):
    t = text.strip()
    if _INT_RE.match(t):
        return int(t)
    if t.lower() in ("true", "yes"):
        return True
    if t.lower() in ("false", "no"):
        return False
    if _FLOAT_RE.match(t):
        return float(t)  # the API names the field if it is not a whole number
    return t


def parse_config(text: str) -> dict:
    """``batch=32,in_channels=64,...`` -> dict (ints, true/false as bools)."""
    config = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise UsageError(f"--config: expected key=value items separated by ',', got {item!r}")
        key, val = (s.strip() for s in item.split("=", 1))
        if not key or not val:
            raise UsageError(f"--config: expected key=value, got {item!r}")
        if key in config:
            raise UsageError(f"--config: field {key!r} given twice")
        config[key] = _value(val)
    if not config:
        raise UsageError("--config: empty; give key=value items, e.g. batch=8,m=512,k=512,n=512")
    return config


def _list(text: str, what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise UsageError(f"{what}: empty list")
    return items


def _fmt(ms: float, flagged: bool) -> str:
    return f"{ms:.4g}{'*' if flagged else ''}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    last = len(header) - 1
    lines = ["  ".join(str(c).ljust(w) if i < 2 or i == last else str(c).rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, ["-" * w for w in widths], *rows]]
    return "\n".join(line.rstrip() for line in lines)


def _supported(spec: dict, precision: str) -> bool:
    return gpus.supports_precision(spec, precision)


def _predictions(args, scaler, frame, configs, precisions, records: list) -> tuple[list[str], bool]:
    """Text blocks of forward/backward/total per config, GPU and precision; whether any was out of range."""
    if args.origin or args.dest:
        raise UsageError("--origin/--dest: only with --scale MS")
    specs = [api.resolve_gpu(g, "--gpus") for g in _list(args.gpus, "--gpus")]
    lines, any_flag = [], False
    for ci in range(len(frame)):
        one = frame.iloc[[ci]]
        rows = []
        for spec in specs:
            for p in precisions:
                record = {"config": ci, "gpu": spec["name"], "precision": p, "supported": _supported(spec, p)}
                if not record["supported"]:
                    rows.append([spec["name"], p, "-", "-", "-", f"no {p} path on this GPU"])
                else:
                    cells = [spec["name"], p]
                    for phase in api.PREDICT_PHASES:
                        ms, flags = scaler.predict(one, spec, p, phase, return_flags=True)
                        record[f"{phase}_ms"] = float(ms[0])
                        record["out_of_range"] = record.get("out_of_range", False) or bool(flags[0])
                        any_flag |= bool(flags[0])
                        cells.append(_fmt(float(ms[0]), bool(flags[0])))
                    rows.append(cells + [""])
                records.append(record)
        lines += ["", "config: " + ", ".join(f"{k}={v}" for k, v in configs[ci].items()),
                  _table(["gpu", "precision", *api.PREDICT_PHASES, "note"], rows)]
    return lines, any_flag


def _measured_times(args, n: int, precisions: list[str]) -> list[float]:
    """The --scale times, one per --config, checked (and the one precision they were measured at)."""
    if not args.origin or not args.dest:
        raise UsageError("--scale: needs --origin GPU and --dest GPU[,GPU...]")
    if args.gpus != _DEFAULT_GPUS:
        raise UsageError("--gpus: not used with --scale (give --dest)")
    try:
        measured = [float(v) for v in _list(args.scale, "--scale")]
    except ValueError:
        raise UsageError(f"--scale: must be measured times in ms (positive numbers, one per --config), "
                         f"got {args.scale!r}") from None
    if len(measured) != n:
        raise UsageError(f"--scale: {len(measured)} measured times for {n} --config; give one "
                         "per --config, comma-separated")
    bad = [v for v in measured if not (math.isfinite(v) and v > 0)]
    if bad:
        raise UsageError(f"--scale: measured times must be finite and > 0 ms, got {bad[0]!r}")
    if len(precisions) != 1:
        raise UsageError(f"--precisions: give the one precision the --scale time was measured at, got "
                         f"{', '.join(precisions)}")
    return measured


def _scalings(args, scaler, frame, configs, precisions, records: list) -> tuple[list[str], bool]:
    """Text blocks of the scaled --scale time per config, destination and precision; whether any was out of range."""
    measured_all = _measured_times(args, len(frame), precisions)
    api.check_phase(args.phase)
    origin = api.resolve_gpu(args.origin, "--origin")
    dests = [api.resolve_gpu(d, "--dest") for d in _list(args.dest, "--dest")]
    weight = scaler.ratio_weight  # the card's calibrated transfer, where it has one
    weights = [1.0] if weight is None else [1.0, weight]  # the scaled column, then the calibrated one
    carried = {}  # (dest index, precision) -> (times [weight, config], flags); one model pass per GPU and precision
    for p in precisions:
        ok = [i for i, spec in enumerate(dests) if _supported(origin, p) and _supported(spec, p)]
        if ok:
            per_dest = scaler.carry(frame, measured_all, origin, [dests[i] for i in ok], p, args.phase,
                                    weights=weights)
            carried.update({(i, p): result for i, result in zip(ok, per_dest)})
    lines, any_flag = [], False
    for ci in range(len(frame)):
        measured = float(measured_all[ci])
        rows = []
        for i, spec in enumerate(dests):
            for p in precisions:
                record = {"config": ci, "origin": origin["name"], "dest": spec["name"], "precision": p,
                          "phase": args.phase, "measured_ms": measured}
                if (i, p) not in carried:
                    who = origin["name"] if not _supported(origin, p) else spec["name"]
                    rows.append([spec["name"], p, "-", *(["-"] if weight is not None else []), f"no {p} path on {who}"])
                    record["supported"] = False
                else:
                    times, flag = [float(t) for t in carried[i, p][0][:, ci]], bool(carried[i, p][1][ci])
                    record.update(supported=True, scaled_ms=times[0], out_of_range=flag)
                    if weight is not None:
                        record["transfer_ms"] = times[1]
                    any_flag |= flag
                    rows.append([spec["name"], p, *(_fmt(t, flag) for t in times), ""])
                records.append(record)
        header = ["dest", "precision", f"{args.phase} (scaled)"]
        if weight is not None:
            header.append(f"{args.phase} (calibrated, w={weight:g})")
        lines += ["", "config: " + ", ".join(f"{k}={v}" for k, v in configs[ci].items()),
                  f"measured {measured:g} ms on {origin['name']} ({args.phase})", _table([*header, "note"], rows)]
    if weight is not None:
        lines += ["", f"scaled: Habitat's ratio, measured x model(dest) / model(origin); calibrated: model(dest) x "
                      f"(measured / model(origin)) ** {weight:g}, the share of the measurement this scaler's card was "
                      "calibrated to carry over (README, 'Loading a scaler in code')"]
    return lines, any_flag


def run(args: argparse.Namespace) -> tuple[str, dict]:
    configs = [parse_config(c) for c in args.config]
    precisions = [api.resolve_precision(p, "--precisions") for p in _list(args.precisions, "--precisions")]
    scaler = api.load_scaler(args.op, version=args.version, root=args.root)
    frame = api.normalize_configs(args.op, configs)  # validates every config up front
    result: dict = {"op": args.op, "version": scaler.version, "configs": frame.to_dict(orient="records"),
                    "rows": []}
    block = _predictions if args.scale is None else _scalings
    lines, any_flag = block(args, scaler, frame, configs, precisions, result["rows"])
    out_lines = [f"{args.op} v{scaler.version} (target {scaler.card['target'].get('kind')}); times in ms", *lines]
    if any_flag:
        out_lines += ["", "* outside the model's training ranges: an extrapolation, less reliable"]
    return "\n".join(out_lines), result


_DEFAULT_GPUS = "a100,h100,l4,t4"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.predict",
                                description="Predict op times on GPUs, or scale a measured time between GPUs.",
                                epilog="Example: python -m pipeline.predict bmm --config batch=8,m=512,k=512,n=512 "
                                       "--gpus h100,t4 --precisions fp32,fp16")
    p.add_argument("op", help=f"one of: {', '.join(api.OP_COLUMNS)}")
    p.add_argument("--config", action="append", required=True, metavar="K=V,...",
                   help="an op config, e.g. batch=8,m=512,k=512,n=512 (repeat for more)")
    p.add_argument("--gpus", default=_DEFAULT_GPUS, help=f"GPUs to predict for (default {_DEFAULT_GPUS})")
    p.add_argument("--precisions", default="fp32", help="comma-separated: fp32,tf32,fp16,bf16 (default fp32); with "
                                                         "--scale the one precision of the measurement")
    p.add_argument("--scale", metavar="MS", help="measured time(s) in ms on --origin to scale to --dest, one per "
                                                 "--config (comma-separated)")
    p.add_argument("--origin", help="the GPU the --scale time was measured on")
    p.add_argument("--dest", help="GPU(s) to scale to, comma-separated")
    p.add_argument("--phase", default="forward", help="phase of the --scale time: forward, backward or total")
    p.add_argument("--version", type=int, help="checkpoint version (default: the champion)")
    p.add_argument("--root", help="checkpoints folder (default: the repository's checkpoints/)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # argparse exits with 2 on bad usage
    try:
        text, result = run(args)
    except ValueError as exc:  # InputError, ChecksumError, UsageError: all name the field
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
