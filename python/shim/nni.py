"""knob's `nni` shim: an unchanged `import nni` trial script runs without nni installed.

knob writes this file, with `knob_trial.py` beside it, into a folder under the experiment's
`.knob-python/` and puts that folder first on each trial's PYTHONPATH (unless the config says
`nniShim: false`). With `nniShim: true` (`KNOB_NNI_SHIM=1`) `import nni` always gives this module. Otherwise it gives
the real nni wherever the trial's Python has one (the real module is loaded in this one's place,
so nni 3.0 and 2.x keep their own channels), and this module only where it has none.

It implements the trial calls of nni's API on knob's own protocol (`knob_trial`). Its reports take
whatever nni's take (a dict holding numpy arrays, a string such as "0.5"), as an unchanged nni
script expects; `knob_trial`'s own reports refuse what is not a metric.
"""

import os
import sys

if False:  # for type checkers only: importing typing would cost every trial's import
    from importlib.machinery import ModuleSpec

_HERE = os.path.dirname(os.path.abspath(__file__))


def _real_nni() -> "ModuleSpec | None":
    """The spec of an `nni` found on sys.path other than in this folder, or None."""
    from importlib.machinery import PathFinder

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    return PathFinder.find_spec(__name__, path)


_real_spec = None if os.environ.get("KNOB_NNI_SHIM") == "1" else _real_nni()

if _real_spec is not None and _real_spec.loader is not None:
    import importlib.util

    # `import nni` returns whatever sys.modules["nni"] is once this file has run, so the real
    # package loaded here is what the script gets.
    _real = importlib.util.module_from_spec(_real_spec)
    sys.modules[__name__] = _real
    try:
        _real_spec.loader.exec_module(_real)
    except BaseException:
        del sys.modules[__name__]
        raise
else:
    import knob_trial

    __version__ = "knob-shim"
    # A marker for code that needs to know which nni it has (knob's own tests do).
    __knob_shim__ = True

    # What `get_next_parameter` returned, None before: nni's `get_current_parameter` gives None
    # until then, and a script may test for that.
    _current: "dict[str, object] | None" = None

    def get_next_parameter() -> "dict[str, object]":
        """The trial's parameters."""
        global _current
        _current = knob_trial.get_parameters()
        return _current

    def get_next_parameters() -> "dict[str, object]":
        """`get_next_parameter`, under the other name nni's trial API has for it."""
        return get_next_parameter()

    def get_current_parameter(tag: "str | None" = None) -> object:
        """The parameters `get_next_parameter` returned, or one of them by name; None before it
        is called, as nni's function."""
        if _current is None:
            return None
        return _current if tag is None else _current[tag]

    def report_intermediate_result(metric: object) -> None:
        """One intermediate result: a number, or a dict (a numeric "default", or the metrics
        the experiment's `objectives` list); anything else nni takes is sent for knob to judge."""
        what = "report_intermediate"
        knob_trial._send_text("KNOB_INTERMEDIATE", _metric_text(metric, what), what)

    def report_final_result(metric: object) -> None:
        """The trial's final result: a number, or a dict (a numeric "default", or the metrics
        the experiment's `objectives` list); anything else nni takes is sent for knob to judge."""
        what = "report_final"
        knob_trial._send_text("KNOB_FINAL", _metric_text(metric, what), what)

    def _metric_text(metric: object, what: str) -> str:
        """`metric` as the JSON of a metric line, taking whatever nni's reports take: nni writes
        any value (json_tricks; nni 3.0 pickles what that cannot) and knob judges what it gets,
        so an unchanged nni script must not fail here where it ran under nni. knob_trial's own
        reports stay strict. Only what knob cannot read at all still raises, as in knob_trial:
        an int no float holds (`10**400`), and a line over 1 MiB (`knob_trial._send_text`)."""
        if type(metric) is int or type(metric) is float:
            return knob_trial._metric_text(metric, what)  # no json import for a plain number
        import json

        if isinstance(metric, str):
            metric = _decoded_string(metric)
        value = _plain_json(metric)
        if isinstance(value, dict):
            for key, entry in value.items():
                knob_trial._check_ints(entry, what, f"the metric's entry {key!r}")
        else:
            knob_trial._check_ints(value, what, "the metric")
        # allow_nan: NaN and Infinity are "no result" to knob, as from nni.
        return json.dumps(value, allow_nan=True, separators=(",", ":"))

    def _decoded_string(text: str) -> object:
        """A string metric as knob reads it from nni: nni json-encodes the string, and knob
        decodes a JSON string holding a number or a dict once more ("0.5" is the final 0.5).
        The decoded value is sent, so that an intermediate result counts too (knob's metric
        line takes no string); any other string is sent as one, which knob records without a
        value, as it does nni's."""
        import json

        try:
            decoded = json.loads(text)
        except ValueError:
            # What knob also reads as a whole value: Python's own spellings of NaN and infinity.
            word = text.strip()
            body = word[1:] if word[:1] in ("+", "-") else word
            decoded = float(word) if body.lower() in ("nan", "inf", "infinity") else None
        is_number = isinstance(decoded, (int, float)) and not isinstance(decoded, bool)
        return decoded if is_number or isinstance(decoded, dict) else text

    def _plain_json(value: object) -> object:
        """`value` as values JSON holds, as nni's json_tricks takes them and so that knob can
        read them: a numpy scalar or one-element array or tensor as its `item()`, a larger one
        (anything with `tolist()`) as its list, a tuple or set as a list, and an object JSON has
        no form for as its number (`float()`, a Decimal) or else its text."""
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        if isinstance(value, dict):
            return {_plain_key(key): _plain_json(entry) for key, entry in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [_plain_json(entry) for entry in value]
        scalar = _scalar(value)
        if scalar is not value:
            return scalar
        tolist = getattr(value, "tolist", None)
        if callable(tolist):
            try:
                listed = tolist()
            except Exception:
                listed = value
            if listed is not value:
                return _plain_json(listed)
        if hasattr(value, "__float__"):
            try:
                return float(value)
            except (TypeError, ValueError, OverflowError):
                pass
        return str(value)

    def _plain_key(key: object) -> object:
        """A dict key as JSON takes one: a str, int, float, bool or None (json writes the others
        of these as strings), a numpy scalar as its number, anything else as its text."""
        if key is None or isinstance(key, (str, bool, int, float)):
            return key
        scalar = _scalar(key)
        return scalar if scalar is not key else str(key)

    def _scalar(value: object) -> object:
        """What `value.item()` gives, if that is a JSON scalar (a numpy scalar or a one-element
        array or tensor, a bool one too); else `value` itself (several elements: numpy raises
        ValueError, torch RuntimeError)."""
        item = getattr(value, "item", None)
        if not callable(item):
            return value
        try:
            scalar = item()
        except Exception:
            return value
        return scalar if scalar is None or isinstance(scalar, (str, bool, int, float)) else value

    def get_trial_id() -> str:
        """nni's trial id: `NNI_TRIAL_JOB_ID` (knob's trial id), else "STANDALONE" as nni."""
        return os.environ.get("NNI_TRIAL_JOB_ID") or "STANDALONE"

    def get_experiment_id() -> str:
        """The experiment's id, else "STANDALONE" as nni."""
        return os.environ.get("NNI_EXP_ID") or "STANDALONE"

    def get_sequence_id() -> int:
        """The trial's sequence number, else 0 as nni."""
        return int(os.environ.get("NNI_TRIAL_SEQ_ID", "0"))

    def _merge_parameter(base_params: object, override_params: "dict[str, object] | None") -> object:
        """nni.utils.merge_parameter: sets each of `override_params` (the trial's parameters) on
        `base_params` (an argparse namespace or a dict, changed in place and returned). A name
        `base_params` does not have is a ValueError, as is a value of another type than the one
        there (an int where a float is becomes a float; a None there takes anything)."""
        if override_params is None:
            return base_params
        is_dict = isinstance(base_params, dict)
        for key, value in override_params.items():
            if is_dict:
                if key not in base_params:  # type: ignore[operator]
                    raise ValueError(f"Key '{key}' not found in base parameters.")
                current = base_params[key]  # type: ignore[index]
            else:
                if not hasattr(base_params, key):
                    raise ValueError(f"Key '{key}' not found in base parameters.")
                current = getattr(base_params, key)
            if current is not None and not isinstance(value, type(current)):
                if isinstance(current, float) and isinstance(value, int):
                    value = float(value)
                else:
                    raise ValueError(
                        f'Expected "{key}" in override parameters to have type '
                        f"{type(current).__name__}, but found {type(value).__name__}"
                    )
            if is_dict:
                base_params[key] = value  # type: ignore[index]
            else:
                setattr(base_params, key, value)
        return base_params

    # `from nni.utils import merge_parameter`, common in nni trial scripts: a module of its own
    # in sys.modules, which the import system finds before asking for a package's path.
    import types as _types

    utils = _types.ModuleType(__name__ + ".utils", "nni.utils, as knob's shim has it")
    utils.merge_parameter = _merge_parameter  # type: ignore[attr-defined]
    sys.modules[utils.__name__] = utils

    # nni's trial API is `nni.trial` (`__all__` of nni 2.x's and 3.0's nni/trial.py), which
    # `nni` re-exports; `from nni.trial import ...` gets the same functions here.
    _TRIAL_API = [
        "get_next_parameter",
        "get_next_parameters",
        "get_current_parameter",
        "report_intermediate_result",
        "report_final_result",
        "get_experiment_id",
        "get_trial_id",
        "get_sequence_id",
    ]
    trial = _types.ModuleType(__name__ + ".trial", "nni.trial, as knob's shim has it")
    trial.__all__ = _TRIAL_API  # type: ignore[attr-defined]
    for _name in _TRIAL_API:
        setattr(trial, _name, globals()[_name])
    sys.modules[trial.__name__] = trial
