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
from pathlib import Path

import numpy as np
import pytest
from subprocess_checks import run_cases

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


def edit_config(base: Path, name: str, case: str, edit) -> Path:
    """A copy of ``case`` whose config.json is ``edit(config text as a dict)`` (a dict), or
    ``edit``'s text when it returns a string."""
    folder = copy_model(base, name, case)
    config = edit(json.loads((folder / "config.json").read_text()))
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text)
    return folder


def rope(**changes):
    return lambda c: c | {"rope_parameters": c["rope_parameters"] | changes}


def low_freq_factor(base: Path) -> Path:
    return edit_config(base, "low_freq_factor", "llama_rope_llama3", rope(low_freq_factor=[1.0]))


def mscale(base: Path) -> Path:
    return edit_config(base, "mscale", "llama_rope_yarn", rope(mscale=[1], mscale_all_dim=1))


def softmax_scale(base: Path) -> Path:
    def edit(c):
        return c | {"attn_config": c["attn_config"] | {"softmax_scale": "0.35"}}

    return edit_config(base, "softmax_scale", "mpt", edit)


def deep(base: Path) -> Path:
    """A field nested 100,000 levels deep."""
    nested = '{"a": ' * 100_000 + "1" + "}" * 100_000

    return edit_config(base, "deep", "gpt2", lambda c: json.dumps(c)[:-1] + f', "x": {nested}}}')


def theta_infinity(base: Path) -> Path:
    """``rope_theta: Infinity`` (Python's json reads it; JSON does not allow it)."""
    return edit_config(
        base, "theta_infinity", "llama", lambda c: json.dumps(rope(rope_theta=1e999)(c))
    )


def theta_overflow(base: Path) -> Path:
    """``rope_theta: 1e999``: valid JSON that reads as inf."""

    def text(c):
        return json.dumps(rope(rope_theta=12345.0)(c)).replace("12345.0", "1e999")

    return edit_config(base, "theta_overflow", "llama", text)


def edit_header(base: Path, name: str, edit) -> Path:
    """A gpt2 copy whose safetensors header is ``edit(header)`` (the data bytes kept)."""
    folder = copy_model(base, name)
    raw = (folder / "model.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.dumps(edit(json.loads(raw[8 : 8 + size]))).encode()
    (folder / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + raw[8 + size :]
    )
    return folder


def entry(tensor: str, **changes):
    return lambda h: h | {tensor: h[tensor] | changes}


WTE, LN_W, LN_B = (f"transformer.{n}" for n in ("wte.weight", "h.0.ln_1.weight", "h.0.ln_1.bias"))


def header_list(base: Path) -> Path:
    return edit_header(base, "header_list", lambda h: list(h.items()))


def header_number(base: Path) -> Path:
    return edit_header(base, "header_number", lambda h: h | {WTE: 5})


def bad_offsets(base: Path) -> Path:
    return edit_header(base, "bad_offsets", entry(WTE, data_offsets="0-38400"))


def negative_dim(base: Path) -> Path:
    return edit_header(base, "negative_dim", entry(WTE, shape=[-300, 32]))


def float_dim(base: Path) -> Path:
    return edit_header(base, "float_dim", entry(WTE, shape=[300.0, 32]))


def shared_bytes(base: Path) -> Path:
    """Two tensors of one shape pointing at the same bytes."""
    return edit_header(base, "shared_bytes", lambda h: entry(LN_B, **h[LN_W])(h))


# study preset -> (its broken models, the exit status, the line each model's cell fails with)
STUDIES = {
    "no_results": (
        (inf_weight, overflow),
        1,
        {
            "inf_weight": r"inf_weight/model\.safetensors: tensor "
            r"'transformer\.h\.0\.mlp\.c_fc\.weight' \(32, 64\) holds 1 non-finite value\(s\), "
            r"the first inf at index \(1, 2\)",
            "overflow": r"CellRowsError: bits_per_byte of 'overflow' at length 16 "
            r"\(nonoverlapping\) is nan: the model gave non-finite numbers",
        },
    ),
    # the tokenizer is read by the pre-flight (it tokenizes the text to score): refused before
    # any cell runs
    "big_tokenizer": (
        (big_tokenizer,),
        2,
        r"the tokenizer \(.*big_tokenizer/tokenizer\.json\) has token ids "
        r"up to 301 \(e\.g\. 'zz' = 300\) but the model's embedding has 300 rows",
    ),
    "no_tokenizer": (
        (no_tokenizer,),
        2,
        r"no_tokenizer: no tokenizer\.json \(or vocab\.json \+ merges\.txt\); "
        r"save the model's tokenizer into it too",
    ),
    # safetensors headers of the wrong shape: each cell fails naming the file
    "headers": (
        (header_list, header_number, bad_offsets, negative_dim, float_dim, shared_bytes),
        1,
        {
            "header_list": r"header_list/model\.safetensors: not a safetensors file \(its header "
            r"is a JSON list, not an object\)$",
            "header_number": r"header_number/model\.safetensors: tensor 'transformer\.wte\.weight' "
            r"is described by a JSON int, not an object$",
            "bad_offsets": r"bad_offsets/model\.safetensors: tensor 'transformer\.wte\.weight' has "
            r"data_offsets '0-38400'; they are two ints \[begin, end\], begin <= end$",
            "negative_dim": r"negative_dim/model\.safetensors: tensor 'transformer\.wte\.weight' "
            r"has shape \[-300, 32\]; a shape is a list of non-negative ints$",
            "float_dim": r"float_dim/model\.safetensors: tensor 'transformer\.wte\.weight' has "
            r"shape \[300\.0, 32\]; a shape is a list of non-negative ints$",
            "shared_bytes": r"shared_bytes/model\.safetensors: tensors "
            r"'transformer\.h\.0\.ln_1\.bias' and 'transformer\.h\.0\.ln_1\.weight' share bytes",
        },
    ),
    # config.json values of the wrong JSON type, too deep, not finite: refused before any cell
    "low_freq_factor": (
        (low_freq_factor,),
        2,
        r"llama .*/low_freq_factor/config\.json: rope_parameters\.low_freq_factor=\[1\.0\]: "
        r"must be a finite number$",
    ),
    "mscale": (
        (mscale,),
        2,
        r"llama .*/mscale/config\.json: rope_parameters\.mscale=\[1\]: must be a finite number$",
    ),
    "softmax_scale": (
        (softmax_scale,),
        2,
        r"mpt config\.json: softmax_scale='0\.35' must be a finite number or null$",
    ),
    "deep": (
        (deep,),
        2,
        r"deep/config\.json: not a usable JSON file \(nested deeper than 32 levels\)$",
    ),
    "theta_infinity": (
        (theta_infinity,),
        2,
        r"theta_infinity/config\.json: not a readable JSON file \(it holds Infinity, which JSON "
        r"does not allow",
    ),
    "theta_overflow": (
        (theta_overflow,),
        2,
        r"llama .*/theta_overflow/config\.json: rope_theta=inf: must be a finite number > 1$",
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
    results = run_cases("scripts/run_study.py", cases)
    return dict(zip(STUDIES, results, strict=True))


@pytest.mark.parametrize("preset", list(STUDIES))
def test_a_study_never_exits_0_without_its_results(outcomes, preset):
    """Each broken model is a FAILED cell with one line naming why and the study exits 1, or,
    when its config.json is refused before any cell runs, one ``error:`` line and exit 2:
    never "0 cells done" with status 0, never a traceback."""
    _, status, failures = STUDIES[preset]
    out = outcomes[preset]
    assert out["rc"] == status, out["output"][-3000:]
    assert "Traceback" not in out["output"], out["output"][-3000:]
    if status == 2:  # refused before any cell ran: one line, nothing written
        lines = [line for line in out["output"].splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), out["output"][-3000:]
        assert re.search(failures, lines[0]), lines[0]
        return
    failed = {
        line.split(":", 1)[0].removeprefix("FAILED ").removesuffix("-seed0"): line
        for line in out["output"].splitlines()
        if line.startswith("FAILED ")
    }
    assert set(failed) == set(failures), out["output"][-3000:]
    for name, pattern in failures.items():
        assert re.search(pattern, failed[name]), failed[name]
