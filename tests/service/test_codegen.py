"""The committed generated code matches the proto (regenerated into a temp dir and compared)."""

from __future__ import annotations

from pathlib import Path

import pytest

from structspec.service import codegen


def test_generated_code_is_fresh() -> None:
    pytest.importorskip("grpc_tools")
    stale = codegen.stale_files(ignore_versions=True)
    assert not stale, f"stale generated files {stale}: run `python -m structspec.service.codegen`"


def test_generated_modules_import_each_other() -> None:
    import structspec.proto_gen
    from structspec.proto_gen.v1 import structspec_pb2, structspec_pb2_grpc

    # the generator writes the package the code imports (outside structspec.service)
    assert codegen.OUT_DIR == Path(structspec.proto_gen.__file__).resolve().parent
    assert codegen.PY_IMPORT == structspec_pb2.__name__.rpartition(".")[0] == "structspec.proto_gen.v1"
    assert structspec_pb2_grpc.structspec_dot_v1_dot_structspec__pb2 is structspec_pb2
    assert structspec_pb2.DESCRIPTOR.package == "structspec.v1"
    enums = [structspec_pb2.DESCRIPTOR.enum_types_by_name[n] for n in structspec_pb2.DESCRIPTOR.enum_types_by_name]
    assert all(e.values[0].number == 0 and e.values[0].name.endswith("_UNSPECIFIED") for e in enums)
