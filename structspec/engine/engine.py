"""structspec's own engine: the request pipeline (``pipeline``) over the decode loop (``EngineCore``).

The decode loop (``EngineCore``) runs on one dedicated thread; the event loop
only prepares requests (grammar compiles go to a worker thread, they can take
seconds for a large vocabulary) and waits on futures the engine thread
resolves. Cancelling the awaiting task aborts the sequence: it is dropped and
its KV cache freed at the next step boundary.

``load_draft`` swaps the draft model of a running engine: the new one loads on a worker
thread while decoding goes on, then is installed on the engine thread between two steps
(``EngineCore.install_draft``); each request is served to its end by the draft it was
admitted with, and its result names that version.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, AsyncIterator, Protocol

from structspec.chat_template import PromptFormat
from structspec.engine.core import EngineCore
from structspec.engine.default_examples import ExampleBook
from structspec.engine.pipeline import FREE_TEXT_KEY, RequestPipeline
from structspec.engine.sequence import EngineSequence
from structspec.engine.types import (DraftSwap, DraftsUnsupported, DraftUpdate, EngineError, EngineStopped,
                                     GenerationResult, Outcome, TextDelta)
from structspec.grammar import GrammarCompiler
from structspec.models.worker_thread import run_in_worker

__all__ = ["DraftLoader", "Engine", "FREE_TEXT_KEY"]

log = logging.getLogger(__name__)

class DraftLoader(Protocol):
    """Loads draft folders for this engine's target (``structspec.assembly.DraftLoader``)."""

    def version(self, path: str) -> str:
        """The version of the draft in folder ``path`` (cheap: hashes the files). Raises: DraftLoadError."""

    def load(self, path: str) -> DraftUpdate:
        """The draft in folder ``path``, loaded and checked against the target. Raises: DraftLoadError."""


class Engine(RequestPipeline):
    """Implements ``EngineAPI`` over one target model (and its proposers): the pipeline's sequences run on
    ``EngineCore``'s decode loop."""

    def __init__(self, core: EngineCore, tokenizer: Any, compiler: GrammarCompiler, max_context: int,
                 max_tokens_cap: int = 4096, examples: ExampleBook | None = None, fast_forward: bool = True,
                 draft_loader: DraftLoader | None = None, prompts: PromptFormat | None = None,
                 copy_guard: bool = True):
        super().__init__(tokenizer, compiler, max_context, max_tokens_cap, examples, fast_forward, prompts, copy_guard)
        self.core = core
        self.draft_loader = draft_loader  # None: no draft can be loaded while running
        self._draft_lock: asyncio.Lock | None = None  # one load at a time (made in the loop that loads)
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or restart, after ``stop``) the engine thread; the engine's state is kept across."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="structspec-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stopping:
            if not self.core.has_work():
                self.core.wakeup.wait(0.05)
                self.core.wakeup.clear()
                continue
            try:
                self.core.step()
            except Exception as exc:  # noqa: BLE001 - keep serving; the requests in that step end with ERROR
                log.exception("engine step failed")
                self.core.fail_running(f"internal error: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stopping = True
        self.core.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.core.fail_calls(EngineStopped("the engine stopped"))

    close = stop  # the server calls close() after draining

    @property
    def model_key(self) -> str:
        """The model statistics of requests admitted now are kept under (profile and draft version)."""
        return self.core.serving.model_key

    @property
    def draft_version(self) -> str:
        """The draft model's version serving requests admitted now ("" without one)."""
        return self.core.serving.draft_version

    # -- draft models ----------------------------------------------------------------------------
    async def load_draft(self, path: str) -> DraftSwap:
        """Serve requests admitted from now on with the draft model in folder ``path`` (on this machine); those in
        flight finish on theirs. Loading runs on a worker thread (decoding goes on); the version serving already
        is left as it is (``DraftSwap.loaded`` False).
        Raises: DraftsUnsupported (no draft model can serve here), DraftLoadError (``path``), EngineStopped."""
        if self.draft_loader is None or not getattr(self.core.speculator, "drafts_enabled", False):
            raise DraftsUnsupported("the server's speculation configuration drafts without a draft model; start it "
                                    "with one that drafts with it (all, policy) to load drafts")
        if self._draft_lock is None:
            self._draft_lock = asyncio.Lock()
        async with self._draft_lock:
            before = (self.draft_version, self.model_key)
            version = await asyncio.to_thread(self.draft_loader.version, path)
            if version == before[0]:
                return DraftSwap(version, before[1], *before, loaded=False)
            # Model work on a thread that exits afterwards (it leaves no OpenMP pool behind: see worker_thread)
            update = await asyncio.to_thread(run_in_worker, self.draft_loader.load, path)
            try:
                if self._thread is None or self._stopping:
                    raise EngineStopped("the engine is shutting down")
                await asyncio.wrap_future(self.core.call_between_steps(lambda: self.core.install_draft(update)))
            except BaseException:
                getattr(update.proposer, "close", lambda: None)()  # never installed: nothing else holds it
                raise
        return DraftSwap(update.version, update.model_key, *before, loaded=True)

    def queue_depth(self) -> int:
        return self.core.queue_depth()

    def running(self) -> int:
        return len(self.core.scheduler.running)

    # -- decoding --------------------------------------------------------------------------------
    async def _run(self, seq: EngineSequence, stream: bool) -> AsyncIterator[TextDelta | GenerationResult]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def on_event(kind: str, payload: Any) -> None:  # engine thread -> event loop
            if kind == "delta" and not stream:
                return
            loop.call_soon_threadsafe(events.put_nowait, (kind, payload))

        seq.on_event = on_event
        seq.deltas = stream  # a result alone needs no delta per step (detokenizing costs ~0.1 ms a step)
        self.core.submit(seq)
        try:
            while True:
                kind, payload = await events.get()
                if kind == "delta":
                    yield TextDelta(seq.request_id, payload)
                else:
                    break
        except BaseException:  # cancelled (client gone, deadline) or the consumer stopped iterating
            if seq.finish is None:
                self.core.abort(seq.key)
            raise
        served = seq.serving if seq.serving is not None and seq.serving.model_key else self.core.serving
        text = seq.output_text()
        if seq.finish is None:  # the engine sends "done" once the sequence has finished
            raise EngineError(f"request {seq.request_id}: its events ended before it finished")
        yield GenerationResult(
            request_id=seq.request_id, text=text, token_ids=list(seq.output), finish_reason=seq.finish,
            outcome=Outcome.NOT_CHECKED, usage=seq.usage, timings=seq.timings, error=seq.error,
            grammar_limit=seq.grammar_limit, speculation=seq.decision, model_key=served.model_key,
            draft_version=served.draft_version,
        )
