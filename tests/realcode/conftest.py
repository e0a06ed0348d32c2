"""Real code (issue 9): Transformers models and tutorial idioms, each run on CPU and on neuron."""
import pytest

pytest.importorskip("transformers")
