"""A ``FrontError`` on the gRPC wire: its status code, and its details in the trailing metadata.

Details travel as a serialized ``structspec.v1.ErrorDetails`` under the trailing metadata key
``front.errors.DETAILS_KEY`` (``structspec-error-details-bin``; chosen over ``google.rpc.BadRequest``
so the server needs no extra dependency; the Python client decodes it).
"""

from __future__ import annotations

import grpc

from structspec.front.errors import DETAILS_KEY, Code, FrontError
from structspec.proto_gen.v1 import structspec_pb2 as pb

# Code's members are named after the gRPC statuses they stand for
STATUS_CODES: dict[Code, grpc.StatusCode] = {code: grpc.StatusCode[code.name] for code in Code}


def details_metadata(err: FrontError, request_id: str) -> tuple[tuple[str, bytes], ...]:
    details = pb.ErrorDetails(
        reason=err.reason,
        request_id=request_id,
        field_violations=[
            pb.FieldViolation(field=v.field, description=v.description, json_pointer=v.json_pointer, keyword=v.keyword)
            for v in err.violations
        ],
    )
    return ((DETAILS_KEY, details.SerializeToString()),)


async def abort(context: grpc.aio.ServicerContext, err: FrontError, request_id: str) -> None:
    """End the call with ``err``'s status, message and details (raises ``grpc.aio.AbortError``)."""
    await context.abort(STATUS_CODES[err.code], err.message, trailing_metadata=details_metadata(err, request_id))
