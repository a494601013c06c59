"""The tokenizer stored in a GGUF file's metadata, built with Hugging Face ``tokenizers``.

A GGUF file has no ``tokenizer.json``: llama.cpp stores the vocabulary as metadata
(``tokenizer.ggml.model``, ``.tokens``, ``.token_type``, ``.merges``, ``.scores``, ``.pre``,
the special token ids, ``.add_bos_token``). The tokenizer built here is the one transformers
builds from the same keys (``integrations/gguf/gguf_tokenizer_mapping.py`` and the tokenizer
classes it hands them to), so token ids agree with ``AutoTokenizer.from_pretrained(folder,
gguf_file=name)`` (tests/pretrained/test_pretrained_gguf.py pins them):

==================  =========================================================================
``ggml.model``      tokenizer
==================  =========================================================================
``gpt2``            byte-level BPE (GPT-2's): the file's merges; tokens not spelled in GPT-2's
                    byte alphabet are respelled from their UTF-8 bytes; GPT-2's split regex,
                    or the one transformers names for ``tokenizer.ggml.pre`` (llama 3,
                    Qwen2, GPT-4o, Tekken families)
``llama``           SentencePiece-style BPE with byte fallback (``<0x41>`` tokens): merges
                    from the file, else rebuilt from the vocabulary ordered by ``scores``;
                    ``▁`` for spaces, prepended to the first word (Metaspace)
``llama`` (Gemma)   the same, as Gemma's tokenizer: spaces become ``▁`` everywhere (no
                    prefix), whitespace-only tokens respelled with ``▁``, merges rebuilt in
                    the file's order (Gemma's scores do not follow its merge order)
==================  =========================================================================

Tokens the file marks CONTROL (type 3) are special tokens (matched whole, never split);
USER_DEFINED ones (type 4) are matched whole too. With ``add_special_tokens=True`` the BOS
token is prepended when ``tokenizer.ggml.add_bos_token`` says so (SentencePiece files default
to yes, as in llama.cpp). The tokenizer's hash is the sha256 of the ``tokenizer.ggml.*``
metadata entries' bytes, as stored in the file.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from flaxformer_lite.pretrained.files import PretrainedError
from flaxformer_lite.pretrained.tokenizer import Tokenizer, tokenizers_package

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
# The architectures whose SentencePiece vocabulary is Gemma's (transformers' GemmaTokenizer)
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

# Split patterns of the byte-level vocabularies, by ``tokenizer.ggml.pre`` (the regular
# expressions of each family's tokenizer.json, as transformers' GGUF reader names them);
# any other value uses GPT-2's pattern (the ByteLevel pre-tokenizer's own).
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
        ),
        _LLAMA3,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
    "tekken": _TEKKEN,
}


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (``bytes_to_unicode`` in OpenAI's
    ``encoder.py``): printable Latin-1 bytes map to themselves, the other 68 bytes to
    ``chr(256 + k)`` in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def merges_from_vocab(vocab: dict[str, int], order: dict[str, float] | None) -> list:
    """BPE merges implied by a vocabulary with no merge list (SentencePiece BPE).

    Every token that splits into two vocabulary tokens ``(left, right)`` gives the merge
    ``left right``; merges are ranked by ``order[token]`` (highest first: the SentencePiece
    score, or minus the token's index), ties by the lengths of ``left`` then ``right`` (also
    highest first), and pairs of one token by the ids of ``left`` and ``right``. Without
    ``order``, tokens rank by id, lowest first. This is transformers'
    ``tokenization_utils_base.generate_merges`` (and ``tokenizers``' SentencePiece
    converter), whose order the Hugging Face tokenizer of a GGUF file follows.
    """
    ranked = order if order is not None else vocab
    merges = []
    for token, rank in ranked.items():
        pairs = [
            (token[:i], token[i:], rank)
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab
        ]
        pairs.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        merges.extend(pairs)
    merges.sort(key=lambda p: (p[2], len(p[0]), len(p[1])), reverse=order is not None)
    return [(left, right) for left, right, _ in merges]


def _added_tokens(tokens: list[str], types: list[int], vocab: dict[str, int], *, alphabet):
    """CONTROL tokens as special tokens, USER_DEFINED ones as plain added tokens (both
    matched whole and never normalized). In a byte-level vocabulary a CONTROL token spelled
    outside the byte alphabet is a llama.cpp mislabel and is skipped, as transformers does."""
    import tokenizers

    special = [
        tokenizers.AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, types, strict=False)
        if kind == CONTROL and (alphabet is None or set(t) <= alphabet)
    ]
    plain = [
        tokenizers.AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == USER_DEFINED and t in vocab
    ]
    return special, plain


def _merge_pairs(meta: Any, model: str, tokens: list[str], vocab, merges) -> list:
    """The BPE merges as pairs: the file's ``tokenizer.ggml.merges``, else rebuilt from the
    tokens' scores (`merges_from_vocab`)."""
    if merges is not None:
        return [tuple(m.split(" ")) for m in merges]
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise PretrainedError(f"{meta.path}: a {model} tokenizer without merges or scores")
    return merges_from_vocab(vocab, dict(zip(tokens, scores, strict=False)))


def _byte_level(meta: Any, tokens: list[str], merges: list[str] | None):
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    pairs = _merge_pairs(meta, "gpt2", tokens, vocab, merges)
    backend = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=pairs,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    split = PRE_TOKENIZER_SPLITS.get(meta.str("tokenizer.ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend, vocab, alphabet


def _sentencepiece(meta: Any, tokens: list[str], merges: list[str] | None, *, gemma: bool):
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    if gemma:  # whitespace-only tokens are stored with real spaces; Gemma looks up "▁"
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    if gemma and merges is None:
        pairs = merges_from_vocab(vocab, {t: -i for i, t in enumerate(tokens)})
    else:
        pairs = _merge_pairs(meta, "llama", tokens, vocab, merges)
    backend = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=pairs,
            fuse_unk=True,
            unk_token="<unk>" if gemma else None,
            dropout=None,
            byte_fallback=True,
        )
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", "▁")
        backend.pre_tokenizer = pre_tokenizers.Split(
            pattern=" ", behavior="merged_with_previous", invert=False
        )
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False
        )
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend, vocab, None


def _metadata_hash(reader: Any) -> str:
    """sha256 of the ``tokenizer.ggml.*`` entries' bytes as stored (key, type and value)."""
    digest = hashlib.sha256()
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml."):
            size = sum(int(part.nbytes) for part in field.parts)
            digest.update(reader.data[field.offset : field.offset + size].tobytes())
    return "sha256:" + digest.hexdigest()


def load_tokenizer(opened: Any) -> Tokenizer:
    """The tokenizer of an opened GGUF file (`gguf.GGUFFile`); see the module docstring."""
    tokenizers = tokenizers_package()
    meta = opened.meta
    kind = meta.str("tokenizer.ggml.model")
    if kind is None:
        raise PretrainedError(f"{meta.path}: no tokenizer.ggml.model (the file has no tokenizer)")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise PretrainedError(f"{meta.path}: tokenizer.ggml.tokens must be a list of strings")
    types = meta.get("tokenizer.ggml.token_type") or []
    merges = meta.get("tokenizer.ggml.merges")
    try:
        if kind == "gpt2":
            backend, vocab, alphabet = _byte_level(meta, tokens, merges)
        elif kind == "llama":
            gemma = opened.arch.name in GEMMA_ARCHITECTURES
            backend, vocab, alphabet = _sentencepiece(meta, tokens, merges, gemma=gemma)
        else:
            raise PretrainedError(
                f"{meta.path}: tokenizer.ggml.model={kind!r} is not supported; supported: "
                "['gpt2', 'llama']"
            )
        special, plain = _added_tokens(tokens, types, vocab, alphabet=alphabet)
        named = {}
        for key in ("bos", "eos", "unknown", "padding"):
            index = meta.get(f"tokenizer.ggml.{key}_token_id")
            if index is not None and 0 <= index < len(tokens):
                named[key] = tokens[index]
        known = {str(t) for t in special + plain}
        special += [
            tokenizers.AddedToken(t, special=True) for t in named.values() if t not in known
        ]
        backend.add_special_tokens(special)
        if plain:
            backend.add_tokens(plain)
        default_bos = kind == "llama"  # llama.cpp adds BOS to SentencePiece vocabularies
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)) and "bos" in named
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and "eos" in named
        single = " ".join(
            [f"{named['bos']}:0"] * add_bos + ["$A:0"] + [f"{named['eos']}:0"] * add_eos
        )
        pair = " ".join(
            [single] + [f"{named['bos']}:1"] * add_bos + ["$B:1"] + [f"{named['eos']}:1"] * add_eos
        )
        wanted = (("bos", add_bos), ("eos", add_eos))
        ids = [(named[k], backend.token_to_id(named[k])) for k, on in wanted if on]
        backend.post_processor = tokenizers.processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=ids
        )
    except PretrainedError:
        raise
    except Exception as e:  # the tokenizers library's own errors
        raise PretrainedError(f"{meta.path}: cannot build its tokenizer ({e})") from None
    return Tokenizer(backend, f"{meta.path} (tokenizer.ggml.*)", _metadata_hash(opened.reader))
