"""A front error on the gRPC wire: its status and the details the client decodes."""

from __future__ import annotations

import grpc

from structspec.client.errors import error_from_rpc
from structspec.front.errors import Code, FieldViolation, FrontError
from structspec.service.grpc_status import STATUS_CODES, details_metadata


def test_details_roundtrip() -> None:
    err = FrontError(Code.NOT_FOUND, "missing", "SCHEMA_NOT_FOUND", [FieldViolation("schema_id", "nope")])

    class FakeRpcError(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return STATUS_CODES[err.code]

        def details(self) -> str:
            return err.message

        def trailing_metadata(self) -> object:
            return details_metadata(err, "rid")

    client_err = error_from_rpc(FakeRpcError())
    assert type(client_err).__name__ == "NotFoundError" and client_err.request_id == "rid"
    assert client_err.field_violations[0].field == "schema_id" and client_err.reason == "SCHEMA_NOT_FOUND"
