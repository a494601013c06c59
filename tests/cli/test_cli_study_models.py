"""``flaxformer-lite study --model=...``: your own pretrained models from the command line.

The cases run ``scripts/run_study.py`` as a user would, in one helper process that imports the
command once and forks a child per case (`subprocess_checks.HARNESS`), offline
(``HF_HUB_OFFLINE=1``) with an empty Hugging Face cache."""

from __future__ import annotations

import json
from pathlib import Path

from subprocess_checks import env, run_cases

ROOT = Path(__file__).resolve().parents[2]
GPT2 = "tests/pretrained/hf_models/gpt2"
BLOOM = "tests/pretrained/hf_models/bloom"
# the tiny pretrained study, small: one length, the tokens within the first 2,048 bytes
SMALL_EVAL = (
    "--config.eval.length_multiples=(1,)",
    "--config.eval.max_bytes=2048",
    "--config.eval.protocols=('nonoverlapping',)",
    "--config.eval.rope_scalings=()",
    "--progress=false",
)


def _run_cases(tmp_path: Path, cases: list[list[str]]) -> list[dict]:
    offline = env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
    return run_cases("scripts/run_study.py", cases, environment=offline)


def test_study_models_from_the_command_line(tmp_path):
    mine, refused = tmp_path / "mine", tmp_path / "refused"
    tiny = ["--config=pretrained:tiny"]
    ran, training, offline, source, no_length = _run_cases(
        tmp_path,
        [
            [*tiny, f"--model={GPT2}", f"--workdir={mine}", *SMALL_EVAL],
            ["--config=extrapolation_lm:tiny", f"--model={GPT2}", f"--workdir={refused}"],
            [
                "--config=pretrained:small",
                "--model=openai-community/gpt2",
                "--model=EleutherAI/pythia-160m:2048",
                f"--workdir={refused}",
            ],
            [*tiny, f"--config.pretrained.source={GPT2}", f"--workdir={refused}"],
            [*tiny, f"--model={BLOOM}", f"--workdir={refused}"],
        ],
    )

    # the study ran only the given model, named by its folder, at the context its config.json
    # states (GPT-2's n_positions = 64), and compared it with itself (the preset's paired
    # reference is not among the given models)
    assert ran["rc"] == 0, ran["output"][-3000:]
    rows = [json.loads(x) for x in (mine / "results.jsonl").read_text().splitlines()]
    bpb = [r for r in rows if r["metric"] == "bits_per_byte"]
    assert {(r["encoding"], r["eval_length"], r["run"]) for r in bpb} == {
        ("gpt2", 64, "gpt2-seed0")
    }
    assert 0 < bpb[0]["value"] < 12  # random weights: about log2(300) = 8.2 bits per token
    assert bpb[0]["pretrained"]["family"] == "gpt2"
    assert json.loads(Path(ROOT / GPT2 / "config.json").read_text())["n_positions"] == 64
    assert sorted(p.name for p in (mine / "runs").iterdir()) == ["gpt2-seed0"]

    # a training preset: one line naming what to use instead, nothing written
    assert training["rc"] == 2
    assert training["output"].strip().splitlines() == [
        f"error: --model={GPT2}: applies to a study of pretrained models "
        "(--config=pretrained:PRESET); a training study's models are its encodings: select "
        "them with --only=ENCODING or --config.sweep.encodings"
    ]
    assert not refused.exists()

    # offline: every missing hub model, each with the command that fetches it and the flag
    # that takes the result (a model given with its length is checked too)
    assert offline["rc"] == 2
    (line,) = offline["output"].strip().splitlines()
    assert line.startswith("error: 2 hub model(s) are not in the local Hugging Face cache")
    for repo, folder in (
        ("openai-community/gpt2", "gpt2"),
        ("EleutherAI/pythia-160m", "pythia-160m"),
    ):
        assert (
            f"{repo}: `hf download {repo} --include '*.json' '*.safetensors' 'tokenizer*' "
            f"'vocab.json' 'merges.txt' --local-dir models/{folder}`, then --model=models/{folder}"
        ) in line

    # --config.pretrained.source on a pretrained study: refused with a hint naming --model
    assert source["rc"] == 2
    (line,) = source["output"].strip().splitlines()
    assert line.startswith(f"error: --config.pretrained.source={GPT2}: set for every model")
    assert "--model=DIR_OR_HUB_ID_OR_GGUF" in line and "--only" not in line

    # a config that states no context (BLOOM: ALiBi): refused, naming the flag that gives it
    assert no_length["rc"] == 2
    assert (
        no_length["output"].strip().splitlines()[-1].endswith(f"give it as --model={BLOOM}:LENGTH")
    )
