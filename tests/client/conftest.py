from tests.service.fixtures import certs, client, engine, served  # noqa: F401
