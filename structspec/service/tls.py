"""TLS credentials from PEM files: server (optionally requiring client certificates) and channel
(the health check's). Imports only grpc: ``healthcheck`` takes its channel credentials from here."""

from __future__ import annotations

from pathlib import Path

import grpc


def _read(path: Path | str | None) -> bytes | None:
    return Path(path).read_bytes() if path is not None else None


def server_credentials(cert_file: Path | str, key_file: Path | str, client_ca_file: Path | str | None = None) -> grpc.ServerCredentials:
    """TLS with the given certificate; with ``client_ca_file``, clients must present a
    certificate signed by that CA (mutual TLS)."""
    pair = (Path(key_file).read_bytes(), Path(cert_file).read_bytes())
    ca = _read(client_ca_file)
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def channel_credentials(
    ca_file: Path | str | None = None, cert_file: Path | str | None = None, key_file: Path | str | None = None
) -> grpc.ChannelCredentials:
    """Trust ``ca_file`` (system roots when None); present ``cert_file``/``key_file`` for mutual TLS."""
    return grpc.ssl_channel_credentials(root_certificates=_read(ca_file), private_key=_read(key_file), certificate_chain=_read(cert_file))
