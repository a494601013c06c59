"""Build tiny random Hugging Face causal LMs and their golden outputs (offline test fixtures).

Writes, under tests/pretrained/hf_models/<case>/, one folder per case in Hugging Face's own on-disk
format (what ``model.save_pretrained(safe_serialization=True)`` and
``PreTrainedTokenizerFast.save_pretrained`` write: config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) plus golden.npz with the outputs of
transformers (PyTorch, eager attention, float32) on fixed inputs, and
tests/pretrained/hf_models/README.md.

Nothing is downloaded: the byte-level BPE tokenizer is trained here on text embedded in this script,
and every model is built from a config with random weights (fixed seeds).

Regenerate (CPU is enough; a few seconds per case) with the Python of a virtual environment with
`pip install torch==2.13.0 transformers tokenizers safetensors` (numpy comes with transformers):

    python scripts/make_hf_goldens.py

Options: ``--cases gpt2,llama`` builds only those cases (the README's table is then rewritten for
the cases present on disk); ``--out DIR`` writes elsewhere.

golden.npz (np.savez_compressed; float32 / int32 only):
    input_ids                [2, T]        two text snippets, tokenized with the tiny tokenizer,
                                           cut to T
    logits                   [2, T, V]     model(input_ids).logits, one full forward pass,
                                           no mask/padding
    prompt_ids               [1, P]        input_ids[:1, :P]
    generated_ids            [1, N]        greedy generate(prompt, max_new_tokens=N,
                                           min_new_tokens=N, do_sample=False, use_cache=True):
                                           the N new tokens only
    generated_logits         [1, N, V]     the raw logits of each cached generation step
                                           (output_logits=True)
    full_logits_of_generated [1, P+N, V]   model(concat(prompt_ids, generated_ids)).logits, one
                                           full pass; full_logits_of_generated[:, P-1+i] is the
                                           full-pass twin of generated_logits[:, i] (they differ
                                           for dynamic NTK and longrope).

Every golden is computed on a freshly loaded copy of the saved folder (dynamic NTK and longrope keep
state in the rotary module between calls, so each pass starts from a newly loaded model), and the
script checks that a second fresh load gives exactly the same logits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

# --------------------------------------------------------------------------------------------------
# Fixed sizes
# --------------------------------------------------------------------------------------------------
VOCAB_SIZE = 300  # 256 bytes + 1 special token + 43 merges
SPECIAL = "<|endoftext|>"  # id 0 (BpeTrainer puts special tokens first); bos = eos = pad
T = 40  # tokens per row of input_ids
P = 8  # prompt tokens
N = 24  # generated tokens; P + N = 32 > 16 = llama's max_position_embeddings
HIDDEN = 32
INTERMEDIATE = 64
LAYERS = 2
INIT_STD = 0.2
SEED = 1234

# Training text for the tokenizer (~4 KB, embedded so that regeneration does not depend on the
# Python version's stdlib). The first part is the Zen of Python (Tim Peters, PEP 20). It has no
# backslashes, so it needs no raw string; a backslash at the end of a line below only continues the
# line in the source (the text keeps its own line breaks, which change the trained tokenizer).
CORPUS = '''
Beautiful is better than ugly.
Explicit is better than implicit.
Simple is better than complex.
Complex is better than complicated.
Flat is better than nested.
Sparse is better than dense.
Readability counts.
Special cases aren't special enough to break the rules.
Although practicality beats purity.
Errors should never pass silently.
Unless explicitly silenced.
In the face of ambiguity, refuse the temptation to guess.
There should be one-- and preferably only one --obvious way to do it.
Although that way may not be obvious at first unless you're Dutch.
Now is better than never.
Although never is often better than *right* now.
If the implementation is hard to explain, it's a bad idea.
If the implementation is easy to explain, it may be a good idea.
Namespaces are one honking great idea -- let's do more of those!

def encode(self, text, add_special_tokens=True):
    """Return the token ids of ``text``."""
    ids = []
    for word in self.pre_tokenize(text):
        for token in self.model.tokenize(word):
            ids.append(self.vocab[token])
    if add_special_tokens:
        ids = [self.bos_token_id] + ids
    return ids

class Attention:
    def __init__(self, num_heads, head_dim, dropout=0.0):
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.dropout = dropout

    def __call__(self, query, key, value, mask=None):
        scores = query @ key.transpose(-1, -2) * self.scale
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        weights = scores.softmax(dim=-1)
        return weights @ value

A language model assigns a probability to every sequence of tokens. The transformer computes, for
each position, a distribution over the next token from the tokens that came before it. Attention \
lets
every position look back at all earlier positions; the feed-forward layers transform each position \
on
its own. Position information enters through learned or sinusoidal embeddings, through rotary
embeddings that turn queries and keys by an angle proportional to their position, or through a bias
on the attention scores that grows with the distance between query and key.

When a model is asked to read sequences longer than those it was trained on, the rotary frequencies
can be rescaled: linear interpolation divides every position by a factor, the dynamic variant grows
the base of the frequencies with the length of the sequence, and other schemes treat the high and \
low
frequencies differently. Each of them changes the numbers that come out of the model, which is why a
loader must read every option of the configuration and not only the shapes of the weights.

The quick brown fox jumps over the lazy dog. The five boxing wizards jump quickly. How vexingly \
quick
daft zebras jump! Pack my box with five dozen liquor jugs. Sphinx of black quartz, judge my vow.
'''

# Two "real" snippets for input_ids (each tokenizes to more than T tokens).
SNIPPETS = [
    "The transformer computes, for each position, a distribution over the next token from the "
    "tokens that came before it, and attention lets every position look back.",
    "def forward(self, hidden_states, attention_mask=None):\n"
    "    residual = hidden_states\n"
    "    hidden_states = self.norm(hidden_states)\n"
    "    return residual + self.attn(hidden_states)\n",
]


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------
def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers.processors import ByteLevel as ByteLevelProcessor

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = ByteLevelProcessor(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    assert tok.token_to_id(SPECIAL) == 0
    return tok


def wrap_tokenizer(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL,
        eos_token=SPECIAL,
        unk_token=SPECIAL,
        pad_token=SPECIAL,
        model_max_length=64,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------------
LLAMA_HEAD_DIM = HIDDEN // 4  # 8

ROPE_VARIANTS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {
        "rope_type": "longrope",
        # head_dim / 2 = 4 distinct values each (Phi-3 style: no "factor"; factor = 64 / 16)
        "short_factor": [1.0, 1.25, 1.5, 2.0],
        "long_factor": [1.5, 2.5, 4.0, 6.0],
        "original_max_position_embeddings": 16,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}

# gemma3_text: 6 layers so that the 5:1 pattern shows, a window shorter than T and P + N, a
# head_dim apart from hidden / heads and a query_pre_attn_scalar apart from head_dim; the
# global layers carry a RoPE scaling (Gemma 3 scales its global layers only)
GEMMA3_LAYERS = 6
GEMMA3_WINDOW = 5
GEMMA3_HEAD_DIM = 16
GEMMA3_QUERY_SCALAR = 12
GEMMA3_GLOBAL_ROPE = {"rope_type": "linear", "factor": 2.0}

# config_legacy.json (old form: top-level rope_theta + rope_scaling) for these variants
LEGACY = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "yarn": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
}


def common_ids():
    return dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)


def make_config(case):
    import transformers as tf

    V = VOCAB_SIZE
    if case == "gpt2":
        return (
            tf.GPT2Config(
                vocab_size=V,
                n_positions=64,
                n_embd=HIDDEN,
                n_layer=LAYERS,
                n_head=4,
                n_inner=INTERMEDIATE,
                activation_function="gelu_new",
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                **common_ids(),
            ),
            "GPT2LMHeadModel",
            "learned positions (64), pre-LN, gelu_new, tied head, Conv1D [in,out] weights",
        )
    if case == "opt":
        return (
            tf.OPTConfig(
                vocab_size=V,
                hidden_size=HIDDEN,
                num_hidden_layers=LAYERS,
                ffn_dim=INTERMEDIATE,
                max_position_embeddings=64,
                do_layer_norm_before=True,
                word_embed_proj_dim=HIDDEN,
                num_attention_heads=4,
                activation_function="relu",
                dropout=0.0,
                attention_dropout=0.0,
                **common_ids(),
            ),
            "OPTForCausalLM",
            "learned positions with offset 2 (66 rows), pre-LN, relu, tied head",
        )
    if case == "xglm":
        return (
            tf.XGLMConfig(
                vocab_size=V,
                max_position_embeddings=64,
                d_model=HIDDEN,
                ffn_dim=INTERMEDIATE,
                num_layers=LAYERS,
                attention_heads=4,
                activation_function="gelu",
                dropout=0.0,
                attention_dropout=0.0,
                activation_dropout=0.0,
                scale_embedding=True,
                decoder_start_token_id=0,
                **common_ids(),
            ),
            "XGLMForCausalLM",
            (
                "fairseq sinusoidal positions (offset 2, not saved), scale_embedding sqrt(d), "
                "gelu (erf), tied head"
            ),
        )
    if case in ("gpt_neox", "gpt_neox_sequential"):
        parallel = case == "gpt_neox"
        return (
            tf.GPTNeoXConfig(
                vocab_size=V,
                hidden_size=HIDDEN,
                num_hidden_layers=LAYERS,
                num_attention_heads=2,
                intermediate_size=INTERMEDIATE,
                hidden_act="gelu",
                max_position_embeddings=64,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                },
                use_parallel_residual=parallel,
                tie_word_embeddings=False,
                attention_dropout=0.0,
                hidden_dropout=0.0,
                **common_ids(),
            ),
            "GPTNeoXForCausalLM",
            (
                "2 heads (head_dim 16), rotary on 25% of head_dim (4 dims), fused qkv per head, "
                f"gelu (erf), untied head, use_parallel_residual {parallel}"
            ),
        )
    if case == "llama" or case.startswith("llama_rope_"):
        cfg = dict(
            vocab_size=V,
            hidden_size=HIDDEN,
            intermediate_size=INTERMEDIATE,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_act="silu",
            max_position_embeddings=16,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            **common_ids(),
        )
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        note = (
            "4 heads / 2 kv heads (GQA), head_dim 8, RMSNorm eps 1e-6, SwiGLU, untied head, "
            "max_position_embeddings 16"
        )
        if case != "llama":
            kind = case[len("llama_rope_") :]
            rope = dict(ROPE_VARIANTS[kind], rope_theta=10000.0)
            if kind == "longrope":
                cfg["max_position_embeddings"] = 64
            if (
                kind == "llama3"
            ):  # HF warns unless original_max_position_embeddings < max_position_embeddings
                cfg["max_position_embeddings"] = 128
            note = f"llama's weights; rope {json.dumps({k: v for k, v in rope.items()})}"
            if kind in ("longrope", "llama3"):
                note += f"; max_position_embeddings {cfg['max_position_embeddings']}"
        return tf.LlamaConfig(rope_parameters=rope, **cfg), "LlamaForCausalLM", note
    if case == "mistral":
        return (
            tf.MistralConfig(
                vocab_size=V,
                hidden_size=HIDDEN,
                intermediate_size=INTERMEDIATE,
                num_hidden_layers=LAYERS,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                rms_norm_eps=1e-6,
                sliding_window=None,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                **common_ids(),
            ),
            "MistralForCausalLM",
            "4 heads / 2 kv heads, head_dim 8, sliding_window None, untied head",
        )
    if case == "qwen2":
        return (
            tf.Qwen2Config(
                vocab_size=V,
                hidden_size=HIDDEN,
                intermediate_size=INTERMEDIATE,
                num_hidden_layers=LAYERS,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                use_sliding_window=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                **common_ids(),
            ),
            "Qwen2ForCausalLM",
            "4 heads / 2 kv heads, head_dim 8, q/k/v biases (no o_proj/MLP bias), tied head",
        )
    if case == "bloom":
        return (
            tf.BloomConfig(
                vocab_size=V,
                hidden_size=48,
                n_layer=LAYERS,
                n_head=6,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                **common_ids(),
            ),
            "BloomForCausalLM",
            (
                "hidden 48, 6 heads (head_dim 8): ALiBi slopes take the non-power-of-two path; "
                "word_embeddings_layernorm; fused qkv interleaved per head; "
                "MLP 4*48=192 (fixed by HF), gelu tanh form; tied head"
            ),
        )
    if case == "mpt":
        return (
            tf.MptConfig(
                d_model=48,
                n_heads=6,
                n_layers=LAYERS,
                expansion_ratio=4,
                max_seq_len=64,
                vocab_size=V,
                attn_config={"alibi": True, "alibi_bias_max": 8},
                no_bias=True,
                resid_pdrop=0.0,
                emb_pdrop=0.0,
                use_cache=True,
                **common_ids(),
            ),
            "MptForCausalLM",
            (
                "d_model 48, 6 heads (MPT's own ALiBi slopes, non-power-of-two), "
                "no_bias (no Linear or LayerNorm biases), fused Wqkv, MLP 4*48=192 "
                "(HF hard-codes 4*d_model), gelu (erf), tied head"
            ),
        )
    if case == "gemma3_text":
        return (
            tf.Gemma3TextConfig(
                vocab_size=V,
                hidden_size=HIDDEN,
                intermediate_size=INTERMEDIATE,
                num_hidden_layers=GEMMA3_LAYERS,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=GEMMA3_HEAD_DIM,
                hidden_activation="gelu_pytorch_tanh",
                max_position_embeddings=64,
                rms_norm_eps=1e-6,
                query_pre_attn_scalar=GEMMA3_QUERY_SCALAR,
                sliding_window=GEMMA3_WINDOW,
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": dict(GEMMA3_GLOBAL_ROPE, rope_theta=1000000.0),
                },
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
                tie_word_embeddings=True,
                attention_dropout=0.0,
                **common_ids(),
            ),
            "Gemma3ForCausalLM",
            (
                f"{GEMMA3_LAYERS} layers: 5 sliding (window {GEMMA3_WINDOW}, RoPE base 1e4) then "
                f"1 global (base 1e6, linear x2 scaling); 4 heads / 2 kv heads of head_dim "
                f"{GEMMA3_HEAD_DIM} (hidden {HIDDEN}); query_pre_attn_scalar "
                f"{GEMMA3_QUERY_SCALAR}; q/k norms, sandwich norms, GeGLU (tanh), tied head"
            ),
        )
    raise ValueError(case)


CASES = [
    "gpt2",
    "llama",
    "llama_rope_linear",
    "llama_rope_dynamic",
    "llama_rope_yarn",
    "llama_rope_longrope",
    "llama_rope_llama3",
    "opt",
    "xglm",
    "gpt_neox",
    "gpt_neox_sequential",
    "mistral",
    "qwen2",
    "bloom",
    "mpt",
    "gemma3_text",
]
SEEDS = {c: SEED + i for i, c in enumerate(CASES)}


# --------------------------------------------------------------------------------------------------
# Models and goldens
# --------------------------------------------------------------------------------------------------
def init_weights(model, seed):
    """Large random weights: N(0, 0.2) for matrices and biases, 1 + N(0, 0.2) for norm scales."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * INIT_STD
            if p.ndim == 1 and name.endswith(".weight"):  # every 1-D weight here is a norm's scale
                p.copy_(1.0 + noise)
            else:
                p.copy_(noise)


def load(path, config_file=None):
    import transformers as tf

    kwargs = {}
    if config_file is not None:
        kwargs["config"] = tf.AutoConfig.from_pretrained(os.path.join(path, config_file))
    model = tf.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype="float32", **kwargs
    )
    model.eval()
    return model


def forward_logits(path, ids, config_file=None):
    import torch

    model = load(path, config_file)  # fresh: dynamic/longrope rotary state starts clean
    with torch.no_grad():
        return model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy().astype(np.float32)


def generate(path, prompt, config_file=None):
    import torch
    from transformers import GenerationConfig

    model = load(path, config_file)
    gen_cfg = GenerationConfig(
        max_new_tokens=N,
        min_new_tokens=N,
        do_sample=False,
        num_beams=1,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    with torch.no_grad():
        out = model.generate(
            torch.as_tensor(prompt, dtype=torch.long),
            attention_mask=torch.ones(prompt.shape, dtype=torch.long),
            generation_config=gen_cfg,
        )
    seq = out.sequences.numpy()
    assert seq.shape == (1, P + N), seq.shape
    assert (seq[:, :P] == prompt).all()
    gen_ids = seq[:, P:].astype(np.int32)
    gen_logits = torch.stack(out.logits, dim=1).numpy().astype(np.float32)
    return gen_ids, gen_logits


def build_case(case, out_dir, hf_tok, input_ids):
    import torch
    import transformers as tf
    from safetensors.numpy import load_file

    config, arch, note = make_config(case)
    config.architectures = [arch]
    path = os.path.join(out_dir, case)
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)

    torch.manual_seed(SEEDS[case])
    model = getattr(tf, arch)._from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    if case.startswith("llama_rope_"):
        # the same weights as the llama case
        ref = load_file(os.path.join(out_dir, "llama", "model.safetensors"))
        model.load_state_dict({k: torch.from_numpy(v) for k, v in ref.items()}, strict=False)
        sd = model.state_dict()
        for k, v in ref.items():
            assert torch.equal(sd[k], torch.from_numpy(v)), k
    else:
        init_weights(model, SEEDS[case])
    model.save_pretrained(path, safe_serialization=True)
    hf_tok.save_pretrained(path)

    with torch.no_grad():
        mem_logits = model(torch.as_tensor(input_ids, dtype=torch.long)).logits.numpy()

    kind = case[len("llama_rope_") :] if case.startswith("llama_rope_") else None
    if case == "gemma3_text":
        # the form of the configs on the Hub: rope_theta (global), rope_local_base_freq
        # (sliding), rope_scaling (global only), sliding_window_pattern instead of layer_types
        with open(os.path.join(path, "config.json")) as f:
            legacy = json.load(f)
        legacy.pop("rope_parameters")
        legacy.pop("layer_types")
        legacy.update(
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling=dict(GEMMA3_GLOBAL_ROPE),
            sliding_window_pattern=6,
        )
        with open(os.path.join(path, "config_legacy.json"), "w") as f:
            json.dump(legacy, f, indent=2, sort_keys=True)
            f.write("\n")
    if kind in LEGACY:
        with open(os.path.join(path, "config.json")) as f:
            legacy = json.load(f)
        legacy.pop("rope_parameters", None)
        legacy["rope_theta"] = 10000.0
        legacy["rope_scaling"] = dict(LEGACY[kind])
        with open(os.path.join(path, "config_legacy.json"), "w") as f:
            json.dump(legacy, f, indent=2, sort_keys=True)
            f.write("\n")

    logits = forward_logits(path, input_ids)
    prompt = input_ids[:1, :P].astype(np.int32)
    gen_ids, gen_logits = generate(path, prompt)
    full_ids = np.concatenate([prompt, gen_ids], axis=1)
    full_logits = forward_logits(path, full_ids)
    golden = dict(
        input_ids=input_ids.astype(np.int32),
        logits=logits,
        prompt_ids=prompt,
        generated_ids=gen_ids,
        generated_logits=gen_logits,
        full_logits_of_generated=full_logits,
    )
    np.savez_compressed(os.path.join(path, "golden.npz"), **golden)

    # ---- checks
    report = {"case": case, "arch": arch, "note": note}
    g = np.load(os.path.join(path, "golden.npz"))
    for k, v in golden.items():
        assert g[k].dtype in (np.float32, np.int32), (k, g[k].dtype)
        assert np.array_equal(g[k], v), k
    again = forward_logits(path, input_ids)
    report["reload_exact"] = bool(np.array_equal(again, g["logits"]))
    report["in_memory_exact"] = bool(np.array_equal(mem_logits, g["logits"]))
    report["logits_std"] = float(g["logits"].std())
    # greedy consistency: each generated token is the argmax of its raw step logits
    # (eos never masked)
    report["greedy_argmax_ok"] = bool((gen_logits.argmax(-1) == gen_ids).all())
    report["eos_generated"] = bool((gen_ids == 0).any())
    twin = full_logits[:, P - 1 : P - 1 + N]
    report["cached_vs_full_maxdiff"] = float(np.abs(twin - gen_logits).max())
    report["cached_vs_full_argmax_agree"] = bool((twin.argmax(-1) == gen_logits.argmax(-1)).all())
    if kind in LEGACY or case == "gemma3_text":
        leg_logits = forward_logits(path, input_ids, "config_legacy.json")
        report["legacy_config_exact"] = bool(np.array_equal(leg_logits, g["logits"]))
        leg_gen_ids, leg_gen_logits = generate(path, prompt, "config_legacy.json")
        report["legacy_generate_exact"] = bool(
            np.array_equal(leg_gen_ids, gen_ids) and np.array_equal(leg_gen_logits, gen_logits)
        )
        cfg_new = tf.AutoConfig.from_pretrained(path)
        cfg_old = tf.AutoConfig.from_pretrained(os.path.join(path, "config_legacy.json"))
        report["legacy_rope_parameters"] = cfg_old.rope_parameters
        report["legacy_same_rope_parameters"] = cfg_old.rope_parameters == cfg_new.rope_parameters
    with open(os.path.join(path, "config.json")) as f:
        saved = json.load(f)
    report["saved_rope"] = saved.get("rope_parameters", saved.get("rope_scaling"))
    report["files"] = {
        fn: os.path.getsize(os.path.join(path, fn)) for fn in sorted(os.listdir(path))
    }
    report["size"] = sum(report["files"].values())
    report["shapes"] = {k: list(v.shape) for k, v in golden.items()}
    return report


def write_readme(out_dir, tok_info):
    import tokenizers
    import torch
    import transformers

    rows = []
    for case in CASES:
        path = os.path.join(out_dir, case)
        if not os.path.isdir(path):
            continue
        _, arch, note = make_config(case)
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        legacy = case[len("llama_rope_") :] in LEGACY and case.startswith("llama_rope_")
        extra = " (+ config_legacy.json)" if legacy or case == "gemma3_text" else ""
        g = np.load(os.path.join(path, "golden.npz"))
        twin = g["full_logits_of_generated"][:, P - 1 : P - 1 + N]
        diff = float(np.abs(twin - g["generated_logits"]).max())
        rows.append(f"| `{case}` | `{arch}` | {note}{extra} | {diff:.1e} | {size / 1024:.0f} KB |")
    # A backslash at the end of a line below continues the line (it is not in the text).
    text = (
        f"""# Tiny Hugging Face causal LMs (offline test fixtures)

Random tiny models of each family the pretrained loader supports, saved in Hugging Face's own \
on-disk
format, with the outputs transformers gives for them. Nothing here came from the Hugging Face Hub.

Made by `scripts/make_hf_goldens.py` (see its docstring):

    pip install torch==2.13.0 transformers
    python scripts/make_hf_goldens.py

with torch {torch.__version__}, transformers {transformers.__version__}, tokenizers \
{tokenizers.__version__},
numpy {np.__version__}, on CPU (1 thread), float32, `attn_implementation="eager"`.

## Every folder

- `config.json`, `generation_config.json`, `model.safetensors`: \
`model.save_pretrained(safe_serialization=True)`.
  transformers 5 writes RoPE options as `rope_parameters` (with `rope_theta` inside it).
- `tokenizer.json`, `tokenizer_config.json`: `PreTrainedTokenizerFast.save_pretrained`. The same \
tokenizer in
  every folder: byte-level BPE ({tok_info}), ByteLevel pre-tokenizer (no prefix space) and decoder,
  trained with `tokenizers` on ~4 KB of text embedded in the script. `{SPECIAL}` (id 0) is bos = \
eos = pad = unk;
  the text never produces it.
- `golden.npz` (float32 / int32):

  | array | shape | what |
  |---|---|---|
  | `input_ids` | [2, {T}] | two text snippets tokenized, cut to {T} tokens |
  | `logits` | [2, {T}, {VOCAB_SIZE}] | `model(input_ids).logits`: one full pass, no attention \
mask, no padding |
  | `prompt_ids` | [1, {P}] | `input_ids[:1, :{P}]` |
  | `generated_ids` | [1, {N}] | greedy `generate` (do_sample False, use_cache True, \
max_new_tokens = min_new_tokens = {N}): new tokens only |
  | `generated_logits` | [1, {N}, {VOCAB_SIZE}] | raw logits of each cached step \
(`output_logits=True`) |
  | `full_logits_of_generated` | [1, {P + N}, {VOCAB_SIZE}] | one full pass over prompt + \
generated; row `{P - 1} + i` is the full-pass twin of step `i` |

  Each is computed on a freshly loaded copy of the folder. Weights: N(0, {INIT_STD}) for every \
matrix and bias,
  1 + N(0, {INIT_STD}) for norm scales (fixed seeds), so logits are far from trivial. Layers \
{LAYERS}.

HF's cached and full passes agree (to float rounding) except where the rotary frequencies depend \
on the
length: `llama_rope_dynamic` (dynamic NTK: each cached key keeps the rotation of the step that \
wrote it) and
`llama_rope_longrope` (the prompt is encoded with `short_factor`, steps past 16 positions with \
`long_factor`;
the full pass of 32 tokens uses `long_factor` everywhere).

`llama_rope_*` share the weights of `llama` (only the config differs). `llama_rope_linear` and
`llama_rope_yarn` also carry `config_legacy.json`: the same config in the old form (top-level \
`rope_theta` and
`rope_scaling` with `rope_type` (linear) or `type` (yarn)); transformers loads it to exactly the \
same logits
and generation.

Notes for a loader:
- Tied heads (gpt2, opt, xglm, qwen2, bloom, mpt) have no head tensor in model.safetensors. GPT-2 \
stores
  Conv1D weights as [in, out]; every other family stores nn.Linear weights as [out, in]. GPT-NeoX \
and BLOOM
  fuse q/k/v per head ([H, 3, hd] along the output axis); MPT's Wqkv is [q; k; v] along the output \
axis.
- XGLM's sinusoidal table is not saved (HF rebuilds it; offset 2). OPT's learned table has
  max_position_embeddings + 2 rows (offset 2).
- MPT: HF's MptMLP hard-codes 4 * d_model (expansion_ratio is ignored by transformers), so the \
config says
  expansion_ratio 4 to agree with the weights.
- `llama_rope_longrope` has no `factor` (Phi-3 style): HF takes max_position_embeddings /
  original_max_position_embeddings = 4 and the attention factor sqrt(1 + ln 4 / ln 16); HF warns \
about it.
  `llama_rope_llama3` has max_position_embeddings 128 (HF warns unless original < max; llama3 does \
not read it).
- transformers 5 writes `"tokenizer_class": "TokenizersBackend"`; tokenizer.json is plain \
`tokenizers` JSON.
- Sizes: the golden logits of random models barely compress (~150 KB of golden.npz per case).

## Cases

"cached vs full" is max |generated_logits - full_logits_of_generated[:, 7:31]|.

| case | architecture | notable options | cached vs full | size |
|---|---|---|---|---|
"""
        + "\n".join(rows)
        + "\n"
    )
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "pretrained", "hf_models"))
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            sys.exit(f"unknown case {c!r}; known: {CASES}")
    if any(c.startswith("llama_rope_") for c in cases) and "llama" not in cases:
        if not os.path.isfile(os.path.join(out_dir, "llama", "model.safetensors")):
            cases.insert(0, "llama")
    cases.sort(key=CASES.index)

    tok = train_tokenizer()
    tok2 = train_tokenizer()
    assert tok.to_str() == tok2.to_str(), "tokenizer training is not deterministic"
    hf_tok = wrap_tokenizer(tok)
    rows = []
    for s in SNIPPETS:
        ids = hf_tok(s, add_special_tokens=False)["input_ids"]
        assert len(ids) >= T, (len(ids), s)
        assert 0 not in ids
        assert hf_tok.decode(ids) == s
        rows.append(ids[:T])
    input_ids = np.asarray(rows, dtype=np.int32)
    n_merges = VOCAB_SIZE - 257
    tok_info = f"vocab {VOCAB_SIZE} = 256 bytes + 1 special + {n_merges} merges"

    reports = []
    for case in cases:
        r = build_case(case, out_dir, hf_tok, input_ids)
        reports.append(r)
        print(
            f"{case:22s} {r['size'] / 1024:6.1f} KB  reload_exact={r['reload_exact']} "
            f"in_memory_exact={r['in_memory_exact']} std={r['logits_std']:.2f} "
            f"greedy_ok={r['greedy_argmax_ok']} eos={r['eos_generated']} "
            f"cached_vs_full={r['cached_vs_full_maxdiff']:.2e} "
            f"argmax_agree={r['cached_vs_full_argmax_agree']}"
            + (
                f" legacy_exact={r['legacy_config_exact']} "
                f"legacy_gen_exact={r['legacy_generate_exact']} "
                f"legacy_same_params={r['legacy_same_rope_parameters']}"
                if "legacy_config_exact" in r
                else ""
            ),
            flush=True,
        )
        print(f"{'':22s} rope={r['saved_rope']}", flush=True)
    write_readme(out_dir, tok_info)
    print("shapes:", reports[0]["shapes"])
    bad = [
        r["case"] for r in reports if not (r["reload_exact"] and r.get("legacy_config_exact", True))
    ]
    if bad:
        sys.exit(f"FAILED exact reload for {bad}")
    print("all reloads exact")


if __name__ == "__main__":
    main()
