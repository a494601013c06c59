"""The same parity, live: transformers (PyTorch) and this library on the same folder.

Runs only where ``torch`` and ``transformers`` are importable (the default test environment
has neither; ``pip install torch==2.13.0 transformers`` adds them). It recomputes what
``scripts/make_hf_goldens.py`` froze, with whatever transformers is installed, on fresh
random token ids, so a change in transformers' modeling code shows here first.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.pretrained import load_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODELS = Path(__file__).parent / "hf_models"
CASES = sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file())


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_transformers_live(case):
    folder = MODELS / case
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    ).eval()
    ids = np.random.default_rng(0).integers(0, hf.config.vocab_size, size=(2, 37))
    with torch.no_grad():
        want = hf(torch.as_tensor(ids)).logits.numpy()
    got = np.asarray(load_pretrained(folder, tokenizer=False).model(jnp.asarray(ids, jnp.int32)))
    err = np.abs(got - want).max()
    assert err < 1e-4, f"{case}: max |logit - transformers| = {err:.2e}"
