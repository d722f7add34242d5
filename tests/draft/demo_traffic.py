"""Demo traffic written the way a server records it: the target answers extraction prompts (greedy, batched, the
KV cache reused) and each finished request goes through a store's recorder (``record_traffic``) and its flush, as
the engine's finished sequences do; the schemas are registered in the store, so their keys are ``name@version``.

``shifted``: documents of other kinds (invoices, tickets, events, listings) sent to the contact schema, as in the
bench's ``shift`` workload: the values are not in the documents and the target fills them in its own way, which the
demo draft never saw. ``original``: the other built-in schemas with their own documents, as the pair was trained on.
Unconstrained greedy decoding (no grammar) keeps this fast; the demo target writes the JSON it was trained to."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import torch

from structspec.demo.corpus import generate
from structspec.prompts import encode_prompt, extraction_prompt
from structspec.schemas import load_builtin_schemas
from structspec.stats.book import StatsBook
from structspec.store import open_store

SHIFT_SCHEMA = "contact"
OTHERS = ("event", "invoice", "product_listing", "support_ticket")


def shifted_items(n: int, seed: int) -> list[tuple[str, str]]:
    docs = [e.source for e in generate(seed, 3 * n, toolcall_share=0.0)
            if e.task == "extract" and e.schema_name in OTHERS]
    return [(SHIFT_SCHEMA, d) for d in docs[:n]]


def original_items(n: int, seed: int) -> list[tuple[str, str]]:
    return [(e.schema_name, e.source) for e in generate(seed, 3 * n, toolcall_share=0.0)
            if e.task == "extract" and e.schema_name in OTHERS][:n]


@torch.no_grad()
def answer(models, prompts: list[list[int]], max_tokens: int, batch: int = 16) -> list[list[int]]:
    """The target's greedy continuations up to EOS (excluded) or ``max_tokens``."""
    eos, model, out = models.tokenizer.eos_token_id, models.target, []
    for lo in range(0, len(prompts), batch):
        chunk = prompts[lo: lo + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), eos, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):  # left padding: every row's next token at the last column
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
        for row in gen[:, width:].tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
    return out


def record(models, data_dir: Path, items: list[tuple[str, str]], model: str, max_tokens: int = 120) -> None:
    """Answer ``items`` (schema name, document) and record every request in the SQLite store in ``data_dir`` under
    the model key ``model``."""
    schemas = load_builtin_schemas()
    prompts = [encode_prompt(models.tokenizer, extraction_prompt(schemas[name], doc)) for name, doc in items]
    outputs = answer(models, prompts, max_tokens)

    async def write() -> None:
        store = open_store("", data_dir, StatsBook(traffic_per_hour=100_000))
        await store.open()
        keys = {}
        for name in sorted({name for name, _ in items}):
            text = json.dumps(schemas[name], sort_keys=True, separators=(",", ":"))
            rec, _ = await store.put_schema(name, text, hashlib.sha256(text.encode()).hexdigest(), "", "api", 0.0)
            keys[name] = f"{rec.schema_id}@{rec.version}"
        recorder = store.stats.recorder(model)
        for (name, _), prompt, output in zip(items, prompts, outputs):
            finish = "length" if len(output) >= max_tokens else "stop"
            assert recorder.record_traffic(keys[name], prompt, output, finish)
        await store.close()

    asyncio.run(write())
