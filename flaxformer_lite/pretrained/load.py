"""Load a Hugging Face causal LM into `DecoderOnlyLM`: ``load_pretrained(folder or hub id)``.

Steps, each refusing in one line before anything large is allocated: read ``config.json``
and map it to a `ModelConfig` (`families`); check the parameters' memory against the memory
available; read the safetensors headers; map every stored tensor onto a parameter path and
compare shapes; only then read the tensors, cast them to ``param_dtype`` and place them
(optionally sharded). Every parameter must come from the checkpoint and every stored tensor
must be used (or be a known buffer): nothing is left at a random initialisation.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxformer_lite.base.memory import format_bytes, host_available
from flaxformer_lite.data.tokens import TokenCorpus
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.nn.param_count import count_parameters
from flaxformer_lite.pretrained import families, gguf, gguf_tokenizer
from flaxformer_lite.pretrained.files import (
    CheckpointFiles,
    PretrainedError,
    content_hash,
    non_finite,
    read_config,
    weight_files,
)
from flaxformer_lite.pretrained.tokenizer import (
    Tokenizer,
    check_vocabulary,
    load_tokenizer,
    tokenizer_files,
)

HUB_FILES = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer*",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "generation_config.json",
]


@dataclasses.dataclass(frozen=True)
class PretrainedInfo:
    """Where a loaded model came from (recorded in results rows)."""

    model_id: str  # the hub id or folder given to `load_pretrained`
    family: str  # `families.Family.name`
    folder: str  # the local folder read
    revision: str | None  # the hub commit, when loaded from the hub
    weights_sha256: str  # "sha256:..." of the safetensors files, in order
    tokenizer_sha256: str | None  # "sha256:..." of the tokenizer files, None without one
    hf_config: dict[str, Any]  # config.json as read (for a GGUF file: mapped from its metadata)
    # "safetensors", or for a GGUF file "gguf <stored types> dequantized to float32"
    weights_format: str = "safetensors"

    def record(self) -> dict[str, Any]:
        """What a results row says of the model: id, family, revision, weights and tokenizer
        sha256, and the weights' stored format."""
        return {
            "model_id": self.model_id,
            "family": self.family,
            "revision": self.revision,
            "weights_sha256": self.weights_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "weights_format": self.weights_format,
        }


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """`load_pretrained`'s result: the model, its config, its tokenizer and its provenance."""

    model: DecoderOnlyLM
    config: ModelConfig
    tokenizer: Tokenizer | None
    info: PretrainedInfo


# The config.json fields that state a model's context, in the order they are read
# (`training_length`): Llama-like and most families, GPT-2, MPT, others' older names.
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")


class MissingModelError(PretrainedError):
    """A hub id that is neither in the local Hugging Face cache nor downloadable (offline,
    no network, no ``huggingface_hub``). ``repo``: the id; ``reason``: why it could not be
    fetched; the message is one line."""

    def __init__(self, message: str, *, repo: str, reason: str):
        super().__init__(message)
        self.repo = repo
        self.reason = reason


def fetch_command(repo: str) -> tuple[str, str]:
    """``(command, folder)``: the ``hf download`` command that fetches the files of the hub
    model ``repo`` that loading needs (config, safetensors, tokenizer) into ``folder``
    (``models/<the id's last part>``), to run where there is internet."""
    folder = f"models/{repo.rstrip('/').rsplit('/', 1)[-1]}"
    command = (
        f"hf download {repo} --include '*.json' '*.safetensors' 'tokenizer*' 'vocab.json' "
        f"'merges.txt' --local-dir {folder}"
    )
    return command, folder


def missing_models_message(errors: list[MissingModelError]) -> str:
    """One line naming every missing hub model of ``errors`` (in order, each once) with the
    command that fetches it (`fetch_command`) and the ``--model=FOLDER`` flag of
    ``flaxformer-lite study`` that takes the result."""
    repos = list(dict.fromkeys(e.repo for e in errors))
    parts = []
    for repo in repos:
        command, folder = fetch_command(repo)
        parts.append(f"{repo}: `{command}`, then --model={folder}")
    reason = errors[-1].reason.split(". ")[0]
    return (
        f"{len(repos)} hub model(s) are not in the local Hugging Face cache and cannot be "
        f"downloaded here ({reason}); where there is internet, fetch each: "
        + "; ".join(parts)
        + " (or fill the cache, HF_HOME, with them)"
    )


def training_length(hf_config: dict[str, Any]) -> int | None:
    """The context a model states in its ``config.json`` (a GGUF file's ``context_length``,
    as `gguf` maps it): the first positive int of `CONTEXT_FIELDS`, None when it states
    none (e.g. BLOOM: ALiBi has no length limit)."""
    for field in CONTEXT_FIELDS:
        value = hf_config.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def resolve(source: str | os.PathLike, *, revision: str | None = None) -> tuple[Path, str | None]:
    """A local model folder for ``source`` (a folder, or a hub id fetched with
    ``huggingface_hub``: the cache first, then the network unless ``HF_HUB_OFFLINE=1``),
    and the hub revision when it came from the hub."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path, None
    repo = str(source)
    if path.exists() or repo.count("/") > 1 or not repo.strip("/"):
        raise PretrainedError(f"{repo}: not a model folder and not a hub id (org/name)")
    how = (
        f"download it where there is internet (e.g. `hf download {repo} --include "
        f"'*.json' '*.safetensors' 'tokenizer*' --local-dir DIR`) and pass DIR, or fill the "
        "Hugging Face cache (HF_HOME) with it"
    )
    try:
        import huggingface_hub
    except ImportError:
        raise MissingModelError(
            f"{repo}: no such folder, and loading a hub id needs huggingface_hub (pip install "
            f"'flaxformer-lite[pretrained]'); or {how}",
            repo=repo,
            reason="huggingface_hub is not installed",
        ) from None
    errors = []
    for local_only in (True, False):
        if not local_only and os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
            break
        try:
            folder = huggingface_hub.snapshot_download(
                repo, revision=revision, allow_patterns=HUB_FILES, local_files_only=local_only
            )
        except Exception as e:  # offline, unknown repo, gated, ...: one line below
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        return Path(folder), Path(folder).name
    raise MissingModelError(
        f"{repo}: not in the local cache and not downloadable ({errors[-1]}); {how}",
        repo=repo,
        reason=errors[-1] if errors else "HF_HUB_OFFLINE is set",
    )


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A pretrained model's files, resolved and read once: the folder, ``config.json`` and
    the `ModelConfig` it maps to (`families`). `open_checkpoint` makes it; `load` places the
    weights into a model of a given config (the mapped one, or the same architecture with
    other compute settings or an evaluation-time RoPE scaling).

    Attributes:
      source: the hub id or folder it was opened from.
      folder: the local folder read.
      revision: the hub commit, when it came from the hub.
      hf_config: ``config.json`` as read.
      family: its `families.Family`.
      config: the mapped `ModelConfig` (float32, the family's defaults).
      gguf: for a llama.cpp GGUF file, the opened file (`gguf.GGUFFile`: its metadata is
        ``hf_config``, its tensors and tokenizer are read from it); None for a folder.
    """

    source: str
    folder: Path
    revision: str | None
    hf_config: dict[str, Any]
    family: families.Family
    config: ModelConfig
    gguf: gguf.GGUFFile | None = None

    def files(self) -> CheckpointFiles:
        """The stored tensors under their Hugging Face names (a GGUF file's dequantized)."""
        if self.gguf is not None:
            return self.gguf.checkpoint(strip=self.family.prefixes)
        return CheckpointFiles(self.folder, strip=self.family.prefixes)

    def content_files(self) -> tuple[list[Path], list[Path]]:
        """``(weight files, tokenizer files)``: what a run's identity hashes (a GGUF file holds
        both)."""
        if self.gguf is not None:
            return [self.gguf.path], []
        return weight_files(self.folder), tokenizer_files(self.folder)

    def _weights_format(self, files: CheckpointFiles) -> str:
        """ "safetensors", or for a GGUF file "gguf <stored types> dequantized to float32"."""
        if self.gguf is None:
            return "safetensors"
        return f"gguf {files.quantization()} dequantized to float32"

    def load(self, cfg: ModelConfig | None = None, *, shardings=None) -> DecoderOnlyLM:
        """The model of ``cfg`` (default `config`) with the checkpoint's weights: memory
        checked first (the config's count, then the stored tensors' sizes), every parameter
        taken from the checkpoint and every stored tensor used (`_mapped`, `_fill`).
        ``shardings(abstract params)`` places each parameter on its devices (None: the
        default device). Refuses, in one line, a ``cfg`` whose parameters differ from the
        checkpoint's."""
        cfg = self.config if cfg is None else cfg
        name = self.family.name
        _check_memory(name, cfg, None)
        files = self.files()
        _check_memory(name, cfg, files)
        graphdef, abstract, rest = _abstract(cfg)
        weights = _mapped(self.family, files, cfg)
        params = _fill(self.family, abstract, weights, cfg.params_dtype, shardings, files)
        return nnx.merge(graphdef, params, rest)

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        """The folder's tokenizer (`tokenizer.load_tokenizer`), read once; refused in one line
        when its ids reach past the model's embedding (`tokenizer.check_vocabulary`)."""
        if self.gguf is not None:
            tok = gguf_tokenizer.load_tokenizer(self.gguf)
        else:
            tok = load_tokenizer(self.folder)
        check_vocabulary(tok, self.config.vocab_size, where=f"{self.family.name} {self.folder}")
        return tok

    @functools.cached_property
    def separator_id(self) -> int:
        """The token that joins documents when the model scores a corpus, by its family's
        rule (`families.Family.separator`): the tokenizer's ``<|endoftext|>`` when it has
        one and the rule allows it (the pretraining separator of GPT-2-style vocabularies:
        SmolLM2's ``config.json`` names ``<|im_end|>`` as eos, but it was pretrained with
        ``<|endoftext|>`` between documents), else ``eos_token_id`` (the first of a list;
        a GGUF file's ``tokenizer.ggml.eos_token_id``). Refused in one line when neither
        exists."""
        if self.family.separator == "endoftext":
            found = self.tokenizer.backend.token_to_id("<|endoftext|>")
            if found is not None and found < self.config.vocab_size:
                return int(found)
        eos = self._token_id("eos_token_id")
        if eos is None:
            raise PretrainedError(
                f"{self.family.name} {self.source}: no token to join documents with: the "
                "tokenizer has no <|endoftext|> and the config no eos_token_id"
            )
        return eos

    @functools.cached_property
    def bos_id(self) -> int | None:
        """The token fed (never scored) before each document, by the family's rule
        (`families.Family.bos`): None (``"none"``), the config's ``bos_token_id``
        (``"bos_token"``; refused in one line when it has none), or the token the tokenizer
        prepends by default (``"tokenizer"``: its post-processor, as transformers encodes a
        text; a GGUF file's ``tokenizer.ggml.add_bos_token``), None when it prepends none."""
        rule = self.family.bos
        if rule == "none":
            return None
        if rule == "bos_token":
            bos = self._token_id("bos_token_id")
            if bos is None:
                raise PretrainedError(
                    f"{self.family.name} {self.source}: the family starts documents with its "
                    "BOS token but the config has no bos_token_id"
                )
            return bos
        plain = self.tokenizer.encode("a")
        special = self.tokenizer.encode("a", add_special_tokens=True)
        if len(special) > len(plain) and special[1 : len(plain) + 1] == plain:
            return int(special[0])
        return None

    def _token_id(self, field: str) -> int | None:
        """``hf_config[field]`` as one token id (the first of a list), None when absent."""
        value = self.hf_config.get(field)
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        return None

    def scored_text(self, corpus: Any, *, max_bytes: int | None = None) -> TokenCorpus:
        """``corpus`` (a `ByteCorpus`) as this model scores it: each document tokenized by its
        tokenizer, documents joined by its `separator_id` and started by its `bos_id` (fed,
        never scored), every token with the bytes of text it covers
        (`flaxformer_lite.data.tokens`: bits per UTF-8 byte of the same text for every
        tokenizer). The tokens must decode to the text (a lossy tokenizer is refused in one
        line when a split is tokenized); ``max_bytes`` (the evaluation's cap) forces a token
        boundary at that byte, so every model scores exactly the same bytes."""
        tok = self.tokenizer
        return TokenCorpus(
            corpus,
            tok.encode_with_offsets,
            separator_id=self.separator_id,
            bos_id=self.bos_id,
            decode=tok.decode,
            cut_bytes=max_bytes or None,
            model=f"{self.family.name} {self.source}",
            tokenizer_sha256=tok.sha256,
            vocab_size=self.config.vocab_size,
        )

    def info(self, *, tokenizer: bool = True) -> PretrainedInfo:
        """What results rows record of the model (its weights hashed now; the tokenizer's
        hash when ``tokenizer``)."""
        files = self.files()
        return PretrainedInfo(
            model_id=self.source,
            family=self.family.name,
            folder=str(self.folder),
            revision=self.revision,
            weights_sha256=content_hash(files.files),
            tokenizer_sha256=self.tokenizer.sha256 if tokenizer else None,
            hf_config=self.hf_config,
            weights_format=self._weights_format(files),
        )


def open_checkpoint(source: str | os.PathLike, *, revision: str | None = None) -> Checkpoint:
    """The `Checkpoint` of ``source`` (a folder, a hub id (`resolve`) or a GGUF file
    (`gguf.gguf_source`)): resolved, read and mapped once per process (a run's config, its
    pre-flight and its evaluation share it); opened again when its ``config.json`` (or GGUF
    file) changed on disk."""
    key = (str(source), revision)
    cached = _OPENED.get(key)
    if cached is not None and cached[0] == _stamps(cached[1]):
        return cached[1]
    gguf_path = gguf.gguf_source(source)
    if gguf_path is None:
        folder, hub_revision = resolve(source, revision=revision)
        opened, hf_config = None, read_config(folder)
        where = str(folder / "config.json")
    else:
        folder, hub_revision = gguf_path.parent, None
        opened = gguf.open_gguf(gguf_path)
        hf_config, where = opened.hf_config, str(gguf_path)
    checkpoint = Checkpoint(
        source=str(source),
        folder=folder,
        revision=hub_revision,
        hf_config=hf_config,
        family=families.family_of(hf_config, where=where),
        config=families.model_config(hf_config, where=where),
        gguf=opened,
    )
    _OPENED[key] = (_stamps(checkpoint), checkpoint)
    return checkpoint


def _stamps(checkpoint: Checkpoint) -> tuple:
    """What says a checkpoint must be opened again: the (mtime, size) of the file its config
    was read from (config.json, or the GGUF file) and of its folder (files added or removed,
    e.g. a second GGUF file beside the first)."""
    config = checkpoint.folder / "config.json" if checkpoint.gguf is None else checkpoint.gguf.path
    return _stamp(config), _stamp(checkpoint.folder)


# (source, revision) -> (its `_stamps`, its Checkpoint): `open_checkpoint`'s
_OPENED: dict[tuple[str, str | None], tuple[tuple, Checkpoint]] = {}


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _check_memory(family: str, cfg: ModelConfig, files: CheckpointFiles | None) -> None:
    """Refuse before allocating when the parameters alone exceed the memory available: the
    count from the config (arithmetic, so absurd sizes are answered at once), then the
    checkpoint's own tensor sizes (from its headers)."""
    itemsize = cfg.params_dtype.itemsize
    if files is None:
        need, what = count_parameters(cfg) * itemsize, "config.json's model"
    else:
        need = sum(math.prod(files.shape(n)) for n in files.names()) * itemsize
        what = "the checkpoint's tensors"
    free, where = free_memory()
    if free is not None and need > free:
        raise PretrainedError(
            f"{family}: {what} need(s) {format_bytes(need)} as {cfg.params_dtype} "
            f"({cfg.num_decoder_layers} layers, d_model {cfg.d_model}, vocab {cfg.vocab_size}) "
            f"but {format_bytes(free)} is free ({where}); load the parameters in "
            "bfloat16 (param_dtype='bfloat16') or shard them over more devices"
        )


def free_memory() -> tuple[int | None, str]:
    """``(bytes, where it was read)``: the memory free on the first device (an accelerator's
    statistics, else the host's: `host_available`); ``(None, ...)`` when it does not say."""
    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return host_available()
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a backend without memory statistics
        stats = {}
    if "bytes_limit" not in stats:
        return None, f"{device.device_kind} reports no memory statistics"
    free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    return free, f"free on one {device.device_kind}"


def _abstract(cfg: ModelConfig) -> tuple[Any, Any, Any]:
    """``(graphdef, abstract params, concrete non-parameter state)`` without initialising a
    single parameter (the non-parameter state, RNG counters, is tiny).

    One trace of the model's construction gives all three: the compiled function returns
    only the non-parameter state (XLA drops the parameters' initialisers), and the
    parameters' shapes and dtypes are read from the trace. (Tracing a 30-layer model takes
    seconds, most of a load's time: it is done once.)"""
    seen: dict[str, Any] = {}

    def build() -> Any:
        graphdef, params, rest = nnx.split(DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
        seen["graphdef"] = graphdef
        seen["params"] = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        return rest

    rest = jax.jit(build)()
    return seen["graphdef"], seen["params"], rest


def load_pretrained(
    source: str | os.PathLike,
    *,
    dtype: str = "float32",
    param_dtype: str | None = None,
    shardings: Callable[[Any], Any] | None = None,
    revision: str | None = None,
    tokenizer: bool = True,
    **overrides: Any,
) -> Pretrained:
    """Load a Hugging Face causal LM (a folder or a hub id) as a `DecoderOnlyLM`.

    Args:
      source: a folder with ``config.json``, safetensors weights and tokenizer files, or a
        hub id (``"gpt2"``, ``"EleutherAI/pythia-160m"``) when ``huggingface_hub`` can fetch
        it or has it cached; or a llama.cpp GGUF file (a ``.gguf`` path, or a folder holding
        one ``.gguf`` and no ``config.json``), read by `flaxformer_lite.pretrained.gguf` and
        dequantized to float32.
      dtype: compute dtype (``"float32"``, ``"bfloat16"``); param_dtype: storage dtype of
        the parameters (default ``dtype``): ``"bfloat16"`` halves their memory.
      shardings: ``shardings(abstract params) -> a tree of jax.sharding.Sharding`` (e.g.
        ``lambda s: flaxformer_lite.train.sharding.state_shardings(s, mesh, rules)``): each
        parameter is placed directly on its devices; None keeps the default device.
      revision: a hub revision (branch, tag or commit).
      tokenizer: also load the tokenizer (``tokenizers``).
      **overrides: `ModelConfig` fields to change after the mapping (e.g.
        ``attention_impl="chunked"``, or ``positional_options`` for another RoPE scaling).

    Returns:
      `Pretrained` (model, config, tokenizer, info). Its logits equal transformers'
      (tests/pretrained/ checks every family to 1e-4 in float32).
    """
    checkpoint = open_checkpoint(source, revision=revision)
    param_dtype = dtype if param_dtype is None else param_dtype
    try:
        cfg = checkpoint.config.replace(dtype=dtype, param_dtype=param_dtype, **overrides)
    except (TypeError, ValueError) as e:
        raise PretrainedError(f"{checkpoint.family.name}: {e}") from None
    model = checkpoint.load(cfg, shardings=shardings)
    info = checkpoint.info(tokenizer=tokenizer)
    return Pretrained(model, cfg, checkpoint.tokenizer if tokenizer else None, info)


def _mapped(family: families.Family, files: CheckpointFiles, cfg: ModelConfig) -> families.Weights:
    """The family's ``(parameter path, array)`` pairs, one stored tensor read at a time (a
    safetensors tensor memory-mapped, a GGUF tensor dequantized when its pair is reached)."""
    try:
        yield from family.weights(files, cfg)
    except PretrainedError as e:
        raise PretrainedError(f"{family.name}: {e}") from None


def _fill(
    family, abstract, weights: families.Weights, dtype, shardings, files: CheckpointFiles
) -> Any:
    """The parameter state with every abstract leaf replaced by its checkpoint array, each
    checked (shape; finite as it is read: `files.non_finite` names the stored tensor
    otherwise) and placed as ``weights`` yields it, so the host holds one stored tensor at a
    time beside the placed parameters; then refuses a checkpoint with tensors that nothing
    maps, and a parameter that nothing filled."""
    flat = dict(nnx.to_flat_state(abstract))
    by_name = {".".join(str(p) for p in path): path for path in flat}
    placed = [] if shardings is None else nnx.to_flat_state(shardings(abstract))
    placements = {p: s.get_value() if isinstance(s, nnx.Variable) else s for p, s in placed}
    filled: dict[tuple, Any] = {}
    for name, array in weights:
        path = by_name.get(name)
        if path is None or path in filled:
            what = "unknown" if path is None else "the same"
            raise PretrainedError(f"{family.name}: the mapping names {what} parameter {name}")
        var, want = flat[path], tuple(flat[path].get_value().shape)
        if tuple(array.shape) != want:
            raise PretrainedError(
                f"{family.name}: parameter {name} expects shape {want}; the checkpoint gives "
                f"{tuple(array.shape)}"
            )
        host = np.asarray(array).astype(dtype, copy=False)  # reads the tensor from its file
        if not np.isfinite(host).all():  # NaN / Inf weights: every score would be NaN
            raise PretrainedError(f"{family.name}: {non_finite(files, name, host)}")
        sharding = placements.get(path)
        value = jnp.asarray(host) if sharding is None else jax.device_put(host, sharding)
        filled[path] = var.replace(value)
        del host, array  # before the next tensor is read
    unused = [n for n in files.unused() if not family.is_buffer(n)]
    if unused:
        raise PretrainedError(
            f"{family.name}: {len(unused)} stored tensor(s) map to no parameter of the "
            f"configured model, e.g. {unused[0]!r} {files.shape(unused[0])} (does config.json "
            "match the weights?)"
        )
    for path, var in flat.items():
        if path not in filled:
            name = ".".join(str(p) for p in path)
            raise PretrainedError(
                f"{family.name}: parameter {name} {tuple(var.get_value().shape)} has no tensor "
                "in the checkpoint"
            )
    return nnx.from_flat_state([(path, filled[path]) for path in flat])
