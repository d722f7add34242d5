"""Draft models made from their target: distillation (``distill``), the gemma-3-270m draft
(``gemma_draft``) and alignment to recorded traffic (``align``)."""
