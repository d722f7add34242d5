"""The gRPC service layer: proto, servicer, server lifecycle, auth, TLS, settings, metrics.

Kept import-light (no torch, no engine) so ``python -m structspec.service.healthcheck`` is fast.
"""
