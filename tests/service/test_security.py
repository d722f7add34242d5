"""Bearer tokens (auth and admin), TLS and mutual TLS."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from structspec.client import (
    NO_RETRY,
    Client,
    PermissionDeniedError,
    TLSConfig,
    UnauthenticatedError,
    UnavailableError,
)
from structspec.front.auth import AuthConfig, bearer_token
from structspec.service.auth import authorize
from structspec.service.healthcheck import check
from structspec.service.settings import Secret
from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

P = "/structspec.v1.StructSpec/"


def md(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def test_authorize_matrix() -> None:
    both = AuthConfig(frozenset({"user-tok"}), frozenset({"admin-tok"}))
    code = lambda method, token, cfg=both: (e.code.name if (e := authorize(method, md(token), cfg)) else "OK")  # noqa: E731
    assert code(P + "Extract", None) == "UNAUTHENTICATED"
    assert code(P + "Extract", "wrong") == "UNAUTHENTICATED"
    assert code(P + "Extract", "user-tok") == "OK"
    assert code(P + "Extract", "admin-tok") == "OK"
    assert code(P + "RegisterSchema", "user-tok") == "PERMISSION_DENIED"
    assert code(P + "DeleteSchema", "admin-tok") == "OK"
    assert code(P + "RegisterSchema", None) == "UNAUTHENTICATED"
    assert code("/grpc.health.v1.Health/Check", None) == "OK"
    assert code("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", None) == "OK"
    off = AuthConfig()
    assert code(P + "RegisterSchema", None, off) == "OK"
    user_only = AuthConfig(frozenset({"user-tok"}))
    assert code(P + "RegisterSchema", "user-tok", user_only) == "PERMISSION_DENIED"  # writes need an admin token
    admin_only = AuthConfig(admin_tokens=frozenset({"admin-tok"}))
    assert code(P + "Extract", None, admin_only) == "OK"
    assert code(P + "RegisterSchema", None, admin_only) == "UNAUTHENTICATED"
    assert bearer_token((("authorization", "Basic abc"),)) is None
    assert "user-tok" not in repr(both)


def test_tokens_end_to_end(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# rotated tokens\nold-token\nuser-token\n")
    settings = settings_for(tmp_path, auth_token_file=token_file, admin_token=Secret("admin-secret"))
    assert "admin-secret" not in repr(settings) and "admin-secret" not in str(settings.public_dict())
    caplog.set_level("DEBUG", logger="structspec")
    with ServerThread(settings, FakeEngine()) as st:
        with Client(st.target, retry=NO_RETRY) as anon:
            assert anon.health() == "SERVING"  # health needs no token
            with grpc.insecure_channel(st.target) as ch:  # nor reflection
                stub = reflection_pb2_grpc.ServerReflectionStub(ch)
                assert next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
            with pytest.raises(UnauthenticatedError) as err:
                anon.extract("x", schema_id="contact")
            assert err.value.reason == "UNAUTHENTICATED"
            with pytest.raises(UnauthenticatedError):
                list(anon.extract_stream("x", schema_id="contact"))
        with Client(st.target, token="user-token", retry=NO_RETRY) as user:
            assert user.extract("x", schema_id="contact")
            assert user.list_schemas()
            with pytest.raises(PermissionDeniedError):
                user.register_schema("s", {"type": "object"})
            with pytest.raises(PermissionDeniedError):
                user.delete_schema("invoice")
        with Client(st.target, token="old-token", admin_token="admin-secret", retry=NO_RETRY) as admin:
            assert admin.register_schema("s", {"type": "object"}).version == 1
            assert admin.delete_schema("s") == [1]
            assert admin.extract("x", schema_id="contact")
    text = caplog.text
    for secret in ("user-token", "old-token", "admin-secret"):
        assert secret not in text


@pytest.mark.parametrize("scope", ["per_token", "shared"])
def test_schema_history_is_scoped_per_auth_token(tmp_path: Path, scope: str) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("alice-token\nbob-token\n")
    engine = FakeEngine()
    with ServerThread(settings_for(tmp_path, auth_token_file=token_file, history_scope=scope), engine) as st:
        for token in ("alice-token", "bob-token", "alice-token"):
            with Client(st.target, token=token, retry=NO_RETRY) as c:
                c.extract("x", schema_id="contact")
                c.call_tool([("user", "hi")], [{"name": "a", "parameters": {"type": "object"}}])
    scopes = [r.history_scope for r in engine.requests]
    if scope == "shared":
        assert scopes == [""] * 6
    else:
        alice, bob = scopes[0], scopes[2]
        assert alice and bob and alice != bob and scopes == [alice, alice, bob, bob, alice, alice]
        assert all("token" not in s for s in scopes)  # a digest, never the token
    with ServerThread(settings_for(tmp_path / "open"), FakeEngine()) as st:  # no tokens: one tenant
        with Client(st.target, retry=NO_RETRY) as c:
            c.extract("x", schema_id="contact")
        assert st.engine.requests[0].history_scope == ""


def test_tls(tmp_path: Path, certs: dict[str, Path]) -> None:
    settings = settings_for(tmp_path, tls_cert_file=certs["server.crt"], tls_key_file=certs["server.key"])
    with ServerThread(settings, FakeEngine()) as st:
        with Client(st.target, tls=TLSConfig(ca_file=certs["ca.crt"]), retry=NO_RETRY) as c:
            assert c.extract("x", schema_id="contact")
        with Client(st.target, retry=NO_RETRY, timeout=3) as plain:  # plaintext against TLS fails
            with pytest.raises(UnavailableError):
                plain.extract("x", schema_id="contact")
        assert check(st.target, tls=True, ca_file=str(certs["ca.crt"])) == "SERVING"


def test_mutual_tls(tmp_path: Path, certs: dict[str, Path]) -> None:
    settings = settings_for(
        tmp_path, tls_cert_file=certs["server.crt"], tls_key_file=certs["server.key"], tls_client_ca_file=certs["ca.crt"]
    )
    with ServerThread(settings, FakeEngine()) as st:
        mtls = TLSConfig(ca_file=certs["ca.crt"], cert_file=certs["client.crt"], key_file=certs["client.key"])
        with Client(st.target, tls=mtls, retry=NO_RETRY) as c:
            assert c.extract("x", schema_id="contact")
        with Client(st.target, tls=TLSConfig(ca_file=certs["ca.crt"]), retry=NO_RETRY, timeout=3) as no_cert:
            with pytest.raises(UnavailableError):
                no_cert.extract("x", schema_id="contact")
        assert check(st.target, tls=True, ca_file=str(certs["ca.crt"]), cert_file=str(certs["client.crt"]), key_file=str(certs["client.key"])) == "SERVING"
