"""Models named by their path (``profiles.resolve_model``, ``loading.load_profile``): a GGUF file on llama.cpp with
its tokenizer read once and cached, a model folder on transformers, dummy weights, the draft's tokenizer check, and
each loading failure as one ``ModelLoadError`` line."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from structspec.assembly import AssemblyConfig, assemble_engine, engine_model_key
from structspec.bench.workloads import build_workload
from structspec.engine.api import ExtractionRequest
from structspec.engine.types import FinishReason, Outcome, SamplingParams
from structspec.models import loading
from structspec.models.loading import (ModelLoadError, check_draft, gguf_for, gguf_tokenizer, load_models,
                                       load_profile)
from structspec.models.profiles import DEMO_DIR, resolve_model, served_name_of
from tests.conftest import need_llamacpp, smollm2_gguf

DEMO_TARGET, DEMO_DRAFT = str(DEMO_DIR / "target"), str(DEMO_DIR / "draft")


def one_line(exc: pytest.ExceptionInfo, *parts: str) -> str:
    text = str(exc.value)
    assert "\n" not in text and all(p in text for p in parts), text
    return text


# -- naming a model ------------------------------------------------------------------------------------------------


def test_a_spec_is_a_profile_name_a_gguf_file_or_a_folder(tmp_path: Path) -> None:
    demo = resolve_model("demo")
    assert (demo.name, demo.target, demo.draft) == ("demo", DEMO_TARGET, DEMO_DRAFT)
    named = resolve_model("demo", served_name="mine", draft=str(tmp_path), chat_template="t.jinja")
    assert (named.name, named.draft, named.chat_template, named.target) == ("mine", str(tmp_path), "t.jinja",
                                                                             DEMO_TARGET)
    gguf_file = resolve_model(str(tmp_path / "My-Model.Q4_K_M.gguf"))
    assert (gguf_file.name, gguf_file.cpu_executor, gguf_file.gguf()) == ("My-Model.Q4_K_M", "llamacpp",
                                                                           tmp_path / "My-Model.Q4_K_M.gguf")
    folder = resolve_model(DEMO_TARGET, tokenizer=DEMO_DRAFT)
    assert (folder.name, folder.cpu_executor, folder.tokenizer_path, folder.draft) == ("target", "transformers",
                                                                                       DEMO_DRAFT, None)
    assert folder.is_ready() and not gguf_file.is_ready()
    assert [served_name_of(s) for s in ("demo", str(tmp_path / "a.gguf"), DEMO_TARGET + "/")] == ["demo", "a",
                                                                                                   "target"]
    with pytest.raises(KeyError, match="neither a profile name"):
        resolve_model("gemma")
    with pytest.raises(ModelLoadError) as exc:
        load_profile("gemma")
    one_line(exc, "unknown model 'gemma'", "demo, gemma-3-270m")


def test_each_loading_failure_is_one_line_naming_the_path_and_the_cause(tmp_path: Path) -> None:
    need_llamacpp()
    missing = tmp_path / "missing.gguf"
    with pytest.raises(ModelLoadError) as exc:
        load_profile(str(missing), executor="llamacpp")
    one_line(exc, str(missing), "does not exist")
    text_file = tmp_path / "notes.gguf"
    text_file.write_text("not a model\n")
    with pytest.raises(ModelLoadError) as exc:
        load_profile(str(text_file), executor="llamacpp")
    one_line(exc, str(text_file), "not a GGUF file")
    with pytest.raises(ModelLoadError) as exc:
        load_profile(str(tmp_path), executor="transformers")
    one_line(exc, str(tmp_path), "no config.json")
    # an architecture transformers does not know (the tokenizer given: it is loaded first)
    strange = tmp_path / "strange"
    strange.mkdir()
    (strange / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ModelLoadError) as exc:
        load_profile(str(strange), tokenizer=DEMO_TARGET, executor="transformers")
    one_line(exc, str(strange))
    # an architecture llama.cpp does not know
    odd = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(odd, "no-such-architecture")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError) as exc:
        load_profile(str(odd), tokenizer=DEMO_TARGET, executor="llamacpp")
    one_line(exc, str(odd), "llama.cpp refused it")


# -- a model folder ------------------------------------------------------------------------------------------------


def test_a_folder_runs_on_transformers_under_its_served_name(demo_models) -> None:
    models = load_profile(DEMO_TARGET, served_name="my-demo", executor="auto", device="cpu")
    assert (models.profile, models.executor, models.draft, models.chat_template) == ("my-demo", "transformers",
                                                                                     None, None)
    # statistics are kept under the served name and the weights (the shipped demo target's)
    assert engine_model_key(models) == f"my-demo@{demo_models.identity}+plain-v5"
    for mine, shipped in zip(models.target.state_dict().values(), demo_models.target.state_dict().values()):
        assert torch.equal(mine, shipped)


def test_the_chat_template_is_the_given_file_else_the_folders_own(tmp_path: Path) -> None:
    folder = tmp_path / "chat-demo"
    folder.mkdir()
    for f in Path(DEMO_TARGET).iterdir():
        (folder / f.name).symlink_to(f)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    own = load_profile(str(folder), with_draft=False)
    assert own.profile == "chat-demo" and own.chat_template.startswith("{% for m in messages %}<{{ m.role }}>")
    given = tmp_path / "given.jinja"
    given.write_text("{{ messages[0].content }}")
    assert load_profile(str(folder), chat_template=str(given), with_draft=False).chat_template == given.read_text()
    with pytest.raises(ModelLoadError) as exc:
        load_profile(str(folder), chat_template=str(tmp_path / "none.jinja"), with_draft=False)
    one_line(exc, str(tmp_path / "none.jinja"))


def test_dummy_weights_are_the_configs_model_with_seeded_random_weights(demo_models) -> None:
    profile = resolve_model(DEMO_TARGET)
    first = load_models(profile, load_format="dummy", with_draft=False, executor="auto")
    second = load_models(profile, load_format="dummy", with_draft=False)
    assert first.executor == "transformers"
    assert first.parameter_count() == demo_models.parameter_count()
    weights = [(a, b, c) for a, b, c in zip(first.target.state_dict().values(), second.target.state_dict().values(),
                                            demo_models.target.state_dict().values()) if a.numel() > 1000]
    assert weights and all(torch.equal(a, b) for a, b, _ in weights)  # the same every time
    assert not any(torch.equal(a, c) for a, _, c in weights)  # not the stored weights
    with torch.no_grad():
        logits = first.target(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape[-1] == demo_models.target.config.vocab_size and torch.isfinite(logits).all()
    with pytest.raises(ModelLoadError) as exc:
        load_models(profile, load_format="dummy", executor="llamacpp")
    one_line(exc, "dummy", "transformers")
    with pytest.raises(ModelLoadError) as exc:
        load_models(resolve_model("/models/x.gguf"), load_format="dummy")
    one_line(exc, "/models/x.gguf", "dummy")


# -- the draft's tokenizer -----------------------------------------------------------------------------------------


def draft_with_another_tokenizer(tmp_path: Path) -> Path:
    """The demo draft with its tokenizer changed: two tokens' ids swapped, one token added, EOS moved to it."""
    folder = tmp_path / "draft"
    shutil.copytree(DEMO_DRAFT, folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["!"], vocab['"'] = vocab['"'], vocab["!"]
    data["added_tokens"].append({"id": len(vocab), "content": "<|end|>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|end|>"}))
    return folder


def test_a_draft_of_another_tokenizer_is_refused_naming_what_differs(tmp_path: Path) -> None:
    check_draft(resolve_model(DEMO_TARGET, draft=DEMO_DRAFT))  # the shipped pair agrees
    other = draft_with_another_tokenizer(tmp_path)
    with pytest.raises(ModelLoadError) as exc:
        check_draft(resolve_model(DEMO_TARGET, draft=str(other)))
    one_line(exc, f"draft {other} does not share the tokenizer of target {DEMO_TARGET}", "vocab 4096 vs 4097 tokens",
             "'!': 1 vs 2", "'\"': 2 vs 1", "'<|end|>': - vs 4096", "EOS id 0 vs 4096")


# -- the restricted output layer's fallback ------------------------------------------------------------------------


def test_an_output_matrix_the_restricted_layer_cannot_score_falls_back_with_one_log_line(monkeypatch, caplog,
                                                                                        demo_llamacpp_models) -> None:
    from structspec.models import llamacpp_executor
    from structspec.models.executor import StepInput

    monkeypatch.setattr(llamacpp_executor.RestrictedHead, "for_model", staticmethod(lambda info: None))
    caplog.set_level("INFO", logger=llamacpp_executor.log.name)
    executor = llamacpp_executor.LlamaCppExecutor(demo_llamacpp_models.target)
    lines = [r.getMessage() for r in caplog.records if "restricted output layer off" in r.getMessage()]
    assert len(lines) == 1 and "architecture llama" in lines[0] and "full output layer" in lines[0]
    assert executor.restricted_logits_max == 0
    seq = executor.new_sequence()
    allowed = torch.tensor([5, 9])
    row = executor.step([StepInput(seq, [1, 2, 3], [2], allowed=[allowed])])[0][0]
    assert row.shape == (executor.vocab_size,) and torch.isfinite(row).all()  # every id scored: the general path


# -- a GGUF file: SmolLM2-135M-Instruct ----------------------------------------------------------------------------



@pytest.fixture(scope="module")
def smollm2():
    need_llamacpp()
    return load_profile(str(smollm2_gguf()), executor="auto", device="cpu")


def test_a_gguf_runs_on_llamacpp_with_its_own_tokenizer_read_once(smollm2, monkeypatch) -> None:
    assert (smollm2.profile, smollm2.executor) == ("SmolLM2-135M-Instruct.Q4_1", "llamacpp")
    tok = smollm2.tokenizer
    assert (len(tok), tok.bos_token, tok.bos_token_id, tok.eos_token, tok.eos_token_id) == (
        49152, "<|im_start|>", 1, "<|im_end|>", 2)
    assert smollm2.chat_template is not None and "<|im_start|>" in smollm2.chat_template  # the GGUF's ChatML
    gguf = smollm2_gguf()
    cached = gguf_tokenizer(gguf)

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF's tokenizer was read again")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", refuse)
    assert gguf_tokenizer(gguf) == cached and (cached / "chat_template.jinja").is_file()
    with pytest.raises(ModelLoadError) as exc:
        load_profile(str(gguf), executor="transformers")
    one_line(exc, str(gguf), "llama.cpp executor", "folder")


def test_the_smollm2_shortcut_is_the_packages_gguf_on_llamacpp() -> None:
    profile = resolve_model("smollm2")
    assert Path(profile.target) == smollm2_gguf() and profile.gguf() == smollm2_gguf()
    assert (profile.name, profile.cpu_executor, profile.is_ready()) == ("smollm2", "llamacpp", True)


def test_a_gguf_decodes_valid_json_for_a_schema(smollm2) -> None:
    engine = assemble_engine(smollm2, AssemblyConfig())
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}

    async def extract():
        engine.start()
        return await engine.extract(ExtractionRequest(schema=schema, text="Alice is 31 and lives in Paris.",
                                                      sampling=SamplingParams(max_tokens=24)))

    try:
        result = asyncio.run(extract())
    finally:
        engine.stop()
    assert result.finish_reason is FinishReason.STOP and result.outcome is Outcome.VALID
    assert set(json.loads(result.text)) == {"name", "age"}


# -- the must-show: the demo target as a folder and as its GGUF export -----------------------------------------------


def greedy_outputs(models, items) -> list[tuple[str, Outcome]]:
    engine = assemble_engine(models, AssemblyConfig())

    async def run_all():
        engine.start()
        return [await engine.extract(ExtractionRequest(schema=item.schema, text=item.source,
                                                       schema_key=item.schema_name,
                                                       sampling=SamplingParams(max_tokens=160)))
                for item in items]

    try:
        return [(r.text, r.outcome) for r in asyncio.run(run_all())]
    finally:
        engine.stop()


def test_the_demo_target_as_a_folder_and_as_its_gguf_export_gives_the_same_greedy_outputs() -> None:
    need_llamacpp()
    export = gguf_for(DEMO_TARGET)
    with pytest.raises(ModelLoadError) as exc:  # the export holds no vocabulary: the tokenizer is given
        load_profile(str(export), executor="llamacpp")
    one_line(exc, str(export), "no vocabulary", "--tokenizer")
    items = build_workload("extraction", 3)
    folder = load_profile(DEMO_TARGET, executor="auto", device="cpu")
    exported = load_profile(str(export), tokenizer=DEMO_TARGET, executor="auto", device="cpu")
    assert (folder.executor, exported.executor) == ("transformers", "llamacpp")
    outputs = greedy_outputs(folder, items)
    assert all(outcome is Outcome.VALID for _, outcome in outputs)
    assert greedy_outputs(exported, items) == outputs
