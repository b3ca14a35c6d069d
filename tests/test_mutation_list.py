"""``dev/mutation_check.py`` plants each mutant by replacing one exact piece of source text. When
the code it names changes, the mutant must follow it: a piece of text that no longer occurs
(or occurs twice) would stop the check, or plant the bug in the wrong place."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CHECK = Path(__file__).resolve().parent.parent / "dev" / "mutation_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MUTATION = _load()


@pytest.mark.parametrize("mutant", MUTATION.MUTANTS, ids=lambda m: m.id)
def test_each_mutant_names_text_that_occurs_once(mutant: Any) -> None:
    source = (MUTATION.PACKAGE / mutant.file).read_text()
    assert source.count(mutant.original) == 1
    assert mutant.mutated != mutant.original


def test_mutant_ids_are_unique() -> None:
    ids = [m.id for m in MUTATION.MUTANTS]
    assert len(ids) == len(set(ids))
