"""Model folders as untrusted input, through ``flaxformer-lite study`` as a user meets them.

Each case copies a committed tiny model (tests/pretrained/hf_models/) and damages it the way a
careless or hostile folder would. A study never exits 0 without the results it was asked for:
a folder that loads but gives no finite scores, or that cannot be loaded, is a FAILED cell with
one line saying why (the file, tensor, length or value), and the study exits non-zero. One
helper process imports the command once and forks a child per study
(`subprocess_checks.HARNESS`); each study is one config preset of a config file written here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from subprocess_checks import HARNESS, env

from flaxformer_lite.pretrained.files import CheckpointFiles

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "pretrained" / "hf_models"

CONFIG_FILE = """
import json, pathlib
from flaxformer_lite.configs import pretrained
MODELS = json.loads((pathlib.Path(__file__).parent / "models.json").read_text())
PRESETS = tuple(MODELS)

def get_config(preset):
    c = pretrained.get_config("tiny")
    c.preset = preset
    c.sweep.models = tuple(dict(name=n, source=s, train_length=16) for n, s in MODELS[preset])
    c.eval.update(length_multiples=(1, 2), max_bytes=512, protocols=("nonoverlapping",),
                  rope_scalings=(), paired_reference=MODELS[preset][0][0])
    return c
"""


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """``tensors`` (float32) as a safetensors file (8-byte header size, JSON header, bytes)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape)}
        header[name]["data_offsets"] = [offset, offset + len(data)]
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


def copy_model(base: Path, name: str, case: str = "gpt2") -> Path:
    folder = base / name
    shutil.copytree(MODELS / case, folder)
    return folder


def edit_weights(folder: Path, edit) -> None:
    """Rewrite ``folder``'s weights with ``edit(tensors)`` applied (name -> array)."""
    files = CheckpointFiles(folder)
    tensors = {k: np.array(files.get(k)) for k in files.names()}
    edit(tensors)
    write_safetensors(folder / "model.safetensors", tensors)


def inf_weight(base: Path) -> Path:
    """One weight set to inf (``h.0.mlp.c_fc.weight[1, 2]``)."""
    folder = copy_model(base, "inf_weight")
    edit_weights(folder, lambda t: t["transformer.h.0.mlp.c_fc.weight"].__setitem__((1, 2), np.inf))
    return folder


def big_tokenizer(base: Path) -> Path:
    """A tokenizer with a token past the model's 300-row embedding."""
    folder = copy_model(base, "big_tokenizer")
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["zz"] = 300
    tokenizer["model"]["vocab"]["zzz"] = 301
    tokenizer["model"]["merges"] = [*tokenizer["model"]["merges"], ["z", "z"], ["zz", "z"]]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def overflow(base: Path) -> Path:
    """Finite weights whose logits overflow: every score is NaN."""
    folder = copy_model(base, "overflow")
    edit_weights(folder, lambda t: t["transformer.ln_f.weight"].__setitem__(..., 3e38))
    return folder


def no_tokenizer(base: Path) -> Path:
    """Weights and config only, as a model's ``save_pretrained`` alone writes them."""
    folder = copy_model(base, "no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    return folder


# study preset -> (its broken models, the exit status, the line each model's cell fails with)
STUDIES = {
    "no_results": (
        (inf_weight, big_tokenizer, overflow, no_tokenizer),
        1,
        {
            "inf_weight": r"inf_weight/model\.safetensors: tensor "
            r"'transformer\.h\.0\.mlp\.c_fc\.weight' \(32, 64\) holds 1 non-finite value\(s\), "
            r"the first inf at index \(1, 2\)",
            "big_tokenizer": r"the tokenizer \(.*big_tokenizer/tokenizer\.json\) has token ids "
            r"up to 301 \(e\.g\. 'zz' = 300\) but the model's embedding has 300 rows",
            "overflow": r"CellRowsError: bits_per_byte of 'overflow' at length 16 "
            r"\(nonoverlapping\) is nan: the model gave non-finite numbers",
            "no_tokenizer": r"no_tokenizer: no tokenizer\.json \(or vocab\.json \+ merges\.txt\); "
            r"save the model's tokenizer into it too",
        },
    ),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict]:
    """Every study of `STUDIES` run once: ``{preset: {"rc", "output"}}``."""
    base = tmp_path_factory.mktemp("hostile")
    models = {
        preset: [[make.__name__, str(make(base))] for make in makers]
        for preset, (makers, _, _) in STUDIES.items()
    }
    (base / "models.json").write_text(json.dumps(models))
    (base / "hostile.py").write_text(CONFIG_FILE)
    cases = [
        [f"--config={base / 'hostile.py'}:{preset}", f"--workdir={base / preset}", "--progress=0"]
        for preset in STUDIES
    ]
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS, "scripts/run_study.py", json.dumps(cases)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "RESULTS" in proc.stdout, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULTS", 1)[1])
    return dict(zip(STUDIES, results, strict=True))


@pytest.mark.parametrize("preset", list(STUDIES))
def test_a_study_never_exits_0_without_its_results(outcomes, preset):
    """Each broken model is a FAILED cell with one line naming why; the study exits 1 (2
    when the config is refused before any cell runs) and never says "0 cells done" with 0."""
    _, status, failures = STUDIES[preset]
    out = outcomes[preset]
    assert out["rc"] == status, out["output"][-3000:]
    assert "Traceback" not in out["output"], out["output"][-3000:]
    failed = {
        line.split(":", 1)[0].removeprefix("FAILED ").removesuffix("-seed0"): line
        for line in out["output"].splitlines()
        if line.startswith("FAILED ")
    }
    assert set(failed) == set(failures), out["output"][-3000:]
    for name, pattern in failures.items():
        assert re.search(pattern, failed[name]), failed[name]
