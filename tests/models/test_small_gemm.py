"""Small-row matrix products: every form equals F.linear; the head keeps the form its timing picked."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
import torch.nn.functional as F

from structspec.models import small_gemm
from structspec.models.small_gemm import (FORMS, TUNE_RUNS, OutputHead, fast_linears_enabled, small_row_linears)
from structspec.models.worker_thread import run_in_worker


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(small_gemm, "_CHOICES", {})


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 13])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_computes_the_linear_product(form, rows):
    torch.manual_seed(rows)
    weight, x = torch.randn(300, 24), torch.randn(rows, 24)
    out = FORMS[form](weight, x)
    assert out.shape == (rows, 300) and out.is_contiguous()
    assert torch.allclose(out, F.linear(x, weight), atol=1e-5)


def fake_clock(costs: dict[str, float], first_run_extra: dict[str, float] | None = None):
    """A clock under which each form's timed runs cost what ``costs`` says (read at start and stop,
    TUNE_RUNS runs per form, in FORMS order); ``first_run_extra`` slows a form's first timed run."""
    ticks = itertools.count()
    now = [0.0]
    extra = first_run_extra or {}

    def clock() -> float:
        i = next(ticks)
        name = list(FORMS)[(i // (2 * TUNE_RUNS)) % len(FORMS)]
        if i % 2:
            first = (i // 2) % TUNE_RUNS == 0
            now[0] += costs[name] + (extra.get(name, 0.0) if first else 0.0)
        return now[0]

    return clock


def test_one_slow_run_does_not_lose_the_fastest_form():
    """A busy moment (another process on the CPU) slows one timed run; the minimum still picks right."""
    weight = torch.randn(64, 8)
    head = OutputHead(weight, tune=True, clock=fake_clock({"linear": 3.0, "transposed": 1.0, "chunked": 2.0},
                                                          first_run_extra={"transposed": 10.0}))
    head(torch.randn(2, 8))
    assert head.form_for(2) == "transposed"


def test_head_keeps_the_fastest_form_per_row_count():
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 8), torch.randn(64)
    head = OutputHead(weight, bias, tune=True, clock=fake_clock({"linear": 3.0, "transposed": 1.0, "chunked": 2.0}))
    x = torch.randn(3, 8)
    assert torch.allclose(head(x), F.linear(x, weight, bias), atol=1e-5)
    assert head.form_for(3) == "transposed" and head.form_for(4) is None
    # Another head over the same weight reuses the choice instead of timing again.
    again = OutputHead(weight, bias, tune=True, clock=lambda: pytest.fail("timed twice"))
    assert torch.allclose(again(x), F.linear(x, weight, bias), atol=1e-5)


def test_head_without_tuning_and_with_no_rows():
    weight = torch.randn(64, 8)
    assert not OutputHead(weight).tune  # a small output layer is not worth timing
    head = OutputHead(weight, tune=True, clock=lambda: pytest.fail("nothing to time"))
    assert head(torch.randn(0, 8)).shape == (0, 64)  # a prefill chunk that asks for no logits


def test_small_row_linears_only_inside_the_block(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
    monkeypatch.setattr(small_gemm, "SMALL_ROW_MIN_PARAMS", 0)
    x = torch.randn(2, 3, 16)
    expected = model(x)
    assert small_row_linears(model) == 2 and small_row_linears(model) == 2  # idempotent
    calls = []
    real = small_gemm.project_transposed
    small_gemm.project_transposed = lambda w, h: calls.append(h.shape[0]) or real(w, h)
    try:
        assert torch.allclose(model(x), expected, atol=1e-5) and calls == []  # outside: plain F.linear
        with fast_linears_enabled():
            assert torch.allclose(model(x), expected, atol=1e-5)
            assert calls == [6, 6]  # 2 x 3 rows, both layers
            calls.clear()
            model(torch.randn(40, 16))  # more rows than SMALL_ROWS: plain F.linear
            assert calls == []
        assert not getattr(small_gemm._ENABLED, "on", False)
    finally:
        small_gemm.project_transposed = real


def test_run_in_worker_runs_elsewhere_and_reraises():
    main = threading.get_ident()
    assert run_in_worker(lambda a, b=0: (threading.get_ident() != main, a + b), 2, b=3) == (True, 5)
    with pytest.raises(ValueError, match="boom"):
        run_in_worker(lambda: (_ for _ in ()).throw(ValueError("boom")))


def test_tiny_layers_keep_f_linear():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(512, 512))
    assert small_row_linears(model) == 1  # 4k weights: F.linear; 262k: the small-row form
    assert "forward" not in vars(model[0]) and "forward" in vars(model[1])


def test_the_chosen_form_is_kept_for_the_machine(tmp_path):
    """A later process on the same machine takes the recorded form: it computes the same logits, untimed."""
    from structspec.models.small_gemm import FormChoices

    path = tmp_path / "forms.json"
    head = OutputHead(torch.randn(48, 8), tune=True, choices=FormChoices(path),
                      clock=fake_clock({"linear": 3.0, "transposed": 2.0, "chunked": 1.0}))
    head(torch.randn(5, 8))
    assert head.form_for(5) == "chunked" and "chunked" in path.read_text()
    fresh = OutputHead(torch.randn(48, 8), tune=True, choices=FormChoices(path),  # another weight, same shape
                       clock=lambda: pytest.fail("timed although the machine has a choice"))
    fresh(torch.randn(5, 8))
    assert fresh.form_for(5) == "chunked"
    path.write_text("{not json")  # a corrupt file is a miss, never an error
    assert FormChoices(path).get(torch.randn(48, 8), 5) is None
