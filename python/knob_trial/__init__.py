"""knob's trial API: parameters in, metrics out, over knob's own protocol (README, "Trial
protocols"; training-services/PROTOCOLS.md). Nothing to import but the standard library's `os`,
so that importing it costs next to nothing (`benches/harness/trial_import.sh`).

    import knob_trial
    params = knob_trial.get_parameters()
    for epoch in range(10):
        knob_trial.report_intermediate(train_one_epoch(params["lr"]))
    knob_trial.report_final({"default": evaluate(), "epochs": 10})

A multi-objective experiment's trial reports a dict of the metrics its `objectives` list
(`{"accuracy": 0.93, "latency_ms": 12.5}`), without "default".

knob writes this same file into a folder under the experiment's `.knob-python/` and puts that
folder on every trial's PYTHONPATH, so `import knob_trial` works in a trial whether or not the wheel is installed
in the trial's Python, and always matches the knob that runs the trial.

Outside a knob trial (a script run by hand), `get_parameters()` returns `{}` and the reports go
to stdout as knob's lines, each with one warning on stderr the first time.
"""

import os
import sys

__all__ = [
    "get_parameters",
    "report_intermediate",
    "report_final",
    "checkpoint_dir",
    "get_trial_id",
    "get_experiment_id",
    "get_sequence_id",
]

# For type checkers only (mypy takes a name TYPE_CHECKING as true): importing `typing` at run
# time would add its milliseconds to every trial's import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Protocol, Union

    class _HasItem(Protocol):
        """A numpy scalar, or a one-element array or tensor: the number its `item()` gives."""

        def item(self) -> Any: ...

    # What a report takes (README, "Trial protocols"): a number, a numpy scalar or a one-element
    # array or tensor (anything with `item()`, as the reports read it), or a dict of them.
    _Metric = Union[float, _HasItem, Dict[str, Any]]

_parameters: "dict[str, object] | None" = None
_warned_outside = False


def _warn_outside(what: str) -> None:
    global _warned_outside
    if not _warned_outside:
        _warned_outside = True
        sys.stderr.write(
            f"knob_trial: {what}: not running as a knob trial (KNOB_TRIAL_ID is not set); "
            "parameters are {} and reports go to stdout\n"
        )


def get_parameters() -> "dict[str, object]":
    """The trial's parameters (a dict, the same object on every call)."""
    global _parameters
    if _parameters is None:
        text = os.environ.get("KNOB_PARAMETERS")
        if text is None:
            # Left out of the environment when large (over 100 KiB): the file always has them.
            path = os.environ.get("KNOB_PARAMETERS_FILE")
            if path is None:
                _warn_outside("get_parameters()")
                _parameters = {}
                return _parameters
            with open(path, encoding="utf-8") as file:
                text = file.read()
        _parameters = _loads(text)
    return _parameters


class _ScannerContext:
    """What `_json.make_scanner` reads from a `json.JSONDecoder`."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__


def _loads(text: str) -> "dict[str, object]":
    """`json.loads(text)` for a JSON object, without importing `json`: `json.decoder` imports
    `re`, which costs more than all the rest of a trial's first report. CPython's C scanner does
    the work; anything it does not take (or another Python) goes to `json` for its error."""
    try:
        from _json import make_scanner as scanner_of
    except ImportError:
        scanner_of = None  # type: ignore[misc, assignment]
    if scanner_of is not None:
        start = len(text) - len(text.lstrip(" \t\n\r"))
        try:
            value, end = scanner_of(_ScannerContext())(text, start)  # type: ignore[arg-type]
        except Exception:  # StopIteration, ValueError; SystemError on some errors
            value, end = None, -1
        if end >= 0 and not text[end:].strip(" \t\n\r") and isinstance(value, dict):
            return value
    import json

    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"knob_trial: the parameters are not a JSON object: {text[:100]!r}")
    return value


def _metric_text(value: object, what: str) -> str:
    # A plain number needs no json module: its repr is JSON (importing json is most of the cost
    # of a first report).
    if type(value) is int:
        _check_int(value, what, "the metric")
        return str(value)
    if type(value) is float:
        text = repr(value)
        return _SPECIAL_FLOATS.get(text, text)
    import json

    value = _plain_number(value)
    # bool is an int to Python, but never a metric a tuner can use.
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise TypeError(
            f"knob_trial.{what}: a metric is a number or a dict (of JSON values; its 'default', "
            f"if any, a number), not {type(value).__name__}"
        )
    # A dict without "default" is sent as it is, as nni sends it: knob judges it, since only
    # the experiment knows what it needs (the metrics its `objectives` list, or "default").
    if isinstance(value, dict) and "default" in value:
        default = _plain_number(value["default"])
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            raise ValueError(
                f"knob_trial.{what}: a dict metric's 'default' is the value tuners optimise, a "
                f"number, not {default!r}"
            )

    def plain(other: object) -> object:
        number = _plain_number(other)
        if number is other:
            raise TypeError(f"knob_trial.{what}: {type(other).__name__} {other!r} is not JSON")
        return number

    if isinstance(value, dict):
        for key, entry in value.items():
            _check_ints(entry, what, f"the metric's entry {key!r}")
    # allow_nan: NaN and Infinity are accepted by knob as "no result" (README).
    return json.dumps(value, allow_nan=True, separators=(",", ":"), default=plain)


def _check_int(value: int, what: str, where: str) -> None:
    """Raises ValueError for an int that no 64-bit float holds (`10**400`): JSON writes it, but
    knob reads every number as a float and would find the metric unreadable."""
    try:
        float(value)
    except OverflowError:
        raise ValueError(
            f"knob_trial.{what}: {where} is an int of {value.bit_length()} bits, too large for "
            "the 64-bit float knob reads it as (at most about 1.8e308)"
        ) from None


def _check_ints(value: object, what: str, where: str) -> None:
    """`_check_int` for every int in a dict or list (nested in a dict metric), `where` naming
    its place."""
    if isinstance(value, dict):
        for key, entry in value.items():
            _check_ints(entry, what, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, entry in enumerate(value):
            _check_ints(entry, what, f"{where}[{index}]")
    elif isinstance(value, int) and not isinstance(value, bool):
        _check_int(value, what, where)


def _plain_number(value: object) -> object:
    """A numpy scalar (`np.float32(0.9)`, what `model(x).numpy()` often gives) or a one-element
    array or tensor as the Python number its `item()` gives; anything else as it is. nni's
    reports take numpy scalars too (its json_tricks writes their item())."""
    item = getattr(value, "item", None)
    if item is None or isinstance(value, (int, float, str, bytes, dict)):
        return value
    try:
        number = item()
    # More than one element: numpy raises ValueError, torch RuntimeError.
    except (TypeError, ValueError, RuntimeError):
        return value
    return number if isinstance(number, (int, float)) and not isinstance(number, bool) else value


# JSON's spelling of the floats that repr() writes otherwise.
_SPECIAL_FLOATS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


# The longest metric line knob reads (training-services' MAX_METRIC_BYTES); a longer one is
# skipped there with only a warning in the store, so it is refused here, where the trial sees it.
MAX_METRIC_LINE_BYTES = 1 << 20


def _send(kind: str, value: object, what: str) -> None:
    _send_text(kind, _metric_text(value, what), what)


def _send_text(kind: str, text: str, what: str) -> None:
    """Sends a metric already written as JSON text (the `nni` shim writes its own, leniently)."""
    line = f"{kind} {text}\n"
    data = line.encode("utf-8")
    if len(data) - 1 > MAX_METRIC_LINE_BYTES:
        raise ValueError(
            f"knob_trial.{what}: the metric line is {len(data) - 1} bytes, over knob's limit of "
            f"{MAX_METRIC_LINE_BYTES} (1 MiB); report numbers, and write bulky data to a file "
            f"(knob_trial.checkpoint_dir() or the trial's folder)"
        )
    path = os.environ.get("KNOB_METRICS_FILE")
    if path is None:
        _warn_outside(f"{what}")
        sys.stdout.write(line)
        sys.stdout.flush()
        return
    # One write of a whole line with O_APPEND: knob reads the file as it grows, and a line is
    # never split by another writer (a second thread, the same trial's stdout lines go elsewhere).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        while written < len(data):
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)


def report_intermediate(value: "_Metric") -> None:
    """Reports one intermediate result: a number, or a dict (with a numeric "default", or the
    metrics the experiment's `objectives` list)."""
    _send("KNOB_INTERMEDIATE", value, "report_intermediate")


def report_final(value: "_Metric") -> None:
    """Reports the trial's final result; knob keeps the first one of an attempt."""
    _send("KNOB_FINAL", value, "report_final")


def checkpoint_dir() -> str:
    """A folder for this trial's checkpoints, created if missing. It is the same for every attempt
    of the trial (a retry, or a run again after `knob resume`), so a script can continue from what
    an earlier attempt saved; `$KNOB_CHECKPOINT_DIR`, else `checkpoint/` in the trial's folder."""
    path = os.environ.get("KNOB_CHECKPOINT_DIR")
    if path is None:
        trial_dir = os.environ.get("KNOB_TRIAL_DIR")
        if trial_dir is None:
            _warn_outside("checkpoint_dir()")
            trial_dir = os.getcwd()
        path = os.path.join(trial_dir, "checkpoint")
    os.makedirs(path, exist_ok=True)
    return path


def get_trial_id() -> "str | None":
    """The trial's id (`KNOB_TRIAL_ID`), or None outside a trial."""
    return os.environ.get("KNOB_TRIAL_ID")


def get_experiment_id() -> "str | None":
    """The experiment's id, or None outside a trial."""
    return os.environ.get("NNI_EXP_ID")


def get_sequence_id() -> "int | None":
    """The trial's sequence number in its experiment (0, 1, …), or None outside a trial."""
    sequence = os.environ.get("NNI_TRIAL_SEQ_ID")
    return None if sequence is None else int(sequence)
