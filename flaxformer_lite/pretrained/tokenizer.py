"""The tokenizer of a Hugging Face model folder, with the Hugging Face ``tokenizers`` library.

Read from ``tokenizer.json`` (the fast-tokenizer file most causal LMs ship) or, for
GPT-2-style byte-level BPE folders that have only ``vocab.json`` + ``merges.txt``, built
from those two files. A folder with neither (a SentencePiece ``.model`` only) is refused in
one line. Nothing in the folder is executed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from flaxformer_lite.pretrained.files import PretrainedError

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt")


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: ``encode`` / ``decode`` and the hash of the files it came from."""

    backend: object  # tokenizers.Tokenizer
    source: str  # the file(s) it was read from
    sha256: str  # "sha256:<hex>" of those files' bytes

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS unless ``add_special_tokens``)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` (no special tokens) and each token's ``(start, end)``
        character offsets in ``text`` (what `flaxformer_lite.data.tokens` counts bytes from)."""
        encoding = self.backend.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)


def _hash(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return "sha256:" + digest.hexdigest()


def tokenizer_files(folder: Path) -> list[Path]:
    """The files `load_tokenizer` reads in ``folder`` (``tokenizer.json``, else ``vocab.json``
    + ``merges.txt``); [] when it has neither."""
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        return [folder / "tokenizer.json"]
    pair = [folder / "vocab.json", folder / "merges.txt"]
    return pair if all(p.is_file() for p in pair) else []


def load_tokenizer(folder: Path) -> Tokenizer:
    """The tokenizer of a model folder (see the module docstring)."""
    try:
        import tokenizers
    except ImportError:
        raise PretrainedError(
            "loading a tokenizer needs the `tokenizers` package: pip install "
            "'flaxformer-lite[pretrained]'"
        ) from None
    folder = Path(folder)
    path = folder / "tokenizer.json"
    try:
        if path.is_file():
            return Tokenizer(tokenizers.Tokenizer.from_file(str(path)), str(path), _hash([path]))
        vocab, merges = folder / "vocab.json", folder / "merges.txt"
        if vocab.is_file() and merges.is_file():
            backend = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(vocab), str(merges)))
            backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = tokenizers.decoders.ByteLevel()
            return Tokenizer(backend, f"{vocab} + {merges.name}", _hash([vocab, merges]))
    except Exception as e:  # the library's parse errors are plain Exceptions
        raise PretrainedError(f"{folder}: cannot read the tokenizer ({e})") from None
    others = sorted(p.name for p in folder.glob("*.model"))
    if others:
        hint = f"{others[0]} is a SentencePiece model: save it as tokenizer.json with transformers"
    else:  # e.g. the folder of a model's save_pretrained alone
        hint = "save the model's tokenizer into it too, e.g. tokenizer.save_pretrained(DIR)"
    raise PretrainedError(f"{folder}: no tokenizer.json (or vocab.json + merges.txt); {hint}")


def check_vocabulary(tokenizer: Tokenizer, vocab_size: int, *, where: str) -> None:
    """Refuse a tokenizer whose token ids reach past the model's embedding of
    ``vocab_size`` rows (``config.json``'s ``vocab_size``): such an id would read past the
    table (JAX clamps or fills a gather out of range; the scores come out NaN). A smaller
    tokenizer is fine (many models pad their embedding)."""
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    top = max(vocab.values(), default=-1)
    if top >= vocab_size:
        token = min((t for t, i in vocab.items() if i >= vocab_size), key=vocab.get)
        raise PretrainedError(
            f"{where}: the tokenizer ({tokenizer.source}) has token ids up to {top} (e.g. "
            f"{token!r} = {vocab[token]}) but the model's embedding has {vocab_size} rows "
            "(config.json vocab_size); ids past it give no scores: use the model's own tokenizer"
        )
