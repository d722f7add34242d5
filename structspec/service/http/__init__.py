"""The OpenAI-compatible HTTP API, in the gRPC server's process, over the same engine.

| module | what |
| --- | --- |
| ``body.py`` | the request body: strict, closed Pydantic models, and its parsing (size, nesting, UTF-8) |
| ``translate.py`` | body -> engine request (extraction or tool calls); every refusal of what structspec cannot do |
| ``render.py`` | engine result -> ``chat.completion`` / ``chat.completion.chunk`` objects, usage and its extension |
| ``status.py`` | gRPC status -> HTTP status and OpenAI's error shape (the one place) |
| ``app.py`` | the FastAPI routes: auth, metrics, request ids, disconnects, streaming |
| ``server.py`` | uvicorn in the server's event loop: bind, TLS, drain |

``structspec.service.server.StructSpecServer`` starts it on ``settings.http_port`` (-1: off).
"""
