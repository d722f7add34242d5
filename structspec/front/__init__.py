"""The protocol-neutral front: what both the gRPC and the HTTP service do with a request, knowing neither.

``errors`` is the one error vocabulary (a ``Code`` and a ``FrontError``); ``failures`` maps the engine's and
the store's exceptions and results onto it; ``call`` guards one call (request id, deadline, cancellation,
metrics, error logging, tenant scopes), and ``deadlines`` says when a deadline has passed; ``auth`` holds the
bearer-token rules and ``metrics`` the Prometheus series both fronts observe; ``limits``, ``registry`` and
``requests`` build the engine's requests; ``stats`` and ``views`` read the statistics as plain values, by the
schema keys and windows ``keys`` spells. The protocol packages map a ``FrontError`` to their own status
(``service`` to a gRPC status, ``service.http`` to an HTTP status) and convert their messages to and from
the front's plain values.

This package imports neither grpc, fastapi, starlette nor protobuf, and nothing from ``structspec.service``.
It imports nothing here, so a light module (``errors``) can be imported alone: the client does.
"""
