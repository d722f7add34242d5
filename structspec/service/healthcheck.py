"""Exit 0 when the server's health service says SERVING, else 1 (Docker HEALTHCHECK, probes).

    python -m structspec.service.healthcheck [--target HOST:PORT] [--service NAME] [--timeout S]
        [--tls] [--ca-file F] [--cert-file F --key-file F] [--server-name NAME]

Defaults come from the server's own environment, so in a container no flag is needed:
target 127.0.0.1:$STRUCTSPEC_PORT; TLS when $STRUCTSPEC_TLS_CERT_FILE is set, trusting
$STRUCTSPEC_HEALTHCHECK_CA_FILE (or the server certificate itself, right for self-signed ones);
client certificate from $STRUCTSPEC_HEALTHCHECK_CERT_FILE/$STRUCTSPEC_HEALTHCHECK_KEY_FILE.
Imports only grpc (and ``structspec.service.tls``, itself grpc only), so it is cheap to run every few seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from structspec.service.tls import channel_credentials


def check(
    target: str,
    service: str = "",
    timeout: float = 3.0,
    tls: bool = False,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    server_name: str | None = None,
) -> str:
    """The serving status name ("SERVING", "NOT_SERVING", ...) or "UNREACHABLE: <code>"."""
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    if tls:
        # '' (an empty variable) means unset, as None does
        creds = channel_credentials(ca_file or None, cert_file or None, key_file or None)
        channel = grpc.secure_channel(target, creds, options)
    else:
        channel = grpc.insecure_channel(target, options)
    with channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return f"UNREACHABLE: {exc.code().name}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def parser(env: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m structspec.service.healthcheck", description="exit 0 when the server is SERVING")
    p.add_argument("--target", default=f"127.0.0.1:{env.get('STRUCTSPEC_PORT', '50051')}", help="host:port of the gRPC server")
    p.add_argument("--service", default="", help="service name to check ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds")
    p.add_argument("--tls", action="store_true", default=bool(env.get("STRUCTSPEC_TLS_CERT_FILE")), help="connect with TLS")
    p.add_argument("--ca-file", default=env.get("STRUCTSPEC_HEALTHCHECK_CA_FILE") or env.get("STRUCTSPEC_TLS_CERT_FILE"), help="PEM CA to trust")
    p.add_argument("--cert-file", default=env.get("STRUCTSPEC_HEALTHCHECK_CERT_FILE"), help="client certificate (mutual TLS)")
    p.add_argument("--key-file", default=env.get("STRUCTSPEC_HEALTHCHECK_KEY_FILE"), help="client key (mutual TLS)")
    p.add_argument("--server-name", default=env.get("STRUCTSPEC_HEALTHCHECK_SERVER_NAME"), help="name to verify the certificate against")
    p.add_argument("--quiet", action="store_true", help="print nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    status = check(args.target, args.service, args.timeout, args.tls, args.ca_file, args.cert_file, args.key_file, args.server_name)
    if not args.quiet:
        print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
