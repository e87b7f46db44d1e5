"""knob_trial and the nni shim, each run in a fresh interpreter with the variables a knob trial
gets (training-services/PROTOCOLS.md), against real files in a temporary trial folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import knob_trial

PYTHON_DIR = Path(__file__).resolve().parent.parent
SHIM = PYTHON_DIR / "shim" / "nni.py"


def trial_env(trial_dir: Path, parameters: "dict[str, object]", *, in_env: bool = True) -> dict[str, str]:
    """What knob's runner sets (runner.rs `trial_environment`), for one trial in `trial_dir`."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "parameters.json").write_text(json.dumps(parameters))
    (trial_dir / "metrics.knob").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KNOB_", "NNI_"))}
    env.update(
        KNOB_TRIAL_ID="abcde",
        KNOB_TRIAL_DIR=str(trial_dir),
        KNOB_PARAMETERS_FILE=str(trial_dir / "parameters.json"),
        KNOB_METRICS_FILE=str(trial_dir / "metrics.knob"),
        KNOB_CHECKPOINT_DIR=str(trial_dir / "checkpoint"),
        NNI_EXP_ID="exp1",
        NNI_TRIAL_JOB_ID="abcde",
        NNI_TRIAL_SEQ_ID="7",
    )
    if in_env:
        env["KNOB_PARAMETERS"] = json.dumps(parameters)
    return env


def run_python(code: str, env: dict[str, str], path: list[Path]) -> subprocess.CompletedProcess[str]:
    env = dict(env, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def metric_lines(trial_dir: Path) -> list[str]:
    return (trial_dir / "metrics.knob").read_text().splitlines()


@pytest.fixture
def knob_trial_dir() -> Path:
    """The folder that holds the knob_trial package under test."""
    return Path(knob_trial.__file__).resolve().parent.parent


def test_parameters_in_and_metrics_out(tmp_path: Path, knob_trial_dir: Path) -> None:
    env = trial_env(tmp_path / "t", {"lr": 0.01, "layers": 3})
    result = run_python(
        "import knob_trial as k\n"
        "p = k.get_parameters()\n"
        "assert p == {'lr': 0.01, 'layers': 3}, p\n"
        "k.report_intermediate(0.5)\n"
        "k.report_intermediate({'default': 0.25, 'loss': 2})\n"
        "k.report_final(float('nan'))\n"
        "print(k.get_trial_id(), k.get_experiment_id(), k.get_sequence_id())\n",
        env,
        [knob_trial_dir],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "abcde exp1 7\n"
    assert result.stderr == ""
    assert metric_lines(tmp_path / "t") == [
        "KNOB_INTERMEDIATE 0.5",
        'KNOB_INTERMEDIATE {"default":0.25,"loss":2}',
        "KNOB_FINAL NaN",
    ]


def test_a_dict_without_default_is_sent_for_knob_to_judge(tmp_path: Path, knob_trial_dir: Path) -> None:
    """A multi-objective trial reports every objective in one dict, with no "default" (README,
    "Multi-objective tuning"), as real nni takes it: it raised ValueError, in the nni shim too."""
    env = trial_env(tmp_path / "t", {})
    result = run_python(
        "import knob_trial as k, nni\n"
        "k.report_intermediate({'accuracy': 0.5, 'latency_ms': 3})\n"
        "nni.report_intermediate_result({'accuracy': 0.625, 'latency_ms': 3.5})\n"
        "k.report_final({'accuracy': 0.75, 'latency_ms': float('inf')})\n"
        "nni.report_final_result({})\n",
        env,
        [knob_trial_dir, SHIM.parent],
    )
    assert result.returncode == 0, result.stderr
    assert metric_lines(tmp_path / "t") == [
        'KNOB_INTERMEDIATE {"accuracy":0.5,"latency_ms":3}',
        'KNOB_INTERMEDIATE {"accuracy":0.625,"latency_ms":3.5}',
        'KNOB_FINAL {"accuracy":0.75,"latency_ms":Infinity}',
        "KNOB_FINAL {}",
    ]


def test_large_parameters_come_from_the_file(tmp_path: Path, knob_trial_dir: Path) -> None:
    env = trial_env(tmp_path / "t", {"x": "y" * 1000}, in_env=False)
    result = run_python(
        "import knob_trial as k; print(len(k.get_parameters()['x']))", env, [knob_trial_dir]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1000\n"


@pytest.mark.parametrize(
    "value, error",
    [
        ("'high'", "TypeError: knob_trial.report_final: a metric is a number or a dict"),
        ("True", "TypeError: knob_trial.report_final: a metric is a number or a dict"),
        ("{'default': 'high', 'loss': 1}", "ValueError: knob_trial.report_final: a dict metric's 'default'"),
        ("{'default': None}", "ValueError: knob_trial.report_final: a dict metric's 'default'"),
        ("[0.5]", "TypeError: knob_trial.report_final: a metric is a number or a dict"),
        # knob would skip the line (training-services' MAX_METRIC_BYTES), losing the final.
        (
            "{'default': 1, 'blob': 'x' * (1 << 20)}",
            "ValueError: knob_trial.report_final: the metric line is 1048610 bytes, over knob's limit",
        ),
    ],
)
def test_a_bad_metric_is_refused_and_nothing_is_sent(
    tmp_path: Path, knob_trial_dir: Path, value: str, error: str
) -> None:
    env = trial_env(tmp_path / "t", {})
    result = run_python(f"import knob_trial as k; k.report_final({value})", env, [knob_trial_dir])
    assert result.returncode == 1
    assert error in result.stderr
    assert metric_lines(tmp_path / "t") == []


# What numpy's scalars and one-element arrays (and torch's tensors) have: `item()`, which gives
# the Python number; several elements make it raise ValueError, as numpy's does.
ITEM_CLASS = """
class Scalar:
    def __init__(self, *values):
        self.values = values
    def item(self):
        if len(self.values) != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.values[0]
    def __repr__(self):
        return f"Scalar{self.values}"
"""


def test_an_int_too_large_for_a_float_is_refused_in_the_trial(tmp_path: Path, knob_trial_dir: Path) -> None:
    """knob reads every number of a metric as a 64-bit float: `nni.report_final_result(10**400)`
    was sent, and knob then found the final unreadable ("number out of range")."""
    env = trial_env(tmp_path / "t", {})
    too_large = "an int of 1329 bits, too large for the 64-bit float knob reads it as"
    for call, error in [
        ("k.report_final(10**400)", f"ValueError: knob_trial.report_final: the metric is {too_large}"),
        ("k.report_intermediate(-10**400)", f"ValueError: knob_trial.report_intermediate: the metric is {too_large}"),
        (
            "k.report_final({'default': 1, 'count': 10**400})",
            f"ValueError: knob_trial.report_final: the metric's entry 'count' is {too_large}",
        ),
        (
            "k.report_final({'default': 1, 'curve': [1, {'x': 10**400}]})",
            f"ValueError: knob_trial.report_final: the metric's entry 'curve'[1]['x'] is {too_large}",
        ),
        ("import nni; nni.report_final_result(10**400)", f"ValueError: knob_trial.report_final: the metric is {too_large}"),
    ]:
        result = run_python(f"import knob_trial as k; {call}", env, [knob_trial_dir, SHIM.parent])
        assert result.returncode == 1 and error in result.stderr, (call, result.stderr)
    assert metric_lines(tmp_path / "t") == []
    # As large as a float holds is a number like any other.
    result = run_python(
        "import knob_trial as k; k.report_final({'default': 10**308, 'n': -10**308})",
        env,
        [knob_trial_dir],
    )
    assert result.returncode == 0, result.stderr
    assert metric_lines(tmp_path / "t") == [f'KNOB_FINAL {{"default":{10**308},"n":{-10**308}}}']


def test_numpy_scalars_are_reported_as_their_numbers(tmp_path: Path, knob_trial_dir: Path) -> None:
    """nni takes `np.float32(0.9)` (its json_tricks writes item()); so does knob_trial, and the
    nni shim with it: an `import nni` script reporting one failed with a TypeError."""
    env = trial_env(tmp_path / "t", {})
    result = run_python(
        ITEM_CLASS + "import nni\n"
        "nni.report_intermediate_result(Scalar(0.5))\n"
        "nni.report_intermediate_result({'default': Scalar(2), 'loss': Scalar(0.25)})\n"
        "nni.report_final_result(Scalar(0.9))\n",
        env,
        [knob_trial_dir, SHIM.parent],
    )
    assert result.returncode == 0, result.stderr
    assert metric_lines(tmp_path / "t") == [
        "KNOB_INTERMEDIATE 0.5",
        'KNOB_INTERMEDIATE {"default":2,"loss":0.25}',
        "KNOB_FINAL 0.9",
    ]
    # A bool, or an array of several values, is no metric.
    for value, error in [
        ("Scalar(True)", "TypeError: knob_trial.report_final: a metric is a number or a dict"),
        ("Scalar(1, 2)", "TypeError: knob_trial.report_final: a metric is a number or a dict"),
        ("{'default': 1, 'curve': Scalar(1, 2)}", "TypeError: knob_trial.report_final: Scalar Scalar(1, 2) is not JSON"),
    ]:
        result = run_python(ITEM_CLASS + f"import knob_trial as k; k.report_final({value})", env, [knob_trial_dir])
        assert result.returncode == 1 and error in result.stderr, (value, result.stderr)
    assert len(metric_lines(tmp_path / "t")) == 3


class _Scalar:
    """What a type checker sees of a numpy scalar or a one-element array or tensor: `item()`."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


def test_the_reports_type_hints_take_what_the_reports_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reports were typed `float | dict[str, object]`: `report_intermediate(np.float32(0.9))`,
    which the README says they take, failed `mypy --strict`, and so did a `dict[str, float]`
    (H1 F5). CI's `mypy --strict` over this file checks these calls; a string is still refused
    (an unused `type: ignore` is an error there)."""
    metrics = tmp_path / "metrics.knob"
    monkeypatch.setenv("KNOB_METRICS_FILE", str(metrics))
    knob_trial.report_intermediate(_Scalar(0.5))
    losses: dict[str, float] = {"default": 0.25, "loss": 1.5}
    knob_trial.report_intermediate(losses)
    knob_trial.report_final({"default": _Scalar(0.75), "epochs": 3})
    with pytest.raises(TypeError):
        knob_trial.report_final("0.5")  # type: ignore[arg-type]
    assert metrics.read_text().splitlines() == [
        "KNOB_INTERMEDIATE 0.5",
        'KNOB_INTERMEDIATE {"default":0.25,"loss":1.5}',
        'KNOB_FINAL {"default":0.75,"epochs":3}',
    ]


# numpy's arrays and torch's tensors of several elements: `item()` fails (numpy: ValueError,
# torch: RuntimeError) and `tolist()` gives their (nested) list.
ARRAY_CLASSES = ITEM_CLASS + """
class Array(Scalar):
    def tolist(self):
        return [v.tolist() if isinstance(v, Array) else v for v in self.values]
class Tensor(Array):
    def item(self):
        if len(self.values) != 1:
            raise RuntimeError("a Tensor with 2 elements cannot be converted to Scalar")
        return self.values[0]
    def __repr__(self):
        return f"Tensor{self.values}"
"""


def test_the_shim_takes_every_metric_nni_takes(tmp_path: Path, knob_trial_dir: Path) -> None:
    """nni's reports take any value (json_tricks writes numpy arrays, nni 3.0 pickles the rest),
    and knob reads a string metric's JSON ("0.5" is 0.5): the shim raised TypeError for a dict
    holding an array and for a string, and an unchanged nni script lost its result (H1 F2).
    What knob can read is sent as such; the rest as JSON, for knob to judge as nni's."""
    env = dict(trial_env(tmp_path / "t", {}), KNOB_NNI_SHIM="1")
    result = run_python(
        ARRAY_CLASSES + "import decimal, nni\n"
        "assert nni.__knob_shim__\n"
        "nni.report_intermediate_result({'default': Scalar(0.5), 'per_class': Array(0.4, 0.6),"
        " 'grid': Array(Array(1, 2), Array(3, 4)), 'loss': Tensor(1.5, 2.5), 'pair': (1, 2),"
        " Scalar(7): decimal.Decimal('0.5'), 'tags': {'a'}, 'flag': Scalar(True)})\n"
        "nni.report_intermediate_result('0.25')\n"
        "nni.report_intermediate_result(' -Infinity ')\n"
        "nni.report_intermediate_result(Array(1, 2))\n"
        "nni.report_final_result('0.5')\n"
        "nni.report_final_result('{\"default\": 0.75, \"per_class\": [0.5, 1]}')\n"
        "nni.report_final_result('nan')\n"
        "nni.report_final_result('high')\n"
        "nni.report_final_result({'default': 'high'})\n"
        "nni.report_final_result(True)\n",
        env,
        [knob_trial_dir, SHIM.parent],
    )
    assert result.returncode == 0, result.stderr
    assert metric_lines(tmp_path / "t") == [
        'KNOB_INTERMEDIATE {"default":0.5,"per_class":[0.4,0.6],"grid":[[1,2],[3,4]],"loss":[1.5,2.5],'
        '"pair":[1,2],"7":0.5,"tags":["a"],"flag":true}',
        "KNOB_INTERMEDIATE 0.25",
        "KNOB_INTERMEDIATE -Infinity",
        "KNOB_INTERMEDIATE [1,2]",
        "KNOB_FINAL 0.5",
        'KNOB_FINAL {"default":0.75,"per_class":[0.5,1]}',
        "KNOB_FINAL NaN",
        'KNOB_FINAL "high"',
        'KNOB_FINAL {"default":"high"}',
        "KNOB_FINAL true",
    ]
    # knob_trial's own reports still refuse what is not a metric; a tensor of several values
    # is named as numpy's array is (it raised torch's RuntimeError from item()).
    for value, error in [
        ("'0.5'", "TypeError: knob_trial.report_final: a metric is a number or a dict"),
        ("{'default': 1, 'curve': Tensor(1, 2)}", "TypeError: knob_trial.report_final: Tensor Tensor(1, 2) is not JSON"),
    ]:
        result = run_python(ARRAY_CLASSES + f"import knob_trial as k; k.report_final({value})", env, [knob_trial_dir])
        assert result.returncode == 1 and error in result.stderr, (value, result.stderr)
    assert len(metric_lines(tmp_path / "t")) == 10


def test_a_metric_line_of_exactly_the_limit_is_sent(tmp_path: Path, knob_trial_dir: Path) -> None:
    env = trial_env(tmp_path / "t", {})
    # "KNOB_FINAL " and '{"default":1,"blob":""}' around the blob: 11 + 23 bytes.
    blob = (1 << 20) - 34
    result = run_python(
        f"import knob_trial as k; k.report_final({{'default': 1, 'blob': 'x' * {blob}}})",
        env,
        [knob_trial_dir],
    )
    assert result.returncode == 0, result.stderr
    assert [len(line) for line in metric_lines(tmp_path / "t")] == [1 << 20]


def test_checkpoint_dir_is_created(tmp_path: Path, knob_trial_dir: Path) -> None:
    env = trial_env(tmp_path / "t", {})
    result = run_python("import knob_trial as k; print(k.checkpoint_dir())", env, [knob_trial_dir])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / 't' / 'checkpoint'}\n"
    assert (tmp_path / "t" / "checkpoint").is_dir()


def test_outside_a_trial_it_warns_once_and_prints(tmp_path: Path, knob_trial_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KNOB_", "NNI_"))}
    result = run_python(
        "import knob_trial as k\n"
        "print(k.get_parameters())\n"
        "k.report_intermediate(1)\n"
        "k.report_final(2.5)\n",
        env,
        [knob_trial_dir],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "{}\nKNOB_INTERMEDIATE 1\nKNOB_FINAL 2.5\n"
    assert result.stderr.count("not running as a knob trial") == 1


def shim_folder(tmp_path: Path, knob_trial_dir: Path) -> Path:
    """The folder knob's runner writes for an experiment's trials (trial_python.rs): nni.py and
    knob_trial.py."""
    folder = tmp_path / ".knob-python"
    folder.mkdir()
    (folder / "nni.py").write_text(SHIM.read_text())
    (folder / "knob_trial.py").write_text((knob_trial_dir / "knob_trial" / "__init__.py").read_text())
    return folder


NNI_SCRIPT = (
    "import nni\n"
    "p = nni.get_next_parameter()\n"
    "for epoch in range(3):\n"
    "    nni.report_intermediate_result(p['lr'] * epoch)\n"
    "nni.report_final_result({'default': 0.9, 'loss': 0.1})\n"
    "print(nni.__version__, nni.get_trial_id(), nni.get_experiment_id(), nni.get_sequence_id())\n"
)


def test_the_shim_runs_an_nni_script_without_nni(tmp_path: Path, knob_trial_dir: Path) -> None:
    folder = shim_folder(tmp_path, knob_trial_dir)
    env = trial_env(tmp_path / "t", {"lr": 0.5})
    result = run_python(NNI_SCRIPT, env, [folder])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "knob-shim abcde exp1 7\n"
    assert metric_lines(tmp_path / "t") == [
        "KNOB_INTERMEDIATE 0.0",
        "KNOB_INTERMEDIATE 0.5",
        "KNOB_INTERMEDIATE 1.0",
        'KNOB_FINAL {"default":0.9,"loss":0.1}',
    ]


def fake_nni(tmp_path: Path) -> Path:
    """An installed `nni` package (a stand-in with its own version) in a folder of its own."""
    site = tmp_path / "site"
    (site / "nni").mkdir(parents=True)
    (site / "nni" / "__init__.py").write_text("__version__ = 'installed'\nfrom . import sub\n")
    (site / "nni" / "sub.py").write_text("")
    return site


def test_an_installed_nni_is_used_in_the_shims_place(tmp_path: Path, knob_trial_dir: Path) -> None:
    folder = shim_folder(tmp_path, knob_trial_dir)
    env = trial_env(tmp_path / "t", {})
    code = "import nni, sys; print(nni.__version__, sys.modules['nni'] is nni, nni.sub.__name__)"
    result = run_python(code, env, [folder, fake_nni(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "installed True nni.sub\n"


def test_nni_shim_1_replaces_an_installed_nni(tmp_path: Path, knob_trial_dir: Path) -> None:
    folder = shim_folder(tmp_path, knob_trial_dir)
    env = dict(trial_env(tmp_path / "t", {}), KNOB_NNI_SHIM="1")
    result = run_python("import nni; print(nni.__version__)", env, [folder, fake_nni(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "knob-shim\n"


@pytest.mark.parametrize(
    "text",
    [
        '{"lr": 0.01, "layers": 3, "name": "a\\"b\\u00e9\\n", "on": true, "off": false, "none": null}',
        ' \n{"nested": {"_name": "conv", "k": [1, 2.5e-3, -7, {"x": []}]}}\t',
        '{"big": 12345678901234567890, "tiny": 1e-300, "neg": -0.0}',
        '{"emoji": "\\ud83d\\ude00", "raw": "ü"}',
        "{}",
    ],
)
def test_parameters_are_read_as_json_reads_them(tmp_path: Path, knob_trial_dir: Path, text: str) -> None:
    env = dict(trial_env(tmp_path / "t", {}), KNOB_PARAMETERS=text)
    result = run_python(
        "import json, os, sys, knob_trial\n"
        "got = knob_trial.get_parameters()\n"
        "assert got == json.loads(os.environ['KNOB_PARAMETERS']), got\n"
        "assert 'json' not in sys.modules or 're' in sys.modules\n"
        "print('ok')\n",
        env,
        [knob_trial_dir],
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("text", ['{"a": 1', '{"a": 1} x', "[1, 2]", ""])
def test_unreadable_parameters_fail_with_json_s_error(
    tmp_path: Path, knob_trial_dir: Path, text: str
) -> None:
    env = dict(trial_env(tmp_path / "t", {}), KNOB_PARAMETERS=text)
    result = run_python("import knob_trial; knob_trial.get_parameters()", env, [knob_trial_dir])
    assert result.returncode == 1
    assert "JSONDecodeError" in result.stderr or "not a JSON object" in result.stderr


def test_the_first_report_imports_neither_json_nor_re(tmp_path: Path, knob_trial_dir: Path) -> None:
    env = trial_env(tmp_path / "t", {"lr": 0.1})
    result = run_python(
        "import sys\n"
        "before = set(sys.modules)\n"
        "import knob_trial\n"
        "knob_trial.get_parameters(); knob_trial.report_intermediate(1); knob_trial.report_final(0.5)\n"
        "print(sorted({'json', 're'} & (set(sys.modules) - before)))\n",
        env,
        [knob_trial_dir],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def test_the_shim_has_nni_utils_merge_parameter(tmp_path: Path, knob_trial_dir: Path) -> None:
    """`from nni.utils import merge_parameter`, as many nni trial scripts start: it failed
    without nni installed ("'nni' is not a package")."""
    env = trial_env(tmp_path / "t", {"lr": 0.1, "epochs": 3})
    result = run_python(
        "import argparse\n"
        "from nni.utils import merge_parameter\n"
        "import nni, nni.utils\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--lr', type=float, default=0.01)\n"
        "parser.add_argument('--epochs', type=int, default=10)\n"
        "parser.add_argument('--name', default=None)\n"
        "args = merge_parameter(parser.parse_args([]), nni.get_next_parameter())\n"
        "print(args.lr, args.epochs)\n"
        "print(nni.utils.merge_parameter({'lr': 1.0}, {'lr': 2}))\n"
        "print(merge_parameter(args, None) is args)\n"
        "for bad in ({'momentum': 0.9}, {'epochs': 'ten'}):\n"
        "    try:\n"
        "        merge_parameter(args, bad)\n"
        "    except ValueError as e:\n"
        "        print(e)\n",
        env,
        [knob_trial_dir, SHIM.parent],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "0.1 3",
        "{'lr': 2.0}",
        "True",
        "Key 'momentum' not found in base parameters.",
        'Expected "epochs" in override parameters to have type int, but found str',
    ]


def test_the_shim_has_nni_s_trial_api(tmp_path: Path, knob_trial_dir: Path) -> None:
    """Every name of nni's trial API (`nni.trial.__all__`), with nni's answers: a script calling
    `nni.get_next_parameters()` (nni's other name for `get_next_parameter`) failed with an
    AttributeError without nni installed or with `nniShim: true`."""
    env = trial_env(tmp_path / "t", {"lr": 0.1})
    result = run_python(
        "import nni\n"
        "from nni.trial import get_next_parameters, get_sequence_id\n"
        "import nni.trial\n"
        "print(nni.get_current_parameter(), nni.get_current_parameter('lr'))\n"
        "print(get_next_parameters(), nni.get_current_parameter('lr'), nni.get_current_parameter())\n"
        "print(all(getattr(nni, n) is getattr(nni.trial, n) for n in nni.trial.__all__), get_sequence_id())\n"
        "print(' '.join(nni.trial.__all__))\n",
        env,
        [knob_trial_dir, SHIM.parent],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "None None",
        "{'lr': 0.1} 0.1 {'lr': 0.1}",
        "True 7",
        " ".join(SHIM_TRIAL_API),
    ]
    # Outside a trial, as nni: "STANDALONE" ids and sequence 0.
    outside = {k: v for k, v in os.environ.items() if not k.startswith(("KNOB_", "NNI_"))}
    result = run_python(
        "import nni; print(nni.get_trial_id(), nni.get_experiment_id(), nni.get_sequence_id())",
        dict(outside, NNI_EXP_ID=""),
        [knob_trial_dir, SHIM.parent],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "STANDALONE STANDALONE 0\n"


# nni.trial.__all__ of nni 2.10 and 3.0; the test below holds it to an installed nni's.
SHIM_TRIAL_API = [
    "get_next_parameter",
    "get_next_parameters",
    "get_current_parameter",
    "report_intermediate_result",
    "report_final_result",
    "get_experiment_id",
    "get_trial_id",
    "get_sequence_id",
]


@pytest.mark.parametrize("variable", ["KNOB_TEST_NNI3_PYTHON", "KNOB_TEST_NNI2_PYTHON"])
def test_the_shim_s_trial_api_is_real_nni_s(variable: str) -> None:
    python = os.environ.get(variable)
    if not python:
        if os.environ.get("KNOB_TEST_REQUIRE_ALL") == "1":
            pytest.fail(f"{variable} is not set (a Python with nni installed)")
        pytest.skip(f"skipped: {variable} is not set (a Python with nni installed)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KNOB_", "NNI_"))}
    result = subprocess.run(
        [python, "-c", "import json, nni.trial; print(json.dumps(nni.trial.__all__))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(result.stdout)) == sorted(SHIM_TRIAL_API)
